"""FlexAttention (torch.nn.attention.flex_attention): one fused kernel for a score bias, padding and wide values.

    out = flex(q, k, v, bias, q_pos, k_pos, key_mask, scale)      # [B, H, Tq, dv]

The bias enters as a `score_mod` built from `ScoreBias.score_mod(h, q_pos, k_pos)` on 0-d tensors (the positions of
the pair are read from [B, T] position tensors, so padding and any positions work); causality, padding and the
offset of a chunked prefill (queries are the last Tq of Tk keys) enter as a block mask, so fully masked blocks are
skipped. Values may be wider than queries (TAPE's [V | E]: no zero padding). Gradients reach the tensors the
score_mod reads (T5's table, FIRE's MLP) through FlexAttention's own backward. The kernel is compiled once per
process (`torch.compile`); CUDA is where it trains. On the CPU torch 2.13 compiles its forward only (no backward),
so the dispatcher uses it there only when asked (tests check its forward against the fp64 reference).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tapecli.model.attention.needs import ScoreBias


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


def block_mask(batch: int, q_len: int, k_len: int, key_mask: Tensor | None, device: torch.device):
    """Causal (queries are the last q_len of k_len tokens), minus padded keys except each query itself."""
    past = k_len - q_len
    if key_mask is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + past

        return flex_module().create_block_mask(mask_mod, None, None, q_len, k_len, device=device)

    def padded_mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + past) & (key_mask[b, kv_idx] | (kv_idx == q_idx + past))

    return flex_module().create_block_mask(padded_mask_mod, batch, None, q_len, k_len, device=device)


def flex(q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias | None, q_pos: Tensor, k_pos: Tensor,
         key_mask: Tensor | None, scale: float) -> Tensor:
    """Exact causal attention through FlexAttention (module docstring)."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    score_mod = None
    if bias is not None:
        q_pos, k_pos, fn = q_pos.expand(B, Tq).contiguous(), k_pos.expand(B, Tk).contiguous(), bias.score_mod

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + fn(h, q_pos[b, q_idx], k_pos[b, kv_idx]).to(score.dtype)

    mask = block_mask(B, Tq, Tk, key_mask, q.device)
    return compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale, enable_gqa=k.shape[1] != H)
