"""Attention for every positional encoding: one entry point that picks the fastest exact path.

    y = attend(q, k, v, need, x=x, q_pos=..., k_pos=..., key_mask=None, cache=None, causal=True, window=None,
               temperature=1.0, sinks=None)
    name = plan(need, device_type, dtype, q_len, k_len, grad, padded, causal, windowed, sinks)  # the path attend takes

q [B, H, Tq, d] (position-encoded), k [B, G, Tq, d], v [B, G, Tq, dv] of the current tokens (G divides H; dv may
differ from d: TAPE's values are wider, PoPE's queries and keys are); `need` is what the
layer's PE declared (`LayerPE.need`: None, `ScoreBias`, `WideValue` or `OwnAttention`, see needs.py); positions
[B|1, Tq] / [B|1, Tk] of queries and of every token the cache holds (or the current ones); `key_mask` [B, Tk] False
for padding (None: none); `cache` the layer's KV cache (the current keys and values are appended to it here; a
windowed layer's cache keeps only the last keys, and attention reads the positions of those). Returns
[B, H, Tq, dv], dv the value width plus the need's extra width. Query i sees key j <= past + i (causal models),
never a padded key except itself, and with a `window` W only keys less than W positions back (itself and the W - 1
keys before it). `temperature` T divides the logits, positional terms included: softmax((q.k / sqrt(d) + bias) /
T), as MapFormer's code computes softmax(logits / temperature). `sinks` [H] (a layer's learned sink logits, sinks.py)
join each query's softmax denominator with a zero value.

The path is a pure function of (need, device, dtype, shapes, gradients or not, padding, window) (`plan`); every
path is exact (equal to the fp64 reference with the [Tq, Tk] scores materialised, in outputs and gradients), none
keeps a [Tq, Tk] tensor per head for a long sequence, and with a window of W keys the chunked and FlexAttention
paths visit only the keys inside it (time and memory T x W):

  sdpa          plain causal attention (RoPE, NoPE, xPos, RandPE): SDPA's fused kernels (flash on CPU and CUDA)
  flash-attn    the same through flash-attn on CUDA in fp16/bf16 when it is installed
  sdpa-concat   TAPE's [V | E] in one fused call, q and k zero-padded to the value width (CPU, no padding)
  sdpa-separate TAPE's V and E in two fused calls with the same weights (pe_args.aggregation: separate)
  chunked       bias, padding or a window on the CPU: torch's fused CPU flash kernel one chunk of queries at a
                time over the keys it can see, the bias of a chunk a strided view of one table (chunked.py);
                memory O(chunk x T), or O(chunk x W) with a window
  flex          bias, padding, a window or wide values on CUDA: FlexAttention with a score_mod and a block mask
                (flex.py)
  dense         a materialised [Tq, Tk] mask: decoding steps (Tq = 1), non-causal models, the reference
  probe         while `probe.probing(observer)` is active (`tape analyze attention`): the weights formed one chunk
                of queries at a time (a window's band: keys outside it weigh 0), reported to the observer, then
                multiplied with the values (probe.py)
  (own)         CoPE and PaTH compute attention themselves and name their own paths (their files); they get the
                window as part of their mask and the temperature as an option (`OwnAttention`); while probing
                they report their own weights (`OwnAttention.reports_weights`)

With sinks a layer takes chunked (CPU) or flex (CUDA) where it would take sdpa, flash-attn or sdpa-concat /
sdpa-separate, whose public calls return no log-sum-exp (sinks.py); forcing one of those is refused in one line.

`forced(name)` makes every layer take one path (tests, the fp64 reference of `tape doctor`); `recording()`
collects the names of the paths taken, for `tape doctor` and `tape bench`; `probe.probing(observer)` hands every
layer's attention weights to `observer`, chunk by chunk (probe.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from tapecli.model.attention import chunked as chunked_path
from tapecli.model.attention import flex as flex_path
from tapecli.model.attention import probe
from tapecli.model.attention.dense import dense_mask, flash_attn_applies, sdpa
from tapecli.model.attention.needs import Need, OwnAttention, ScoreBias, WideValue, from_outside
from tapecli.model.attention.sinks import check_path, explicit_attention
from tapecli.model.cache import LayerCache

PATHS = ("sdpa", "flash-attn", "sdpa-concat", "sdpa-separate", "chunked", "flex", "dense")
_forced: list[str] = []
_recorded: list[list[str]] = []


@contextlib.contextmanager
def forced(name: str) -> Iterator[None]:
    """Every attention inside takes path `name` (one of PATHS) where it applies (OwnAttention PEs: "dense" makes
    them take their unchunked reference path)."""
    if name not in PATHS:
        raise ValueError(f"attention path {name!r}; allowed: {', '.join(PATHS)}")
    _forced.append(name)
    try:
        yield
    finally:
        _forced.pop()


def forced_path() -> str | None:
    return _forced[-1] if _forced else None


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """Collects the name of every path attention takes inside (one per layer call)."""
    names: list[str] = []
    _recorded.append(names)
    try:
        yield names
    finally:
        _recorded.remove(names)


def plan(need: Need, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, padded: bool,
         causal: bool = True, windowed: bool = False, sinks: bool = False) -> str:
    """The path `attend` takes for these inputs (module docstring); `grad`: gradients are being recorded;
    `windowed`: a window hides some keys of this call; `sinks`: the layer has attention sinks."""
    if isinstance(need, OwnAttention):
        return need.plan(device_type, dtype, q_len, k_len, grad, k_len > q_len)
    if probe.active():
        return "probe"
    if _forced:
        if sinks:
            check_path(_forced[-1])
        return _forced[-1]
    bias, wide = isinstance(need, ScoreBias), isinstance(need, WideValue)
    offset = k_len > q_len  # queries after cached keys (chunked prefill): the causal mask is not SDPA's own
    masked = padded or offset or windowed  # SDPA's fused kernels would need a materialised mask
    if not causal or q_len == 1:
        return "dense"
    if sinks:  # the paths that return a log-sum-exp (sinks.py)
        if device_type == "cuda" and flex_path.flex_available() and not (bias and need.score_mod is None):
            return "flex"
        return "chunked" if device_type == "cpu" and chunked_path.kernel_available() else "dense"
    if device_type == "cuda":
        if flash_attn_applies(device_type, dtype) and not (bias or wide or masked):
            return "flash-attn"  # its causal mask is aligned bottom-right, as a KV cache needs
        if flex_path.flex_available() and (masked or wide or (bias and need.score_mod)):
            return "flex"
    if device_type == "cpu" and chunked_path.kernel_available() and (bias or masked):
        return "chunked"
    if wide:
        return "dense" if masked else f"sdpa-{need.mode}"
    return "dense" if bias or masked else "sdpa"


def attend(q: Tensor, k: Tensor, v: Tensor, need: Need, *, x: Tensor, q_pos: Tensor, k_pos: Tensor,
           key_mask: Tensor | None, cache: LayerCache | None, causal: bool = True, window: int | None = None,
           temperature: float = 1.0, sinks: Tensor | None = None) -> Tensor:
    """Exact attention of the current tokens (module docstring); appends their keys and values to `cache`."""
    if k.shape[1] != v.shape[1]:  # the PE expanded grouped keys to one per query head (TAPE)
        v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
    if isinstance(need, WideValue):  # the values are [V | E]: attention averages E with the same weights
        v = torch.cat((v, need.values.to(v.dtype).expand(v.shape[0], -1, -1, -1)), dim=-1)
    if cache is not None:
        k, v = cache.append(k=k, v=v)  # the keys it holds are the last k.shape[2] tokens (all, unless windowed)
        k_pos = k_pos[..., k_pos.shape[-1] - k.shape[2]:]
        key_mask = None if key_mask is None else key_mask[:, key_mask.shape[-1] - k.shape[2]:]
    Tq, Tk = q.shape[2], k.shape[2]
    if window is not None and window >= Tk:
        window = None  # no key of this call is that far back (positions step by at most one per key)
    name = plan(need, q.device.type, q.dtype, Tq, Tk, torch.is_grad_enabled(), key_mask is not None, causal,
                window is not None, sinks is not None)
    for names in _recorded:
        names.append(name)
    if isinstance(need, OwnAttention):
        if sinks is not None:  # the model refuses this when it is built (attention_options); a guard for callers
            raise ValueError("attention sinks: this PE computes its own attention and takes no sinks")
        if not need.reports_weights and probe.active():
            raise probe.NotReported("attention probing: this PE computes its own attention and does not report its "
                                    "weights (OwnAttention.reports_weights)")
        mask, is_causal = dense_mask(None, key_mask, Tq, Tk, q.dtype, q.device, causal, window, q_pos, k_pos)
        options = {"temperature": temperature} if temperature != 1.0 else {}
        options |= {"window": window} if window is not None else {}
        return need.attend(x, q, k, v, mask, is_causal, key_mask, cache, **options)
    if v.shape[-1] < q.shape[-1] and Tq > 1:
        # Queries and keys wider than the values (PoPE): zero value columns, as the kernels want equal widths (a
        # decoding step computes its one row of weights directly, without copying the cached values padded).
        dv = v.shape[-1]
        v = torch.nn.functional.pad(v, (0, q.shape[-1] - dv))
        return _attend_path(name, q, k, v, need, q_pos, k_pos, key_mask, causal, window, temperature,
                            sinks)[..., :dv]
    return _attend_path(name, q, k, v, need, q_pos, k_pos, key_mask, causal, window, temperature, sinks)


def _attend_path(name: str, q: Tensor, k: Tensor, v: Tensor, need: Need, q_pos: Tensor, k_pos: Tensor,
                 key_mask: Tensor | None, causal: bool, window: int | None, temperature: float,
                 sinks: Tensor | None) -> Tensor:
    """Attention through path `name` (not an OwnAttention's), the cache already appended to."""
    Tq, Tk = q.shape[2], k.shape[2]
    bias = need if isinstance(need, ScoreBias) else None
    if bias is not None and from_outside(bias.pairs):  # a plugin's: its results checked, naming it (needs.py)
        bias = bias.checked(q.shape[1])
    scale = q.shape[-1] ** -0.5 / temperature
    if name == "flex":
        return flex_path.flex(q, k, v, bias, q_pos, k_pos, key_mask, scale, window, 1 / temperature, sinks)
    bias = None if bias is None else bias.times(1 / temperature)
    if name == "probe":
        return probe.probed_attention(q, k, v, bias, q_pos, k_pos, key_mask, scale, causal, window, sinks)
    if name == "chunked":
        return widened(chunked_path.chunked_attention, q, k, v, need, bias, q_pos, k_pos, key_mask, scale, window,
                       sinks)
    pairs = None if bias is None else bias.pairs(q_pos, k_pos)
    mask, is_causal = dense_mask(pairs, key_mask, Tq, Tk, q.dtype, q.device, causal, window, q_pos, k_pos)
    if sinks is not None:  # dense (the planner sends nothing else here with sinks)
        return explicit_attention(q, k, v, mask, is_causal, scale, sinks)
    if name == "sdpa-separate":
        d = q.shape[-1]
        return torch.cat([sdpa(q, k, v[..., :d], mask, is_causal, scale),
                          sdpa(q, k, v[..., d:], mask, is_causal, scale)], -1)
    return sdpa(q, k, v, mask, is_causal, scale)


def widened(fn, q: Tensor, k: Tensor, v: Tensor, need: Need, *args) -> Tensor:
    """Run an equal-width kernel on values wider than the queries: zero-padded q and k (concat) or one call per
    value slice of the query width (separate); both give every slice the same attention weights."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv == d:
        return fn(q, k, v, *args)
    if isinstance(need, WideValue) and need.mode == "separate" and dv % d == 0:
        return torch.cat([fn(q, k, v[..., i:i + d], *args) for i in range(0, dv, d)], -1)
    pad = (0, dv - d)
    # Zero columns leave q.k unchanged, but the kernel scales by 1/sqrt(width): keep the scale of the real width.
    return fn(torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad), v, *args)


__all__ = ["PATHS", "Need", "OwnAttention", "ScoreBias", "WideValue", "attend", "forced", "forced_path", "plan",
           "recording"]
