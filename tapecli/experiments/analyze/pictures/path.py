"""PaTH's picture: how far the accumulated Householder-like maps move a key as the distance grows.

Query i reads key j through the product of the maps of the tokens after it, x = H_i ... H_{j+1} k_j, with
H_t = I - beta_t w_t w_t^T (`tapecli.model.pe.path`). For `SOURCES` keys j spread over the first half of the sequence,
each key is carried through H_{j+1}, H_{j+2}, ... to the end, and at every distance i - j the picture records, per
key head (averaged over the sources and sequences in each distance bin):

  displacement   |x - k_j| / |k_j|: 0 leaves the key as it is (as RoPE-free attention would read it), 2 turns it
                 around; sqrt(2) is what an unrelated direction of the same length gives
  norm ratio     |x| / |k_j|: each map with beta in (0, 2) shrinks the part of x along w_t (beta = 2 reflects it)

The keys and maps are recomputed from the layer's own input with the layer's own projections (`PaTHLayer.householder`),
as its attention computes them.
"""

from __future__ import annotations

from typing import Any

import torch

from tapecli.experiments.analyze.pictures.base import Picture
from tapecli.experiments.analyze.stats import log2_bin

SOURCES = 8


class PaTHPicture(Picture):
    pe = "path"
    title = "PaTH: how far the accumulated maps move a key"
    x_kind = "distance"
    x_label = "distance i - j"
    curves = {"displacement": "|H...H k - k| / |k|", "norm_ratio": "|H...H k| / |k|"}

    @classmethod
    def head_count(cls, model: Any) -> int:
        return model.config.n_kv_heads

    def attach(self, model: Any) -> list[Any]:
        return [block.self_attn.register_forward_pre_hook(
            lambda module, args, layer=k: self.add(layer, module, args[0], args[1]))
            for k, block in enumerate(model.model.layers)]

    def add(self, layer: int, attn: Any, x: Any, pe: Any) -> None:
        """Carry the source keys of one layer's input x [B, T, dim] through every later map."""
        B, T, _ = x.shape
        G, d = attn.n_kv_heads, attn.head_dim
        keys = attn.k_proj(x).view(B, T, G, d).double()
        u, beta = pe.householder(x, None, None)  # [B, G, T, d], [B, G, T]
        u, beta = u.double(), beta.double()
        w = u * torch.rsqrt(u.pow(2).sum(-1, keepdim=True) + 1e-6)
        sources = torch.unique(torch.linspace(0, max(T // 2 - 1, 0), SOURCES).long())  # [S]
        start = keys[:, sources]  # [B, S, G, d]
        carried, norm = start.clone(), start.norm(dim=-1)
        displacement = torch.zeros(T, B, len(sources), G, dtype=torch.float64)
        ratio = torch.ones_like(displacement)
        for i in range(1, T):
            wi = w[:, :, i][:, None]  # [B, 1, G, d]
            moved = carried - beta[:, None, :, i, None] * (carried * wi).sum(-1, keepdim=True) * wi
            active = (sources < i)[None, :, None, None]
            carried = torch.where(active, moved, carried)
            displacement[i] = (carried - start).norm(dim=-1) / norm
            ratio[i] = carried.norm(dim=-1) / norm
        distance = torch.arange(T)[:, None] - sources[None, :]  # [T, S]
        seen = distance > 0
        bins = log2_bin(distance[seen]).repeat(B)
        for name, values in (("displacement", displacement), ("norm_ratio", ratio)):
            picked = values.permute(3, 1, 0, 2)[:, :, seen]  # [G, B, pairs]
            self.binned.add(name, layer, bins, picked.reshape(G, -1))
