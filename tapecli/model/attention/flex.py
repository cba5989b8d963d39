"""FlexAttention (torch.nn.attention.flex_attention): one fused kernel for a score bias, padding, windows and wide
values.

    out = flex(q, k, v, bias, q_pos, k_pos, key_mask, scale, window=None, bias_factor=1.0)      # [B, H, Tq, dv]

The bias enters as a `score_mod` built by ONE module-level factory (`score_mod_of`) from the PE's `ScoreMod`
(`fn(h, q_pos, k_pos, *args)` on 0-d tensors, see needs.py): the closure holds only tensors (the positions of each
row, the PE's arguments, the bias factor) and the PE's module-level function, so torch.compile's guards see tensor
dtypes and shapes, never which layer or module a call comes from, and one compiled kernel serves every layer of a
model. Causality, padding, a sliding window and the offset of a chunked prefill (queries are the last Tq of Tk
keys) enter as a block mask, so fully masked blocks are skipped (a window of W keys costs T x W, not T^2); one
forward's layers share it (`block_mask` keeps the last few). Values may be wider than queries (TAPE's [V | E]: no
zero padding). Gradients reach the tensors the score_mod reads (FIRE's MLP) through FlexAttention's own backward,
which adds one score's gradient at a time with an atomic addition; a learned distance table (T5's, `ScoreBias.table`)
on consecutive positions is read detached instead (`table_score`) and gets its gradient from the band of near
distances (table_grad.py), since every far pair would add into its last entry. Under torch.compile (train.compile)
such a call runs eagerly, a graph break, since a graph cannot check that positions are consecutive.

The kernel is compiled once per process (`torch.compile`; shapes become dynamic after the first change of length)
and called with autocast off (inputs arrive in their dtype already), so what varies between calls is only the
PE's function, grad mode, dtypes and shapes: each variant is one compiled entry, up to RECOMPILE_LIMIT of them.
Past that limit dynamo would silently run flex_attention unfused, materialising every [Tq, Tk] score, which breaks
the linear-memory promise: here it raises instead (`FlexRecompileLimit`, one line naming the fix). Under an outer
torch.compile (train.compile) the call is traced into the outer graph (but a learned table's, above). CUDA is
where it trains; on the CPU torch 2.13 compiles its forward only (no backward), so the dispatcher uses it there
only when asked (tests check its forward against the fp64 reference).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tapecli.model.attention.chunked import consecutive
from tapecli.model.attention.needs import ScoreBias, ScoreMod
from tapecli.model.attention.sinks import rescale
from tapecli.model.attention.table_grad import TableGrad

RECOMPILE_LIMIT = 64  # compiled variants of flex_attention per process (dynamo's default is 8)
_MASKS: list[tuple[tuple, object]] = []  # (key, BlockMask) of the last few calls: one forward's layers share them
_KEPT_MASKS = 4


class FlexRecompileLimit(RuntimeError):
    """FlexAttention would fall back to its unfused O(T^2) implementation."""


@functools.cache
def flex_module():
    """torch's flex_attention module, or None when this torch lacks it."""
    try:
        from torch.nn.attention import flex_attention
    except Exception:  # noqa: BLE001
        return None
    return flex_attention


@functools.cache
def compiled_flex():
    return torch.compile(flex_module().flex_attention)


def flex_available() -> bool:
    return flex_module() is not None


def score_mod_of(mod: ScoreMod, q_pos: Tensor, k_pos: Tensor, factor: Tensor):
    """The score_mod of FlexAttention for a PE's `ScoreMod`: logit + factor * fn(h, q_pos, k_pos, *args), positions
    read from [B, T] tensors (padding and any positions work). Built here, and only here, so every call shares
    one code object whose closure holds the function and tensors (module docstring)."""
    fn, args = mod.fn, mod.args

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (factor * fn(h, q_pos[b, q_idx], k_pos[b, kv_idx], *args)).to(score.dtype)

    return score_mod


def mask_mod_of(past: Tensor, key_mask: Tensor | None, window: Tensor | None, q_pos: Tensor | None,
                k_pos: Tensor | None):
    """Which keys a query sees (`tapecli.model.attention.dense.visible`'s rule): causal (queries are the last Tq
    keys, `past` before them), not padding except itself, and within `window` positions (q_pos - k_pos < window)
    when one is set. `past` and `window` are 0-d tensors, like everything the closures hold: the block mask carries
    its mask_mod into the compiled kernel, whose guards would otherwise see each chunk's offset as a new constant."""
    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + past

    def padded(b, h, q_idx, kv_idx):
        return causal(b, h, q_idx, kv_idx) & (key_mask[b, kv_idx] | (kv_idx == q_idx + past))

    base = causal if key_mask is None else padded
    if window is None:
        return base
    if q_pos is None:  # consecutive positions: the window is one of indices
        def windowed(b, h, q_idx, kv_idx):
            return base(b, h, q_idx, kv_idx) & (q_idx + past - kv_idx < window)
    else:
        def windowed(b, h, q_idx, kv_idx):
            return base(b, h, q_idx, kv_idx) & (q_pos[b, q_idx] - k_pos[b, kv_idx] < window)
    return windowed


def signature(t: Tensor | None) -> tuple | None:
    """What identifies a tensor's contents while it is alive (views of one buffer included)."""
    return None if t is None else (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t._version)


