"""LinearBias: a positional encoding that adds a learned bias to the attention logits, -slope_h * (i - j) for query
position i and key position j (ALiBi's form, with the slopes learned). Written by `tape pe new`: edit it into your
PE, then `tape pe check FILE.py:CLASS` after every change.

The contract of every hook is in docs/pe-api.md; this file uses only `tapecli.pe`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.pe import LayerPE, PositionalEncoding, PositionState, ScoreBias, ScoreMod


def linear_bias_score(h: Tensor, q_pos: Tensor, k_pos: Tensor, slopes: Tensor) -> Tensor:
    """One (head, query, key) on 0-d tensors, for FlexAttention on CUDA. A module-level function (one compiled
    kernel serves every layer); what it reads comes as arguments, each tensor read once, indexed by the head."""
    return -slopes[h] * (q_pos - k_pos).to(slopes.dtype)


class LinearBiasLayer(LayerPE):
    """One decoder layer's part. Its parameters are named model.layers.{i}.pe.* (here: .slopes)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.slopes = nn.Parameter(torch.empty(n_heads))
        self.init_weights()

    def init_weights(self) -> None:
        # Runs after the model's generic initialisation: ALiBi's slopes 2^(-8h/H), h = 1..H.
        with torch.no_grad():
            self.slopes.copy_(torch.tensor([2 ** (-8 * (h + 1) / len(self.slopes)) for h in range(len(self.slopes))]))

    def need(self, state: PositionState, average_state: bool) -> ScoreBias:
        # Attention adds the bias on whatever path it takes (fused CPU kernels, FlexAttention, a dense mask).
        return ScoreBias(pairs=self.pairs, table=self.table, score_mod=ScoreMod(linear_bias_score, (self.slopes,)),
                         parameters=(self.slopes,))

    def pairs(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The bias for any positions, [B|1, H, Tq, Tk] from q_pos [B|1, Tq] and k_pos [B|1, Tk] (the reference)."""
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).to(self.slopes.dtype)
        return -self.slopes[:, None, None] * distance[:, None]

    def table(self, n: int) -> Tensor:
        """The same bias as a function of the distance 0..n-1 only, [H, n] (lets the CPU path skip [T, T])."""
        return -self.slopes[:, None] * torch.arange(n, device=self.slopes.device, dtype=self.slopes.dtype)


class LinearBias(PositionalEncoding):
    """The model-level part, built from the model's config. Keyword-only arguments of __init__ are its
    model.pe_args, each with a default: e.g. `def __init__(self, config, *, scale: float = 1.0)`, then
    `model.pe_args.scale=2` in a recipe or an override."""

    claims = ("shift-invariance",)  # a function of i - j only: `tape pe check` verifies it

    def make_layer(self, layer_idx: int) -> LayerPE:
        return LinearBiasLayer(self.config.n_heads)
