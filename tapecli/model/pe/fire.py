"""FIRE (Li et al. 2024): a learned per-layer bias b_h(i, j) = f_h( psi(i - j) / (psi(max(i, L)) + eps) ) with
psi(z) = log(|c z| + 1) and f a small MLP (1 -> hidden -> heads). c and L are learned (init 0.1 and threshold).

pe_args:
  hidden      width of f (32)
  init_c      initial c (0.1)
  threshold   initial L (512); L = |l * threshold| with l learned, init 1
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import LayerPE, PositionalEncoding

EPS = 1e-6


class FIRELayer(LayerPE):
    def __init__(self, n_heads: int, hidden: int, init_c: float, threshold: float) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(init_c))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.threshold = threshold

    def psi(self, z: Tensor) -> Tensor:
        return torch.log(torch.abs(self.c * z) + 1)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = self.c.dtype  # fp32, or fp64 in an fp64 model
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).to(dtype)  # [B, Tq, Tk]
        threshold = torch.abs(self.threshold_scale * self.threshold)
        normaliser = self.psi(torch.maximum(q_pos.to(dtype), threshold))[..., :, None] + EPS
        features = (self.psi(distance) / normaliser).unsqueeze(-1)  # [B, Tq, Tk, 1]
        return self.mlp(features).permute(0, 3, 1, 2)  # [B, H, Tq, Tk]

    def init_weights(self) -> None:
        for linear in (self.mlp[0], self.mlp[2]):
            nn.init.zeros_(linear.bias)


class FIRE(PositionalEncoding):
    def __init__(self, config, *, hidden: int = 32, init_c: float = 0.1, threshold: float = 512.0) -> None:
        super().__init__(config)
        self.hidden, self.init_c, self.threshold = hidden, init_c, threshold

    def make_layer(self, layer_idx: int) -> LayerPE:
        return FIRELayer(self.config.n_heads, self.hidden, self.init_c, self.threshold)
