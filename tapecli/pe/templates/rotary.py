"""Rotary: a positional encoding that rotates queries and keys by their positions (RoPE, written from scratch), so
q_i . k_j depends on i - j. Written by `tape pe new --kind rotary`: edit it into your PE, then
`tape pe check FILE.py:CLASS` after every change.

The contract of every hook is in docs/pe-api.md; this file uses only `tapecli.pe`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tapecli.pe import LayerPE, PositionalEncoding, PositionState, apply_rotary


class RotaryLayer(LayerPE):
    """One decoder layer's part: no parameters, the rotation comes with the state."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        # q [B, H, T, d], k [B, G, T, d]; the KV cache keeps the rotated keys, so they must depend on their own
        # position only. state.rotary [B|1, 1, T, d] holds cos (first half) and sin (second half) per pair.
        rotary = state.rotary.to(q.dtype)
        return apply_rotary(q, rotary), apply_rotary(k, rotary)


class Rotary(PositionalEncoding):
    """The model-level part. `theta` is a model.pe_args key (keyword-only, with a default)."""

    claims = ("shift-invariance", "rotation-equivariance")  # `tape pe check` verifies both

    def __init__(self, config, *, theta: float = 10000.0) -> None:
        super().__init__(config)
        if theta <= 1:
            raise ValueError(f"model.pe_args.theta: must be > 1, got {theta}")
        half = config.head_dim // 2
        # A plain tensor, not a buffer: model.to(torch.bfloat16) must not round the frequencies.
        self.inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) / half)

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        """Once per forward: cos/sin of every position's angles, [B|1, 1, T, d], fp32 (fp64 in fp64 models)."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        angles = positions[..., None].to(compute) * self.inv_freq.to(positions.device, compute)
        rotary = torch.cat((angles.cos(), angles.sin()), dim=-1).unsqueeze(1)
        return PositionState(positions=positions, rotary=rotary)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return RotaryLayer()
