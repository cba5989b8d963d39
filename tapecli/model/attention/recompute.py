"""Query chunks for PEs that compute attention themselves (DAPE, GRAPE-AP, CoPE's reference path; PaTH and CoPE's
training function size their chunks with `rows_for`): memory linear in the sequence length.

    out = by_query_chunks(fn, q_len, rows)      # = torch.cat([fn(i0, i1) for each chunk], dim=-2)

`fn(i0, i1)` returns the attention output [..., i1 - i0, dv] of queries i0..i1-1 (every row of attention only
needs its own query, so chunks are independent). While gradients are recorded each chunk runs under
`torch.utils.checkpoint` (non-reentrant): its [chunk, keys] intermediates are dropped after the forward and
rebuilt, one chunk at a time, in the backward, so nothing of size [Tq, Tk] per head ever exists. Without
gradients the chunks simply run one after another, the last (widest) first: each later chunk's temporaries then fit
in memory the allocator already holds (in order, every chunk asks for slightly more than any freed block, and the
process's resident memory grows with the sum of all chunks, ~1 GiB at 16K tokens, instead of the largest).
Each chunk's output is written into one output buffer as it comes (nothing chunk-sized is kept between chunks),
and glibc's freed heap pages go back to the system once the process has grown by a few GiB (heap.py): small
tensors kept between chunks pin the freed temporaries, and the heap would grow with the number of chunks.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tapecli.model.attention.heap import trimming

SCORE_ELEMENTS = 1 << 21  # [B, H, chunk, Tk] elements per chunk: each of a chunk's few temporaries is 8 MiB in fp32


def rows_for(batch: int, heads: int, k_len: int, q_len: int, budget: int = 1, multiple: int = 1) -> int:
    """Queries per chunk: a multiple of `multiple` keeping [batch, heads, rows, k_len] near `budget` x
    SCORE_ELEMENTS (at least one multiple, at most every query)."""
    elements = budget * SCORE_ELEMENTS
    rows = max(multiple, (elements // max(1, batch * heads * k_len)) // multiple * multiple)
    return min(rows, max(q_len, 1))


def by_query_chunks(fn: Callable[[int, int], Tensor], q_len: int, rows: int) -> Tensor:
    """torch.cat([fn(i0, min(i0 + rows, q_len)) for i0 in range(0, q_len, rows)], dim=-2), recomputing each chunk
    in the backward when gradients are recorded; each chunk's output is copied into the result as it comes."""
    grad = torch.is_grad_enabled()
    starts = range(0, q_len, rows)
    if len(starts) <= 1:
        return fn(0, q_len)
    fn, out = trimming(fn), None
    for i0 in starts if grad else reversed(starts):
        i1 = min(i0 + rows, q_len)
        part = checkpoint(fn, i0, i1, use_reentrant=False, preserve_rng_state=False) if grad else fn(i0, i1)
        if out is None:
            out = part.new_empty((*part.shape[:-2], q_len, part.shape[-1]))
        out[..., i0:i1, :] = part
        del part
    return out
