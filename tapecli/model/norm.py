"""RMSNorm, and the per-head query/key norm some models apply before the PE (`model.qk_norm`).

    norm = RMSNorm(dim, eps, offset=False)   # x / rms(x) * weight (offset: * (1 + weight)), in fp32 (fp64 stays)
    norm = LayerNorm(dim, eps)               # (x - mean) / std * weight, no bias (Cohere), in fp32
    norm = block_norm(config, dim)           # the one model.block.norm / norm_weight ask for
    q_norm, k_norm = head_norms(config)      # with model.qk_norm: per head or over the projection, else nn.Identity

`model.qk_norm` is Qwen3's "QK-norm" (Qwen3Attention's `q_norm` / `k_norm`): each head's query and key are
RMS-normalised over the head dimension, with one learned weight [head_dim] shared by all heads, right after the
projections and before the PE rotates them. With `model.block.qk_norm: projection` (tapecli.model.block) it is OLMo
2's instead: the whole query (and key) projection, all heads at once, is RMS-normalised over n_heads * head_dim
with a weight of that size. Without it the norms are nn.Identity: no parameters, so the names and shapes of every
existing model's weights stay what they were.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Llama's RMSNorm; with `offset` Gemma's, whose stored weight w multiplies as (1 + w), in fp32 before the cast
    back (`model.block.norm_weight: 1+w`, tapecli.model.block)."""

    def __init__(self, dim: int, eps: float, offset: bool = False) -> None:
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps = eps

    def reset_parameters(self) -> None:
        """The neutral weight: 1, or 0 with an offset."""
        nn.init.constant_(self.weight, 0.0 if self.offset else 1.0)

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 like Llama (fp64 stays fp64), then return to the input dtype.
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.offset:  # as Gemma: (x * (1 + w)) in fp32, then the input dtype
            return (h * (1.0 + self.weight.to(h.dtype))).to(x.dtype)
        return self.weight * h.to(x.dtype)


class LayerNorm(RMSNorm):
    """LayerNorm without a bias, as Cohere's: the mean subtracted, then RMSNorm's scaling (`model.block.norm:
    layernorm`, tapecli.model.block); normalised and weighted in fp32, then the input dtype."""

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h - h.mean(-1, keepdim=True)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = 1.0 + self.weight.to(h.dtype) if self.offset else self.weight.to(h.dtype)
        return (weight * h).to(x.dtype)


def block_norm(config, dim: int) -> RMSNorm:
    """The norm of `dim` features `model.block` asks for: RMSNorm or LayerNorm, weight w or (1 + w)."""
    from tapecli.model.block import BlockLayout

    layout = BlockLayout.of(config.block)
    return (LayerNorm if layout.norm == "layernorm" else RMSNorm)(dim, config.norm_eps, layout.norm_weight == "1+w")


class HeadNorm(RMSNorm):
    """RMSNorm over each head's vector that returns its input's dtype: under autocast a bf16 query stays bf16 (its
    fp32 weight would otherwise promote it, and queries, keys and values would disagree); in fp32 it is RMSNorm."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x).to(x.dtype)


class ProjectionNorm(HeadNorm):
    """RMSNorm over all heads of a projection at once: takes [..., heads, head_dim], normalises over heads * head_dim
    (its weight has that size), returns the input's shape and dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.flatten(-2)).view_as(x)


def head_norms(config) -> tuple[nn.Module, nn.Module]:
    """(q_norm, k_norm) of one attention layer with `config.qk_norm`: HeadNorms over head_dim, or ProjectionNorms
    over the whole projections (`model.block.qk_norm: projection`); identities without it."""
    from tapecli.model.block import BlockLayout

    if not config.qk_norm:
        return nn.Identity(), nn.Identity()
    layout = BlockLayout.of(config.block)
    offset = layout.norm_weight == "1+w"
    if layout.qk_norm == "projection":
        return (ProjectionNorm(config.n_heads * config.head_dim, config.norm_eps, offset),
                ProjectionNorm(config.n_kv_heads * config.head_dim, config.norm_eps, offset))
    return HeadNorm(config.head_dim, config.norm_eps, offset), HeadNorm(config.head_dim, config.norm_eps, offset)
