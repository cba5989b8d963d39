"""xPos (Sun et al. 2023): RoPE plus an exponential decay. Queries are scaled by zeta_i^((t - c)/S) and keys by
zeta_i^(-(t - c)/S), so each pair's logit gains a factor zeta_i^((i - j)/S) with zeta_i = (2i + 0.4d) / (1.4d).
The centre c only balances magnitudes (it cancels in q.k); it is fixed at model.max_seq_len / 2 so cached keys
and later queries agree.

pe_args (plus every RoPE argument):
  scale_base   S (2048)
"""

from __future__ import annotations

import torch
from torch import Tensor

from tapecli.model.pe.base import LayerPE, PositionState, apply_rotary, check_range
from tapecli.model.pe.rope import RoPE


class XPosLayer(LayerPE):
    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        rotary, scale = state.rotary.to(q.dtype), state.scale.to(q.dtype)
        return apply_rotary(q, rotary) * scale, apply_rotary(k, rotary) / scale


class XPos(RoPE):
    rotary_layouts = False  # its layers use the full-width, one-copy rotary state

    def __init__(self, config, *, scale_base: float = 2048.0, **rope_args) -> None:
        super().__init__(config, **rope_args)
        check_range("scale_base", scale_base, 0)
        half = config.head_dim // 2
        zeta = (torch.arange(0, half, dtype=torch.float32) * 2 + 0.4 * config.head_dim) / (1.4 * config.head_dim)
        self.zeta = zeta  # plain fp32 tensor, like RoPE's frequencies
        self.scale_base = scale_base

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        rotary = self.rotary(positions, dtype)
        exponent = (positions.to(rotary.dtype) - self.config.max_seq_len // 2) / self.scale_base  # [B, T]
        scale = self.zeta.to(rotary) ** exponent[..., None]  # [B, T, d/2]
        scale = torch.cat((scale, scale), dim=-1).unsqueeze(1)  # both members of a pair share zeta_i
        return PositionState(positions=positions, rotary=rotary, scale=scale)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return XPosLayer()