def block_mask(batch: int, q_len: int, k_len: int, key_mask: Tensor | None, device: torch.device,
               window: int | None = None, q_pos: Tensor | None = None, k_pos: Tensor | None = None):
    """The block mask of `mask_mod_of`; `q_pos`/`k_pos` ([B|1, T]) only for a window over positions that are not
    consecutive indices (padding). The layers of one forward ask for the same mask: the last few are kept, with
    the tensors they were built from (so no other tensor can take their memory and their signature)."""
    per_row = key_mask is not None or q_pos is not None
    key = (batch if per_row else None, q_len, k_len, str(device), window, *map(signature, (key_mask, q_pos, k_pos)))
    compiling = torch.compiler.is_compiling()
    if not compiling:
        for kept, (mask, _) in _MASKS:
            if kept == key:
                return mask
    if q_pos is not None:
        q_pos, k_pos = q_pos.expand(batch, q_len).contiguous(), k_pos.expand(batch, k_len).contiguous()
    as_tensor = functools.partial(torch.tensor, dtype=torch.long, device=device)
    mask_mod = mask_mod_of(as_tensor(k_len - q_len), key_mask, None if window is None else as_tensor(window), q_pos,
                           k_pos)
    mask = flex_module().create_block_mask(mask_mod, batch if per_row else None, None, q_len, k_len, device=device)
    if not compiling:
        _MASKS.insert(0, (key, (mask, (key_mask, q_pos, k_pos))))
        del _MASKS[_KEPT_MASKS:]
    return mask


def flex(q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias | None, q_pos: Tensor, k_pos: Tensor,
         key_mask: Tensor | None, scale: float, window: int | None = None, bias_factor: float = 1.0,
         sinks: Tensor | None = None) -> Tensor:
    """Exact causal attention through FlexAttention (module docstring); `bias_factor` multiplies the bias (an
    attention temperature's 1 / T); `sinks` [H]: attention sinks, through the log-sum-exp FlexAttention returns
    with its gradient (tapecli.model.attention.sinks)."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    values = learned_table(bias, bias_factor, Tk) if key_mask is None else None
    if values is not None and torch.compiler.is_compiling():
        # A graph cannot check the positions (`consecutive`): this call runs eagerly, where it can (a graph break).
        return _flex_outside_the_graph(q, k, v, bias, q_pos, k_pos, key_mask, scale, window, bias_factor, sinks)
    # Consecutive positions (no padding): a window is one of indices, and a learned table gets its band gradient.
    in_steps = key_mask is None and (window is not None or values is not None) and consecutive(q_pos, k_pos)
    values = values if in_steps else None
    windowed = window is not None and not in_steps
    mask = block_mask(B, Tq, Tk, key_mask, q.device, window, q_pos if windowed else None,
                      k_pos if windowed else None)
    score_mod = None
    if bias is not None:
        mod, factor = (ScoreMod(table_score, (values.detach(),)), 1.0) if values is not None else \
            (bias.score_mod, bias_factor)
        score_mod = score_mod_of(mod, q_pos.expand(B, Tq).contiguous(), k_pos.expand(B, Tk).contiguous(),
                                 torch.tensor(factor, dtype=torch.float32, device=q.device))
    kwargs = dict(score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=k.shape[1] != H,
                  **kernel_options(bias, q.device))
    if sinks is not None or values is not None:
        kwargs["return_aux"] = flex_module().AuxRequest(lse=True)
    if torch.compiler.is_compiling():
        return finish(flex_module().flex_attention(q, k, v, **kwargs), sinks, values, q, k, v, scale, window)
    with torch.autocast(q.device.type, enabled=False), \
            torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        try:
            return finish(compiled_flex()(q, k, v, **kwargs), sinks, values, q, k, v, scale, window)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            raise FlexRecompileLimit(
                f"FlexAttention: torch.compile reached {RECOMPILE_LIMIT} compiled variants of flex_attention in this "
                "process (PEs x grad mode x dtypes x shapes); refusing its unfused fallback, which keeps every "
                "[T, T] score; run fewer kinds of models per process") from None


def kernel_options(bias: ScoreBias | None, device: torch.device) -> dict:
    """{"kernel_options": ...} for a score_mod that asks for its own tiles (`ScoreMod.kernel_options`), on CUDA
    (Triton's tiles; the CPU's kernels have their own); else {}."""
    options = bias.score_mod.kernel_options if bias is not None else None
    return {"kernel_options": dict(options)} if options and device.type == "cuda" else {}


def learned_table(bias: ScoreBias | None, factor: float, k_len: int) -> Tensor | None:
    """The bias's distance table [H, m] (times `factor`) when it needs a gradient here (T5's), else None."""
    if bias is None or bias.table is None or not torch.is_grad_enabled():
        return None
    values = bias.times(factor).table(k_len)
    return values if values.requires_grad else None


def table_score(h: Tensor, q_pos: Tensor, k_pos: Tensor, values: Tensor) -> Tensor:
    """The bias of a distance table [H, m] (its last entry for every longer distance): the score_mod of a learned
    table, read detached (its gradient comes from `TableGrad`)."""
    return values[h, (q_pos - k_pos).clamp(0, values.shape[-1] - 1)]


def finish(result, sinks: Tensor | None, values: Tensor | None, q: Tensor, k: Tensor, v: Tensor, scale: float,
           window: int | None) -> Tensor:
    """The output of a flex_attention call: with `sinks`, its (output, aux) rescaled by the sinks (sinks.py); with
    a learned table `values`, passed through `TableGrad`, which gives the table its gradient."""
    if sinks is None and values is None:
        return result
    out, aux = result
    lse = aux.lse
    if sinks is not None:
        out, lse = rescale(out, lse, sinks)
    return out if values is None else TableGrad.apply(out, lse, q, k, v, values, sinks, scale, window)


# torch.compiler.disable, with torch._dynamo imported at the first compiled call instead of here (as chunked.py does).
_flex_outside_the_graph = getattr(torch, "_disable_dynamo", torch.compiler.disable)(flex)
