"""CoPE's picture: the contextual position p_ij each head counts, against the absolute distance i - j.

CoPE replaces the distance i - j by p_ij = sum_{t=j..i} sigmoid(q_i . k_t / sqrt(d)) (clamped at npos_max;
`tapecli.model.pe.cope`), which its attention reports as the extra "positions" while probed. Per layer and head,
the mean p_ij over every visible pair (i, j) with i - j in each distance bin; the reference is the mean of
i - j + 1 over the same pairs, the value p_ij takes when every gate is 1 (CoPE counting every token). A curve below
it: the head counts only some tokens (p grows more slowly than the distance); flat: positions saturate.
"""

from __future__ import annotations

from typing import Any

import torch

from tapecli.experiments.analyze.pictures.base import Picture
from tapecli.experiments.analyze.stats import log2_bin


class CoPEPicture(Picture):
    pe = "cope"
    title = "CoPE: contextual position vs distance"
    x_kind = "distance"
    x_label = "distance i - j"
    curves = {"position": "mean contextual position p_ij", "absolute": "i - j + 1 (every gate 1)"}
    references = {"position": "absolute"}

    def observe(self, layer: int, chunk: Any) -> None:
        positions = chunk.extras["positions"]  # [B, H, C, K], key order; 0 for keys a query does not see
        B, H, C, K = positions.shape
        query = torch.arange(chunk.first, chunk.first + C, device=positions.device)
        distance = query[:, None] - torch.arange(K, device=positions.device)  # [C, K]; < 0: not seen (bin 0, adds 0)
        bins = log2_bin(distance)
        count = self.binned.counts["position"].shape[-1]
        sums = positions.new_zeros(B, H, C, count).scatter_add_(-1, bins.expand(B, H, C, K), positions).sum((0, 2))
        seen = bins[distance >= 0]
        pairs = torch.bincount(seen, minlength=count).double() * B
        self.binned.add_totals("position", layer, sums, pairs)
        absolute = torch.bincount(seen, weights=(distance[distance >= 0] + 1).double(), minlength=count) * B
        self.binned.add_totals("absolute", layer, absolute.expand(H, -1), pairs)
