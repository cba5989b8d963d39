"""CoPE's attention, one chunk of queries at a time (the math of `tapecli.model.pe.cope`): the training function
with its own backward, the forward without a graph, and what both share.

    out = CoPEAttention.apply(q, k_rev, v_rev, table, hidden, npos_max, temperature)    # training: cope-recompute
    out, rows = cope_forward(q, k_rev, v_rev, table, hidden, npos_max, temperature)    # no gradients: cope-chunked

q [B, H, Tq, d] are the last Tq of Tk = past + Tq tokens; k_rev, v_rev [B, H, Tk, d] the keys and values in
reverse order (latest first: each chunk reads its keys as a view); table e [npos_max + 1, d]; `hidden` a `Hidden`
(which keys each chunk's queries may not see). The forward keeps only its inputs and output; the backward
recomputes each chunk's logits once (`chunk_logits`: the gates computed only up to the column where every query's
position has reached npos_max) and takes every gradient from them. Both equal the plain formulas of
`CoPELayer.chunk_attention` (the tests hold them to it).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from tapecli.model.pe.base import rows_for

KEY_SPAN = 4096  # chunks of queries are sized for this many keys at most (`chunk_rows`)


class Hidden:
    """hidden(i0, i1): which keys queries i0..i1-1 may not see, as the chunk functions take it ([.., C, K'] over the
    first K' of the chunk's keys in reverse order), from `attention_mask`'s mask (None: plain causal, the queries
    the last Tq of past + Tq tokens; then only the first C columns hold future keys, query i sees c >= i1 - 1 - i,
    the same triangle for every chunk of C queries)."""

    def __init__(self, mask: Tensor | None, past: int, device: torch.device) -> None:
        self.mask, self.past, self.device = mask, past, device
        self.future: dict[int, Tensor] = {}

    def __call__(self, i0: int, i1: int) -> Tensor:
        if self.mask is None:
            C = i1 - i0
            if C not in self.future:
                self.future[C] = ~torch.ones(C, C, dtype=torch.bool, device=self.device).triu(0).flip(0)
            return self.future[C]
        mask = self.mask[..., i0:i1, :self.past + i1]
        return ~(mask if mask.dtype == torch.bool else mask > float("-inf")).flip(-1)


def chunk_rows(batch: int, heads: int, past: int, q_len: int) -> int:
    """Queries per chunk, sized as if there were at most KEY_SPAN keys: past that, a chunk keeps its queries and grows
    with the keys (memory still linear in the length), since each chunk's backward also pays a pass over every key
    and value (their gradients' slices), which fewer queries per chunk would multiply."""
    return rows_for(batch, heads, min(past + q_len, KEY_SPAN), q_len)


def chunk_logits(qs: Tensor, keys: Tensor, hidden: Tensor, z: Tensor, step: Tensor, npos_max: int,
                 keep: bool) -> tuple[Tensor, list[Piece], int]:
    """The logits of `CoPELayer.chunk_attention` before the temperature, for scaled queries qs [B, H, C, d], z = qs
    e^T and its steps (`step`), in as few passes over the [C, K] block as torch's ops allow (each op writes in
    place where it can). Returns (logits, the pieces of columns whose gates were computed, `saturated`).

    Positions only grow along the columns (the gates are >= 0), so once every row's running sum has reached
    npos_max, every later position is npos_max (w = 0, the step there is 0): those columns, from `saturated` on,
    only add z[npos_max], and their gates are never computed. The gates run in pieces of columns until then: the
    first npos_max + C (no row can reach npos_max before, nor a causal row whose first C columns are the future's),
    then as many as the slowest row needs at its rate so far (at least a quarter of npos_max). Without the clamp
    (K <= npos_max), one piece."""
    logits = qs @ keys.transpose(-1, -2)
    logits[..., :hidden.shape[-1]].masked_fill_(hidden, float("-inf"))
    K = logits.shape[-1]
    clamp = K > npos_max
    pieces: list[Piece] = []
    start, stop, carry = 0, min(K, npos_max + qs.shape[2]) if clamp else K, None
    while start < K:
        gates = torch.sigmoid(logits[..., start:stop])
        positions = gates.cumsum(-1) if keep else gates.cumsum_(-1)
        if carry is not None:
            positions.add_(carry)
        carry = positions[..., -1:].clone()  # the running sums so far, unclamped
        if clamp:
            positions.clamp_(max=npos_max)
        index = positions.long()  # floor p: positions are >= 0
        weight = positions.frac_()  # p - floor p, in place
        gathered = torch.gather(z, -1, index)
        block = logits[..., start:stop]
        block.add_(gathered)
        torch.gather(step, -1, index, out=gathered)
        block.addcmul_(weight, gathered)
        pieces.append(Piece(start, stop, gates if keep else None, weight, index, gathered))
        start = stop
        if start < K:
            least = float(carry.min())
            if least >= npos_max:
                logits[..., start:].add_(z[..., npos_max:])
                return logits, pieces, start
            more = (npos_max - least) * start / least if least > 0 else K  # at the slowest row's rate so far
            stop = min(K, start + max(int(more) + 1, npos_max // 4, 1))
    return logits, pieces, K


class Piece(NamedTuple):
    """Columns start..stop-1 of a chunk's logits with their gates computed (`chunk_logits`): the gates (None when
    not kept), the interpolation weights w, floor p (int64) and step[floor p], each [B, H, C, stop - start]."""
    start: int
    stop: int
    gates: Tensor | None
    weight: Tensor
    index: Tensor
    steps: Tensor


def table_terms(qs: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
    """z = qs e^T [B, H, C, npos_max + 1] and its steps z[n + 1] - z[n] (0 after the last entry)."""
    z = qs @ table.T
    return z, torch.nn.functional.pad(z[..., 1:] - z[..., :-1], (0, 1))


def cope_forward(q: Tensor, k_rev: Tensor, v_rev: Tensor, table: Tensor, hidden: Hidden, npos_max: int,
                 temperature: float) -> tuple[Tensor, int]:
    """CoPE's attention without a graph, one chunk of queries at a time, the last (widest) first (each later
    chunk's temporaries then fit in memory the allocator already holds); returns the output and the chunk's rows."""
    B, H, Tq, d = q.shape
    Tk = k_rev.shape[2]
    past = Tk - Tq
    rows = chunk_rows(B, H, past, Tq)
    out = q.new_empty(B, H, Tq, v_rev.shape[-1])
    with torch.no_grad():
        for i0 in reversed(range(0, Tq, rows)):
            i1 = min(i0 + rows, Tq)
            qs = q[:, :, i0:i1] * d ** -0.5
            z, step = table_terms(qs, table)
            logits = chunk_logits(qs, k_rev[:, :, Tk - past - i1:], hidden(i0, i1), z, step, npos_max, False)[0]
            if temperature != 1.0:
                logits.div_(temperature)
            out[:, :, i0:i1] = logits.softmax(-1) @ v_rev[:, :, Tk - past - i1:]
    return out, rows


class CoPEAttention(torch.autograd.Function):
    """forward(q, k_rev, v_rev, table, hidden, npos_max, temperature) -> out: `cope_forward`, keeping only its inputs
    and output. The backward recomputes each chunk's logits once and takes every gradient from them in one sweep:
    the softmax's (dA = P (dP - rowsum(dO O)) / T), the table lookups' (scatter-added into dz), the interpolation
    weight's (dA step[floor p], zero where p is clamped: the step there is 0), its reversed running sum (the gates'
    gradient: the row's total minus the running sum up to the key before) and the sigmoid's."""

    @staticmethod
    def forward(ctx, q: Tensor, k_rev: Tensor, v_rev: Tensor, table: Tensor, hidden: Hidden, npos_max: int,
                temperature: float) -> Tensor:
        out, rows = cope_forward(q, k_rev, v_rev, table, hidden, npos_max, temperature)
        ctx.save_for_backward(q, k_rev, v_rev, table, out)
        ctx.hidden, ctx.npos_max, ctx.temperature, ctx.rows = hidden, npos_max, temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k_rev, v_rev, table, out = ctx.saved_tensors
        B, H, Tq, d = q.shape
        Tk = k_rev.shape[2]
        past, scale, temperature = Tk - Tq, d ** -0.5, ctx.temperature
        dq, dk, dv, dtable = torch.empty_like(q), torch.zeros_like(k_rev), torch.zeros_like(v_rev), torch.zeros_like(
            table)
        for i0 in reversed(range(0, Tq, ctx.rows)):
            i1 = min(i0 + ctx.rows, Tq)
            keys, values = k_rev[:, :, Tk - past - i1:], v_rev[:, :, Tk - past - i1:]
            qs, do = q[:, :, i0:i1] * scale, grad_out[:, :, i0:i1]
            z, step = table_terms(qs, table)
            logits, pieces, saturated = chunk_logits(qs, keys, ctx.hidden(i0, i1), z, step, ctx.npos_max, True)
            if temperature != 1.0:
                logits.div_(temperature)
            probs = logits.softmax(-1)
            del logits
            dv[:, :, Tk - past - i1:] += probs.transpose(-1, -2) @ do
            # The softmax's gradient, written over the values' product dP.
            dlogits = (do @ values.transpose(-1, -2)).sub_((do * out[:, :, i0:i1]).sum(-1, keepdim=True)).mul_(probs)
            del probs
            if temperature != 1.0:
                dlogits.div_(temperature)
            # z[floor p] + w step[floor p]: dz gets dA at floor p, and the step's gradient dA w moves from n to n + 1.
            dz, dstep = torch.zeros_like(z), torch.zeros_like(z)
            dz[..., ctx.npos_max] += dlogits[..., saturated:].sum(-1)  # columns where p = npos_max and w = 0
            later = None  # the positions' gradients summed over the later pieces
            for piece in reversed(pieces):
                grad = dlogits[..., piece.start:piece.stop]
                dz.scatter_add_(-1, piece.index, grad)
                dstep.scatter_add_(-1, piece.index, piece.weight.mul_(grad))
                # The positions' gradient dA step[floor p]; the gates' is its sum over the later columns (t >= j).
                dpos = piece.steps.mul_(grad)
                sums = dpos.cumsum(-1)
                later = sums[..., -1:].clone() if later is None else sums[..., -1:] + later
                dgates = torch.sub(later, sums.sub_(dpos), out=dpos)  # the total minus the sum before each key
                grad.add_(torch.ops.aten.sigmoid_backward(dgates, piece.gates))
            del pieces
            dz[..., 1:] += dstep[..., :-1]
            dz[..., :-1] -= dstep[..., :-1]
            dq[:, :, i0:i1] = (dlogits @ keys + dz @ table) * scale
            dk[:, :, Tk - past - i1:] += dlogits.transpose(-1, -2) @ qs
            dtable += dz.flatten(0, -2).T @ qs.flatten(0, -2)
        return dq, dk, dv, dtable, None, None, None
