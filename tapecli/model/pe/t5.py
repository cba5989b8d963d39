"""T5 relative position bias (Raffel et al. 2020), causal: a learned table of (bucket x head) logit biases per layer.
Distances below num_buckets/2 get a bucket each; longer ones share logarithmic buckets up to max_distance.
Not one of the paper's reported baselines; included for comparison.

pe_args:
  num_buckets    32
  max_distance   128
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerPE,
    PositionalEncoding,
    PositionState,
    ScoreBias,
    ScoreMod,
    check_positive_int,
)


def relative_buckets(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Bucket of each causal distance i - j >= 0 (negative distances are masked anyway and map to bucket 0)."""
    distance = distance.clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(distance < max_exact, distance, large)


def t5_score(h: Tensor, q_pos: Tensor, k_pos: Tensor, weight: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """The bias of one (head, query, key) inside FlexAttention (`ScoreMod`): one read of the table."""
    return weight[relative_buckets(q_pos - k_pos, num_buckets, max_distance), h]


class T5BiasLayer(LayerPE):
    def __init__(self, n_heads: int, num_buckets: int, max_distance: int) -> None:
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    def need(self, state: PositionState, average_state: bool) -> ScoreBias:
        """A bias of the distance only, constant from max_distance on: attention passes it as one table of
        max_distance + 1 entries, whose gradient needs the scores of nearby keys only."""
        weight = self.relative_attention_bias.weight
        return ScoreBias(pairs=self.bias, table=self.table, parameters=(weight,),
                         score_mod=ScoreMod(t5_score, (weight, self.num_buckets, self.max_distance)))

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        buckets = relative_buckets(q_pos[..., :, None] - k_pos[..., None, :], self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).permute(0, 3, 1, 2)  # [B, H, Tq, Tk]

    def table(self, n: int) -> Tensor:
        """[H, m], m = min(n, max_distance + 1): the bias at distances 0..m-1; every longer distance shares the
        last bucket (relative_buckets clamps there)."""
        distance = torch.arange(min(n, self.max_distance + 1), device=self.relative_attention_bias.weight.device)
        return self.relative_attention_bias(relative_buckets(distance, self.num_buckets, self.max_distance)).T


class T5Bias(PositionalEncoding):
    claims = ("shift-invariance",)

    def __init__(self, config, *, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__(config)
        for key, value in (("num_buckets", num_buckets), ("max_distance", max_distance)):
            check_positive_int(key, value)
        if max_distance <= num_buckets // 2:
            raise ValueError(f"model.pe_args.max_distance: must exceed num_buckets / 2 = {num_buckets // 2} (the "
                             f"exact buckets), got {max_distance}")
        self.num_buckets, self.max_distance = num_buckets, max_distance

    def make_layer(self, layer_idx: int) -> LayerPE:
        return T5BiasLayer(self.config.n_heads, self.num_buckets, self.max_distance)
