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


def bin_labels(seq_len: int) -> list[str]:
    """'0', '1', '2-3', '4-7', ... for the distances 0..seq_len - 1 (the last bin ends at seq_len - 1)."""
    count = bin_count(seq_len)
    return ["0", "1", *(f"{2 ** (b - 1)}-{min(2 ** b, seq_len) - 1}" for b in range(2, count))][:count]


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
        """Add one chunk of queries (a `WeightsChunk`) of layer `layer`.

        Every mass is a difference of the rows' cumulative sums S(x) = sum_{j <= x} P_ij (fp64, so the far bins,
        sums of small weights, stay exact): the mass at distances >= D is S(i - D), so bin b holds
        S(i - 2^(b-1)) - S(i - 2^b), the local mass is S(i) - S(i - window), the sink mass S(sink - 1), and the mean
        distance sum_{x < i} S(x)."""
        P = chunk.weights
        B, H, C, K = P.shape
        t, device = self.t, P.device
        query = torch.arange(chunk.first, chunk.first + C, device=device)  # key index of each query
        S = torch.cumsum(P, -1, dtype=torch.float64)  # [B, H, C, K]; S(x) = S(i) for x > i (those weights are 0)

        def at(offsets: list[int]) -> Tensor:
            """S(i - D) for each D in `offsets`, [B, H, C, len]; 0 where i - D < 0."""
            index = query[:, None] - torch.tensor(offsets, device=device)
            values = S.gather(-1, index.clamp(min=0).expand(B, H, C, -1))
            return values.masked_fill(index < 0, 0.0)

        bins = t["distance_mass"].shape[-1]
        edges = at([0, *(2 ** b for b in range(bins))])  # S(i), S(i - 1), S(i - 2), S(i - 4), ...
        t["distance_mass"][layer] += (edges[..., :-1] - edges[..., 1:]).sum((0, 2)).cpu()
        # sum_j P_ij (i - j) = sum_{x < i} S(x) = (sum over all K columns) - (K - i) S(i)
        total = S.sum(-1) - (K - query).to(torch.float64) * edges[..., 0]
        t["distance_sum"][layer] += total.sum((0, 2)).cpu()
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
        eligible = query >= self.sink  # queries that see more than the sink tokens
        if bool(eligible.any()):
            t["sink_sum"][layer] += S[..., self.sink - 1][..., eligible].sum((0, 2)).cpu()
            t["sink_queries"][layer] += B * int(eligible.sum())
        eligible = query >= self.window  # queries that see more than the window
        if bool(eligible.any()):
            local = edges[..., 0] - at([self.window])[..., 0]
            t["local_sum"][layer] += local[..., eligible].sum((0, 2)).cpu()
            t["local_queries"][layer] += B * int(eligible.sum())

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
