"""LongLoRA's shifted sparse attention (S²-Attn, Chen et al. 2023), used while training only.

The T tokens of a sequence are cut into groups of G = fraction * T tokens (LongLoRA: T/4) and each token attends
causally within its own group. The second half of the heads uses groups shifted by G/2, so information flows
between neighbouring groups: their groups are [0, G/2), [G/2, 3G/2), ..., [T - G/2, T), the first and last of half
size, as in LongLoRA's variable-length flash-attention implementation (no wrap-around from the end to the start).
Evaluation (model.eval(), or a KV cache) uses the ordinary full attention.

    enable_s2_attn(model, fraction=0.25)   # switches every block's attention of a RoPE model

Each group is one causal attention call on a reshaped view, so no T x T mask is ever built; `s2_mask` builds that
mask directly, for the test that the two agree.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.attention.dense import sdpa as attend
from tapecli.model.transformer import Attention


def s2_mask(T: int, group: int, n_heads: int) -> Tensor:
    """[H, T, T] boolean mask (True = may attend) of S²-Attn, built directly from its definition."""
    t = torch.arange(T)
    causal = t[:, None] >= t[None, :]
    plain = t // group
    shifted = (t + group // 2) // group
    masks = [(plain[:, None] == plain[None, :]) & causal, (shifted[:, None] == shifted[None, :]) & causal]
    half = n_heads // 2
    return torch.stack([masks[0]] * (n_heads - half) + [masks[1]] * half)


def _grouped(q: Tensor, k: Tensor, v: Tensor, group: int) -> Tensor:
    """Causal attention within consecutive groups of `group` tokens of [B, H, T, d] tensors (T % group == 0)."""
    B, H, T, d = q.shape

    def split(x: Tensor) -> Tensor:
        return x.reshape(B, H, T // group, group, x.shape[-1]).transpose(1, 2).reshape(B * T // group, H, group,
                                                                                        x.shape[-1])

    out = attend(split(q), split(k), split(v), None, True)
    return out.reshape(B, T // group, H, group, d).transpose(1, 2).reshape(B, H, T, d)


def s2_attention(q: Tensor, k: Tensor, v: Tensor, group: int) -> Tensor:
    """S²-Attn of [B, H, T, d] queries, keys and values (keys/values already one per query head)."""
    T, half_group, H = q.shape[2], group // 2, q.shape[1]
    first = H - H // 2
    out_plain = _grouped(q[:, :first], k[:, :first], v[:, :first], group)
    qs, ks, vs = q[:, first:], k[:, first:], v[:, first:]
    pieces = [attend(qs[:, :, :half_group], ks[:, :, :half_group], vs[:, :, :half_group], None, True)]
    if T > group:
        inner = slice(half_group, T - half_group)
        pieces.append(_grouped(qs[:, :, inner], ks[:, :, inner], vs[:, :, inner], group))
    tail = slice(T - half_group, T)
    pieces.append(attend(qs[:, :, tail], ks[:, :, tail], vs[:, :, tail], None, True))
    return torch.cat((out_plain, torch.cat(pieces, dim=2)), dim=1)


class ShiftedSparseAttention(Attention):
    """Attention whose training forward (no cache) is S²-Attn; anything else is the ordinary attention."""

    fraction: float = 0.25

    def forward(self, x: Tensor, pe, state, k_pos: Tensor, key_mask: Tensor | None, cache,
                aggregation: str | None) -> tuple[Tensor, Tensor | None]:
        B, T, _ = x.shape
        group = int(T * self.fraction)
        if (not self.training or cache is not None or key_mask is not None or aggregation is not None
                or group < 2):
            return super().forward(x, pe, state, k_pos, key_mask, cache, aggregation)
        if T % group or group % 2:
            raise ValueError(f"S²-Attn: {T} tokens cannot be cut into groups of {group} (an even divisor)")
        q, k, v = self.project(x)
        q, k = pe.rotate(q, k, state)
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        if v.shape[1] != q.shape[1]:
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        y = s2_attention(q, k, v, group).transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), None


def enable_s2_attn(model: nn.Module, fraction: float = 0.25) -> None:
    """Switch every Attention of `model` to S²-Attn in place (same parameters, same names, LoRA layers kept)."""
    if model.config.pe not in ("rope", "nope"):
        raise ValueError(f"S²-Attn (longlora) needs a RoPE model, not pe {model.config.pe!r}")
    kept = {"qk_norm", "qkv_bias"}  # the projections (Attention.project) are the same in S²-Attn
    if set(model.config.attention_keys()) - kept:
        raise ValueError(f"S²-Attn (longlora) replaces attention whole: it keeps no "
                         f"{', '.join(sorted(set(model.config.attention_keys()) - kept))} (a plain RoPE model "
                         "only)")
    for module in model.modules():
        if type(module) is Attention:
            module.__class__ = ShiftedSparseAttention  # a subclass adding no state: only forward changes
            module.fraction = fraction
