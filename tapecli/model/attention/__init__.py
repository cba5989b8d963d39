"""Attention for every positional encoding: one entry point that picks the fastest exact path.

    y = attend(q, k, v, need, x=x, q_pos=..., k_pos=..., key_mask=None, cache=None, causal=True)
    name = plan(need, device_type, dtype, q_len, k_len, grad, padded, causal)      # the path attend takes

q [B, H, Tq, d] (position-encoded), k, v [B, G, Tq, d] of the current tokens (G divides H); `need` is what the
layer's PE declared (`LayerPE.need`: None, `ScoreBias`, `WideValue` or `OwnAttention`, see needs.py); positions
[B|1, Tq] / [B|1, Tk] of queries and of every visible key; `key_mask` [B, Tk] False for padding (None: none);
`cache` the layer's KV cache (the current keys and values are appended to it here). Returns [B, H, Tq, dv], dv the
value width plus the need's extra width. Query i sees key j <= past + i (causal models), never a padded key except
itself.

The path is a pure function of (need, device, dtype, shapes, gradients or not, padding) (`plan`); every path is
exact (equal to the fp64 reference with the [Tq, Tk] scores materialised, in outputs and gradients), and none
keeps a [Tq, Tk] tensor per head for a long sequence:

  sdpa          plain causal attention (RoPE, NoPE, xPos, RandPE): SDPA's fused kernels (flash on CPU and CUDA)
  flash-attn    the same through flash-attn on CUDA in fp16/bf16 when it is installed
  sdpa-concat   TAPE's [V | E] in one fused call, q and k zero-padded to the value width (CPU, no padding)
  sdpa-separate TAPE's V and E in two fused calls with the same weights (pe_args.aggregation: separate)
  chunked       bias or padding on the CPU: torch's fused CPU flash kernel one chunk of queries at a time, the
                bias of a chunk a strided view of one table (chunked.py); memory O(chunk x T)
  flex          bias, padding or wide values on CUDA: FlexAttention with a score_mod and a block mask (flex.py)
  dense         a materialised [Tq, Tk] mask: decoding steps (Tq = 1), non-causal models, the reference
  probe         while `probe.probing(observer)` is active (`tape analyze attention`): the weights formed one chunk
                of queries at a time, reported to the observer, then multiplied with the values (probe.py)
  (own)         CoPE and PaTH compute attention themselves and name their own paths (their files); while probing
                they report their own weights (`OwnAttention.reports_weights`)

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
from tapecli.model.attention.needs import Need, OwnAttention, ScoreBias, WideValue
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
         causal: bool = True) -> str:
    """The path `attend` takes for these inputs (module docstring); `grad`: gradients are being recorded."""
    if isinstance(need, OwnAttention):
        return need.plan(device_type, dtype, q_len, k_len, grad, k_len > q_len)
    if probe.active():
        return "probe"
    if _forced:
        return _forced[-1]
    bias, wide = isinstance(need, ScoreBias), isinstance(need, WideValue)
    offset = k_len > q_len  # queries after cached keys (chunked prefill): the causal mask is not SDPA's own
    if not causal or q_len == 1:
        return "dense"
    if device_type == "cuda":
        if flash_attn_applies(device_type, dtype) and not (bias or wide or padded):
            return "flash-attn"  # its causal mask is aligned bottom-right, as a KV cache needs
        if flex_path.flex_available() and (padded or wide or offset or (bias and need.score_mod)):
            return "flex"
    if device_type == "cpu" and chunked_path.kernel_available() and (bias or padded or offset):
        return "chunked"
    if wide:
        return "dense" if padded or offset else f"sdpa-{need.mode}"
    return "dense" if bias or padded or offset else "sdpa"


def attend(q: Tensor, k: Tensor, v: Tensor, need: Need, *, x: Tensor, q_pos: Tensor, k_pos: Tensor,
           key_mask: Tensor | None, cache: LayerCache | None, causal: bool = True) -> Tensor:
    """Exact attention of the current tokens (module docstring); appends their keys and values to `cache`."""
    if k.shape[1] != v.shape[1]:  # the PE expanded grouped keys to one per query head (TAPE)
        v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
    if isinstance(need, WideValue):  # the values are [V | E]: attention averages E with the same weights
        v = torch.cat((v, need.values.to(v.dtype).expand(v.shape[0], -1, -1, -1)), dim=-1)
    if cache is not None:
        k, v = cache.append(k=k, v=v)
    Tq, Tk = q.shape[2], k.shape[2]
    name = plan(need, q.device.type, q.dtype, Tq, Tk, torch.is_grad_enabled(), key_mask is not None, causal)
    for names in _recorded:
        names.append(name)
    if isinstance(need, OwnAttention):
        if not need.reports_weights and probe.active():
            raise ValueError("attention probing: this PE computes its own attention and does not report its weights "
                             "(OwnAttention.reports_weights)")
        mask, is_causal = dense_mask(None, key_mask, Tq, Tk, q.dtype, q.device, causal)
        return need.attend(x, q, k, v, mask, is_causal, key_mask, cache)
    bias = need if isinstance(need, ScoreBias) else None
    scale = q.shape[-1] ** -0.5
    if name == "probe":
        return probe.probed_attention(q, k, v, bias, q_pos, k_pos, key_mask, scale, causal)
    if name == "flex":
        return flex_path.flex(q, k, v, bias, q_pos, k_pos, key_mask, scale)
    if name == "chunked":
        return widened(chunked_path.chunked_attention, q, k, v, need, bias, q_pos, k_pos, key_mask, scale)
    pairs = None if bias is None else bias.pairs(q_pos, k_pos)
    mask, is_causal = dense_mask(pairs, key_mask, Tq, Tk, q.dtype, q.device, causal)
    if name == "sdpa-separate":
        d = q.shape[-1]
        return torch.cat([sdpa(q, k, v[..., :d], mask, is_causal), sdpa(q, k, v[..., d:], mask, is_causal)], -1)
    return sdpa(q, k, v, mask, is_causal)


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
