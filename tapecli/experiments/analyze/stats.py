"""Attention statistics per layer and head, accumulated from the probed weights one chunk of queries at a time.

    stats = AttentionStats(n_layers, n_heads, seq_len, sink=1, window=16)
    stats.observe(layer, chunk)        # a `tapecli.model.attention.probe.WeightsChunk`: [B, H, C, K] weights
    sums = stats.sums()                # JSON: what one or more sequences added up (one samples.jsonl row)
    merged = merge([sums, ...]); numbers = finish(merged)       # per layer and head: the statistics below

For query i (its key index; causal: it sees keys j <= i) with weights P_ij (sum_j P_ij = 1) and distance i - j:

  distance histogram   mass sum_j P_ij in each distance bin: 0, 1, 2-3, 4-7, ..., [2^(b-1), 2^b)   (bin b)
  mean distance        sum_j P_ij (i - j)
  entropy              -sum_j P_ij ln P_ij (nats; ln(i + 1) for uniform attention over what it sees)
  entropy by length    the entropy of queries that see n = i + 1 keys, n binned 1, 2-3, 4-7, ...
  entropy slope        the least-squares slope of entropy against ln(i + 1) over every query: 1 when attention
                       spreads uniformly as the context grows, 0 when it does not grow
  sink mass            sum_{j < sink} P_ij: mass on the first `sink` tokens, over queries i >= sink
  local mass           sum_{i - window < j <= i} P_ij: mass within the last `window` tokens, over queries
                       i >= window

Each is the mean over the queries (of every sequence) it counts; its sums are kept in fp64, so sequences add up
exactly and the chunking does not change a result.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

SUMS = ("distance_mass", "distance_sum", "entropy_sum", "length_entropy", "length_queries", "queries", "x", "xx",
        "xy", "sink_sum", "sink_queries", "local_sum", "local_queries")


def log2_bin(values: Tensor) -> Tensor:
    """0 for 0, 1 for 1, 2 for 2-3, 3 for 4-7, ...: the bit length of non-negative integers (exact below 2^24)."""
    return torch.frexp(values.clamp(min=0).to(torch.float32)).exponent.long()


def bin_count(seq_len: int) -> int:
    """Distance bins for distances 0..seq_len - 1."""
    return int(log2_bin(torch.tensor(max(seq_len - 1, 0)))) + 1


def bin_labels(count: int) -> list[str]:
    """'0', '1', '2-3', '4-7', ... for `count` bins."""
    return ["0", "1", *(f"{2 ** (b - 1)}-{2 ** b - 1}" for b in range(2, count))][:count]


class AttentionStats:
    """Sums of every statistic (module docstring) per layer and head, fp64 on the CPU."""

    def __init__(self, n_layers: int, n_heads: int, seq_len: int, sink: int = 1, window: int = 16) -> None:
        self.sink, self.window = sink, window
        L, H = n_layers, n_heads
        nb, nl = bin_count(seq_len), bin_count(seq_len + 1) - 1  # lengths n = 1..seq_len: bins 1..; stored from 0
        zeros = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        self.t = {"distance_mass": zeros(L, H, nb), "distance_sum": zeros(L, H), "entropy_sum": zeros(L, H),
                  "length_entropy": zeros(L, H, nl), "length_queries": zeros(L, nl), "queries": zeros(L),
                  "x": zeros(L), "xx": zeros(L), "xy": zeros(L, H), "sink_sum": zeros(L, H), "sink_queries": zeros(L),
                  "local_sum": zeros(L, H), "local_queries": zeros(L)}

    def observe(self, layer: int, chunk: Any) -> None:
        """Add one chunk of queries (a `WeightsChunk`) of layer `layer`."""
        P = chunk.weights
        B, H, C, K = P.shape
        t, device = self.t, P.device
        query = torch.arange(chunk.first, chunk.first + C, device=device)  # key index of each query
        distance = query[:, None] - torch.arange(K, device=device)  # [C, K]; negative: a key it cannot see
        pooled = P.sum(0)  # [H, C, K]: the batch shares positions
        bins = log2_bin(distance).expand(H, C, K)
        mass = pooled.new_zeros(H, C, t["distance_mass"].shape[-1]).scatter_add_(-1, bins, pooled)
        t["distance_mass"][layer] += mass.sum(1).double().cpu()
        t["distance_sum"][layer] += (pooled * distance.clamp(min=0)).sum((1, 2)).double().cpu()
        entropy = torch.special.entr(P).sum(-1).double()  # [B, H, C]
        t["entropy_sum"][layer] += entropy.sum((0, 2)).cpu()
        t["queries"][layer] += B * C
        length_bin = (log2_bin(query + 1) - 1).cpu()  # n = i + 1 keys seen: 1 -> 0, 2-3 -> 1, ...
        t["length_entropy"][layer].index_add_(1, length_bin, entropy.sum(0).cpu())
        t["length_queries"][layer].index_add_(0, length_bin, torch.full((C,), float(B), dtype=torch.float64))
        x = torch.log(query.double() + 1)
        t["x"][layer] += B * float(x.sum())
        t["xx"][layer] += B * float((x * x).sum())
        t["xy"][layer] += (entropy * x.to(entropy.device)).sum((0, 2)).cpu()
        sees_past = query >= self.sink
        if bool(sees_past.any()):
            t["sink_sum"][layer] += P[:, :, sees_past, : self.sink].sum((0, 2, 3)).double().cpu()
            t["sink_queries"][layer] += B * int(sees_past.sum())
        sees_past = query >= self.window
        if bool(sees_past.any()):
            local = (distance >= 0) & (distance < self.window)
            t["local_sum"][layer] += (pooled * local)[:, sees_past].sum((1, 2)).double().cpu()
            t["local_queries"][layer] += B * int(sees_past.sum())

    def sums(self) -> dict[str, Any]:
        """The sums as JSON (nested lists), e.g. one sequence's samples.jsonl row."""
        return {name: self.t[name].tolist() for name in SUMS}


def merge(rows: list[dict[str, Any]]) -> dict[str, Tensor]:
    """The elementwise total of several `sums`."""
    return {name: sum(torch.tensor(row[name], dtype=torch.float64) for row in rows) for name in SUMS}


def finish(t: dict[str, Tensor]) -> dict[str, Any]:
    """The statistics (module docstring) from merged sums: per layer, values per head (None where no query counts)."""
    queries = t["queries"]
    n, x = queries[:, None], t["x"][:, None]
    slope = (n * t["xy"] - x * t["entropy_sum"]) / (n * t["xx"][:, None] - x ** 2)
    return {
        "mean_distance": plain(t["distance_sum"] / n),
        "entropy": plain(t["entropy_sum"] / n),
        "entropy_slope": plain(slope),
        "sink_mass": plain(t["sink_sum"] / t["sink_queries"][:, None]),
        "local_mass": plain(t["local_sum"] / t["local_queries"][:, None]),
        "distance_histogram": plain(t["distance_mass"] / queries[:, None, None]),
        "entropy_by_length": plain(t["length_entropy"] / t["length_queries"][:, None, :]),
        "queries": plain(queries),
    }


def plain(values: Tensor) -> Any:
    """Nested lists of floats, None for what is not finite (0 / 0: nothing counted)."""

    def clean(v: Any) -> Any:
        return [clean(u) for u in v] if isinstance(v, list) else (v if math.isfinite(v) else None)

    return clean(values.tolist())
