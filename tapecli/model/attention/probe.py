"""Probing: the exact attention weights of every layer, handed out one chunk of queries at a time.

    with probing(observer):          # observer(chunk: WeightsChunk) -> None, called for every chunk of queries
        model(input_ids)             # no gradients; the layers report one after another (a layer's chunks in any order)

While probing is active, attention still returns what it returns otherwise (equal outputs, every path), but the
weights it averages the values with are formed and reported, chunk by chunk (the chunks of one layer in any order),
so memory stays linear in T:

- plain attention, a `ScoreBias` and `WideValue` (RoPE, NoPE, ALiBi, T5, FIRE, TAPE, ...) take the `probe` path
  (`probed_attention`): the fused kernels never form the weights, so for each chunk of queries this path forms
  softmax(q k^T / sqrt(d) + bias) over the keys they see, with the chunked CPU path's masks (`chunked.ChunkMasks`:
  the bias, causality and padding, `dense.visible` deciding which keys a query sees), from the very q, k, v, bias,
  positions and scale every path is given, reports them, and multiplies them with the values. Chunks hold
  `recompute.rows_for` queries (a few MiB of weights each). Causal models only.
- an `OwnAttention` PE (CoPE, PaTH) computes its own weights; it reports them itself, from inside the chunked path
  it takes, with `report(weights, first, **extras)` just before multiplying them with the values, and says that it
  does by `OwnAttention.reports_weights` (needs.py). Probing a PE that does not report is an error (`NotReported`).
- a sliding-window layer (`model.window`, a schedule's local layers, Mistral's) reports its band: the keys outside
  its window hold 0, exactly as its attention weighs them.

A `WeightsChunk` holds `weights` [B, H, C, K] (fp32 at least; row r is the query whose own key index is
`first + r`; columns are keys 0..K-1, those a query cannot see hold 0) and `extras`: PE-specific [B, H, C, K]
quantities of the same pairs (CoPE: "positions", its contextual position p_ij). Which layer a chunk belongs to is
the observer's business (e.g. a forward pre-hook per block): attention does not know its layer.

Only forwards without gradients are probed (a recomputing backward would report chunks twice).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tapecli.model.attention.chunked import ChunkMasks, consecutive
from tapecli.model.attention.needs import ScoreBias
from tapecli.model.attention.recompute import rows_for


class NotReported(ValueError):
    """Probing reached a layer whose PE computes its own attention and does not report its weights."""


@dataclass(frozen=True)
class WeightsChunk:
    """The attention weights of one chunk of queries (module docstring)."""

    weights: Tensor  # [B, H, C, K]
    first: int  # the key index of the chunk's first query (its position when nothing is padded)
    extras: dict[str, Tensor] = field(default_factory=dict)


Observer = Callable[[WeightsChunk], None]
_observers: list[Observer] = []


@contextlib.contextmanager
def probing(observer: Observer) -> Iterator[None]:
    """Every attention inside reports its weights to `observer` (module docstring)."""
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


def active() -> bool:
    """Whether attention is being probed: the dispatcher takes the probe path, OwnAttention PEs report."""
    if _observers and torch.is_grad_enabled():
        raise RuntimeError("attention probing runs without gradients (wrap the forward in torch.inference_mode())")
    return bool(_observers)


def report(weights: Tensor, first: int, **extras: Tensor) -> None:
    """Hand one chunk's weights [B, H, C, K] (and PE-specific extras of that shape) to every observer."""
    chunk = WeightsChunk(weights, first, extras)
    for observer in _observers:
        observer(chunk)


def probed_attention(q: Tensor, k: Tensor, v: Tensor, bias: ScoreBias | None, q_pos: Tensor, k_pos: Tensor,
                     key_mask: Tensor | None, scale: float, causal: bool, window: int | None = None,
                     sinks: Tensor | None = None) -> Tensor:
    """softmax(q k^T scale + bias) v, one chunk of queries at a time, reporting each chunk's weights; with a
    `window` W a query sees only keys less than W positions back (a sliding-window layer: its weights are a band,
    the keys outside it reported as 0); with `sinks` [H] each row's softmax also counts the head's sink logit (its
    weights sum to less than 1, the sink's share is not reported).

    q [B, H, Tq, d] are the last Tq of Tk keys; k, v [B, G, Tk, d | dv] (G divides H); positions [B|1, Tq] and
    [B|1, Tk]; `key_mask` [B, Tk] False for padding. Returns [B, H, Tq, dv] in v's dtype; computed in fp32 at
    least. Each chunk's bias and mask come from the chunked path's `ChunkMasks` (a strided view of one table for a
    distance-only bias on consecutive positions, else built from `ScoreBias.pairs` and `dense.visible`), whose rows
    run backwards; the weights are reported with the queries in order."""
    if not causal:
        raise ValueError("attention probing: causal models only")
    B, H, Tq, d = q.shape
    G, Tk, dv = k.shape[1], k.shape[2], v.shape[-1]
    past = Tk - Tq
    compute = torch.promote_types(q.dtype, torch.float32)
    keys, values = k.to(compute).unsqueeze(2), v.to(compute).unsqueeze(2)  # [B, G, 1, Tk, .]
    rows = rows_for(B, H, Tk, Tq)
    table = None
    if bias is not None and bias.table is not None and key_mask is None and consecutive(q_pos, k_pos):
        table = bias.table(Tk)
    masks = ChunkMasks(bias, table, q_pos, k_pos, key_mask, Tq, Tk, rows, compute, window)
    outputs = []
    for i0 in reversed(range(0, Tq, rows)):  # the widest chunk first: later ones reuse its memory (recompute.py)
        i1 = min(i0 + rows, Tq)
        end, C = past + i1, i1 - i0  # the keys the chunk's last query sees
        backwards = (q[:, :, i0:i1].flip(2).to(compute) * scale).view(B, G, H // G, C, d)
        scores = (backwards @ keys[..., :end, :].transpose(-1, -2)).view(B, H, C, end)
        with masks.chunk(i0, i1, 0, end) as mask:
            scores = scores + mask
        if sinks is not None:  # the sink's column joins the softmax, then leaves
            column = sinks.to(compute)[None, :, None, None].expand(B, H, C, 1)
            weights = torch.cat((scores, column), -1).softmax(-1)[..., :-1].flip(2)
        else:
            weights = scores.softmax(-1).flip(2)  # queries in order again
        report(weights, past + i0)
        outputs.append((weights.view(B, G, H // G, C, end) @ values[..., :end, :]).view(B, H, C, dv))
    return torch.cat(outputs[::-1], dim=-2).to(v.dtype)
