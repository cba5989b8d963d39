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

from tapecli.model.pe.base import LayerPE, PositionalEncoding


def relative_buckets(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Bucket of each causal distance i - j >= 0 (negative distances are masked anyway and map to bucket 0)."""
    distance = distance.clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(distance < max_exact, distance, large)


class T5BiasLayer(LayerPE):
    def __init__(self, n_heads: int, num_buckets: int, max_distance: int) -> None:
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        buckets = relative_buckets(q_pos[..., :, None] - k_pos[..., None, :], self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).permute(0, 3, 1, 2)  # [B, H, Tq, Tk]


class T5Bias(PositionalEncoding):
    def __init__(self, config, *, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__(config)
        self.num_buckets, self.max_distance = num_buckets, max_distance

    def make_layer(self, layer_idx: int) -> LayerPE:
        return T5BiasLayer(self.config.n_heads, self.num_buckets, self.max_distance)
