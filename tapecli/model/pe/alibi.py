"""ALiBi (Press et al. 2022): a fixed linear penalty -m_h * (i - j) on the attention logits, one slope per head."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, ScoreBias, ScoreMod


def alibi_slopes(n_heads: int) -> list[float]:
    """2^(-8h/n) for h = 1..n when n is a power of two; otherwise the slopes of the largest power of two below n,
    followed by every other slope of twice that power (the ALiBi paper's rule; 12 heads -> 2^-1..2^-8, then
    2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5)."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two_slopes(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two_slopes(closest) + power_of_two_slopes(2 * closest)[0::2][: n_heads - closest]


def alibi_score(h: Tensor, q_pos: Tensor, k_pos: Tensor, slopes: Tensor) -> Tensor:
    """The bias of one (head, query, key) inside FlexAttention (`ScoreMod`)."""
    return -slopes[h] * (q_pos - k_pos).float()


class ALiBiLayer(LayerPE):
    """A score bias that depends on the distance only: attention passes it as one table (or a FlexAttention
    score_mod), never as a [T, T] tensor per head."""

    def __init__(self, slopes: Tensor) -> None:
        super().__init__()
        self.register_buffer("slopes", slopes, persistent=False)

    def need(self, state: PositionState, average_state: bool) -> ScoreBias:
        return ScoreBias(pairs=self.bias, table=self.table, score_mod=ScoreMod(alibi_score, (self.slopes,)))

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """[B|1, H, Tq, Tk] for positions [B|1, Tq] and [B|1, Tk]."""
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).float()  # [B, Tq, Tk]
        return -self.slopes[:, None, None] * distance[:, None]

    def table(self, n: int) -> Tensor:
        """[H, n]: the bias at distances 0..n-1."""
        return -self.slopes[:, None] * torch.arange(n, device=self.slopes.device, dtype=torch.float32)


class ALiBi(PositionalEncoding):
    claims = ("shift-invariance",)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return ALiBiLayer(torch.tensor(alibi_slopes(self.config.n_heads)))
