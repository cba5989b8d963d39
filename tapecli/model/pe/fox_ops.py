"""Forgetting Attention's computation (the math of `tapecli.model.pe.fox`): softmax attention plus the decay bias
c_i - c_j, c the cumulative sum of the log forget gates, on each device's fastest exact path.

    out = forgetting_attention(path, q, k, v, decay, log_gates, key_mask, scale)     # [B, H, Tq, d]

q [B, H, Tq, d] are the last Tq of Tk = past + Tq tokens; k, v [B, G, Tk, d] (G divides H); decay c [B, H, Tk]
(float64: see below), log_gates [B, H, Tq] (fla's kernel takes those instead); `key_mask` [B, Tk] False for
padding. Query i sees key j <= past + i that is not padding (a padded query still sees itself).

The paths (`path`, chosen by `FoXLayer.plan`):

  fox-flash    CPU: flash kernels on widened heads (below): without a past or padding SDPA's fused causal kernel,
               else the chunked CPU flash kernel (tapecli/model/attention/chunked.py), one chunk of queries at a
               time with its causal / padding mask
  fox-flex     CUDA: FlexAttention, the bias a score_mod reading c (fp32) and padding / offset a block mask
  fla          CUDA, half precision, no past, no padding, flash-linear-attention installed: fla's fused
               `parallel_forgetting_attn`
  fox-dense    one query (a decoding step), attention.forced("dense") (the reference): every logit materialised
  fox-probe    while attention is probed: the widened heads through `plain_attention`, which forms and reports
               the weights a chunk of queries at a time

Widened heads. Softmax over j is unchanged by a constant per row, so c_i can be dropped and the bias is -c_j, a
function of the key alone, which is one more head dimension:

  q'_i = [q_i, 1],   k'_j = [k_j, -c_j / scale],   v'_j = [v_j, 0]
  scale q'_i . k'_j = scale q_i . k_j - c_j

so any exact causal attention kernel computes FoX, gradients included (the extra key column carries dc). The
bias is per query head, so grouped keys are expanded to one per query head there. No row depends on a later
token (c_j sums the gates up to j only), so FoX stays causal bit for bit. c is summed in float64 and rounded
once, to the attention's dtype (fp32 at least, even under bf16 autocast): each logit then carries an error of
about 2^-24 |c_j|, as in the official kernel, whose fp32 cumulative sums are rounded alike (after 16K tokens of
gates near 1/2, |c| reaches about 1e4: about 1e-3 on a logit; trained gates sit near 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tapecli.model.pe.base import flex_attention as flex_kernel
from tapecli.model.pe.base import optional_kernel, plain_attention


def fla_forgetting_attention():
    """fla's fused kernel, or None when flash-linear-attention is not installed (or broken)."""
    return optional_kernel("fla.ops.forgetting_attn.parallel", "parallel_forgetting_attn")


def dense(q: Tensor, k: Tensor, v: Tensor, decay: Tensor, key_mask: Tensor | None, scale: float) -> Tensor:
    """softmax_j(scale q_i . k_j + c_i - c_j) v_j with every logit materialised, in q's dtype."""
    H, G, Tq, Tk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
    c = decay.to(q.dtype)
    logits = (q @ k.transpose(-1, -2)) * scale + c[..., Tk - Tq:, None] - c[..., None, :]
    rows, keys = torch.arange(Tk - Tq, Tk, device=q.device)[:, None], torch.arange(Tk, device=q.device)
    seen = keys <= rows
    if key_mask is not None:
        seen = seen & (key_mask[:, None, None, :] | (keys == rows))
    return logits.masked_fill(~seen, float("-inf")).softmax(-1) @ v


def widened(q: Tensor, k: Tensor, v: Tensor, decay: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """q', k', v' [B, H, T, d + 1] (module docstring)."""
    H, G = q.shape[1], k.shape[1]
    if G != H:
        k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
    column = (-decay / scale).to(k.dtype)
    return (torch.cat((q, q.new_ones(*q.shape[:-1], 1)), -1), torch.cat((k, column[..., None]), -1),
            F.pad(v, (0, 1)))


def flex_attention(q: Tensor, k: Tensor, v: Tensor, decay: Tensor, key_mask: Tensor | None, scale: float) -> Tensor:
    """FlexAttention with the decay bias as a score_mod (fp32) and causality / padding / the past as a block mask."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    c = decay.float()
    c_q = c[..., Tk - Tq:]

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + (c_q[b, h, q_idx] - c[b, h, kv_idx]).to(score.dtype)

    return flex_kernel(q, k, v, score_mod, key_mask, scale)


def forgetting_attention(path: str, q: Tensor, k: Tensor, v: Tensor, decay: Tensor, log_gates: Tensor,
                         key_mask: Tensor | None, scale: float) -> Tensor:
    """Exact Forgetting Attention on `path` (module docstring); differentiable in q, k, v and decay / log_gates."""
    d = q.shape[-1]
    if path == "fla":
        out = fla_forgetting_attention()(q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2),
                                         g=log_gates.transpose(1, 2).contiguous(), scale=scale)
        return out.transpose(1, 2)
    if path == "fox-flex":
        return flex_attention(q, k, v, decay, key_mask, scale)
    if path == "fox-dense":
        return dense(q, k, v, decay, key_mask, scale)
    return plain_attention(*widened(q, k, v, decay, scale), key_mask, scale)[..., :d]
