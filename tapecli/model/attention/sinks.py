"""Learned attention sinks (`model.sinks`, or a schedule kind's `sinks`): one learned logit per head that joins every
query's softmax denominator, and nothing else.

    logits = sink_logits(spec, n_heads)       # nn.Parameter [H] (self_attn.sinks) or None
    y = attend(q, k, v, need, ..., sinks=logits)

Query i of head h attends over its visible keys j plus one sink with logit s_h and a zero value:

    y_i = sum_j exp(l_ij) v_j / (exp(s_h) + sum_j exp(l_ij))       l_ij = q_i . k_j * scale + bias_ij

so a head may put weight "nowhere" (its weights sum to less than 1). This is GPT-OSS's form (OpenAI, "gpt-oss-120b &
gpt-oss-20b Model Card", 2025; transformers' `GptOssAttention.sinks`: the sink column is appended to the scaled
logits, the softmax taken over both, the column dropped). The sink logit is used as it is: neither the scale, a
temperature nor a PE's bias touches it. Parameters are named `self_attn.sinks` as in GPT-OSS and start at
N(0, init_std) as there; a model without sinks (false, the default) has no such parameter.

Every attention path stays exact through the log-sum-exp L_i = log sum_j exp(l_ij) a flash kernel keeps per row.
With L'_i = logaddexp(L_i, s_h) (the sink's log-sum-exp), y_i = o_i exp(L_i - L'_i), o the attention without the
sink (`rescale`). The backward of a flash kernel given (y, L') instead of (o, L) is the sink attention's own: its
weights exp(l_ij - L'_i) are the sink's, its rowsum(dy * y) the sink's D_i; the sink's logit gets
ds_h = -sum_i exp(s_h - L'_i) rowsum(dy_i * y_i) (`sink_grad`: the gradient of the sink's column of the scores).

  chunked  (CPU) each chunk's output and log-sum-exp rescaled in the forward; the backward is fed (y, L') (chunked.py)
  flex     (CUDA) FlexAttention returns L with its gradient (`AuxRequest(lse=True)`), y = o exp(L - L') by autograd
  dense    (decoding steps, non-causal models, the reference) and `probe`: the sink column written out
           (`explicit_attention`)
  sdpa, flash-attn, sdpa-concat, sdpa-separate: their public calls return no log-sum-exp, so a layer with sinks
           takes chunked (CPU) or flex (CUDA) instead; forcing one of them is refused in one line (`check_path`).

PEs that compute attention themselves (`OwnAttention`: CoPE, PaTH, FoX, ...) do not take sinks: the model refuses
them when it is built (`PositionalEncoding.attention_options`), like a window on a PE that has none.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

NO_LSE_PATHS = ("sdpa", "flash-attn", "sdpa-concat", "sdpa-separate")  # public calls without a log-sum-exp


def check_sinks(value: object, key: str = "model.sinks") -> bool:
    """`value` as a bool, or one line naming `key`."""
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false (a learned sink logit per head), got {value!r}")
    return value


def sink_logits(spec, n_heads: int) -> nn.Parameter | None:
    """The layer's sink logits [n_heads] when its LayerSpec has sinks (initialised by the model), else None."""
    return nn.Parameter(torch.zeros(n_heads)) if spec.sinks else None


def check_path(name: str) -> None:
    """One line for a forced path that cannot add a sink exactly (module docstring)."""
    if name in NO_LSE_PATHS:
        raise ValueError(f"attention path {name}: returns no log-sum-exp, which attention sinks (model.sinks) need "
                         "to stay exact; use chunked (CPU), flex (CUDA) or dense")


def rescale(out: Tensor, lse: Tensor, sinks: Tensor) -> tuple[Tensor, Tensor]:
    """(y, L') of attention output `out` [B, H, T, dv] with log-sum-exp `lse` [B, H, T] and sink logits [H]."""
    joined = torch.logaddexp(lse, sinks.to(lse.dtype)[:, None])
    return out * (lse - joined).exp()[..., None].to(out.dtype), joined


def sink_grad(grad_out: Tensor, out: Tensor, lse: Tensor, sinks: Tensor) -> Tensor:
    """d loss / d sinks [H] from a chunk's dy, y [B, H, C, dv] and sink log-sum-exp L' [B, H, C] (module docstring)."""
    compute = torch.promote_types(out.dtype, torch.float32)
    d = (grad_out.to(compute) * out.to(compute)).sum(-1)
    weight = (sinks.to(compute)[:, None] - lse.to(compute)).exp()
    return -(weight * d).sum((0, 2))


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float,
                       sinks: Tensor) -> Tensor:
    """softmax over [q k^T * scale + mask | s_h] without the sink's column, times v: every score materialised.
    q [B, H, Tq, d], k, v [B, G, Tk, .] (G divides H); `mask` bool (True: visible) or float (added), None with
    `is_causal` for a plain causal mask. Computed in fp32 at least; returns v's dtype."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    compute = torch.promote_types(q.dtype, torch.float32)
    if k.shape[1] != H:
        k, v = (t.repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
    scores = (q.to(compute) * scale) @ k.to(compute).transpose(-1, -2)
    if is_causal:
        mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(compute)
    column = sinks.to(compute)[None, :, None, None].expand(B, H, Tq, 1)
    weights = torch.cat((scores, column), -1).softmax(-1)[..., :-1]
    return (weights @ v.to(compute)).to(v.dtype)
