"""Stick-breaking attention's exact computation (the math of `tapecli.model.pe.stickbreaking`), one chunk of
queries at a time, with its backward written out; and the materialised reference.

    out = stick_breaking(q, k, v, key_mask, scale, current, remainder, rows)        # [B, H, Tq, d]
    out = stick_breaking_dense(q, k, v, key_mask, scale, current, remainder)        # every [Tq, Tk] weight, autograd

q [B, H, Tq, d] are the last Tq of Tk = past + Tq tokens; k, v [B, G, Tk, d] with G dividing H (head h reads key
head h // (H / G)); `key_mask` [B, Tk] False for padding (None: none); `current` lets a query see its own key
(the official code's attend_current); `remainder` adds each query's leftover stick times its own value.

Query i with break points b_ij = sigmoid(z_ij), z_ij = scale q_i . k_j, over its visible keys j (j < i, or j <= i
with `current`; padding hidden), gives key j the weight

    A_ij = b_ij prod_{j < k <= i, k visible} (1 - b_ik),       rem_i = prod_{j visible} (1 - b_ij) = 1 - sum_j A_ij

(the nearest key takes its share of the stick first), and out_i = sum_j A_ij v_j (+ rem_i v_i with `remainder`).
A hidden key breaks nothing (its factor is 1).

`stick_breaking` stores each chunk's keys nearest first (the keys reversed once per call), so the products of
(1 - b) over the nearer keys are one `cumprod` along the row, and A = b times that product shifted by one key
(no logarithms: a product that underflows is a weight below 1e-38). Only the first C columns of a chunk of C
queries hold keys some of its queries may not see; padding needs a mask per chunk, built from `key_mask`.

Its backward (`StickBreakingChunks`) keeps q, k, v and rebuilds each chunk's A and b; with a_ij = A_ij (dO_i . v_j) and
c_i = sum_j a_ij + dRem_i rem_i,

    dz_ij = a_ij - b_ij (c_i - sum_{l nearer than j} a_il)           (z_ij enters log A_il for l = j and farther)

then dq = scale dZ k, dk = scale dZ^T q, dv = A^T dO: five matmuls per chunk (one rebuilds z) and no autograd
graph, so memory is a few [B, H, C, Tk] blocks, never [Tq, Tk] per head. Tested against a naive fp64 product loop
(tests/model/test_stickbreaking.py) and against `stick_breaking_dense` by autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor


def hidden_keys(key_mask: Tensor | None, past: int, i0: int, i1: int, current: bool,
                device: torch.device) -> Tensor:
    """Which reversed key columns the queries i0..i1-1 of a chunk may not see: without padding [C, C] for its first
    C columns (every later column is visible to all), with padding [B, 1, 1, C, past + i1]. Reversed column r is
    key past + i1 - 1 - r."""
    end = past + i1
    rows = torch.arange(past + i0, end, device=device)[:, None]
    width = end if key_mask is not None else i1 - i0
    keys = torch.arange(end - 1, end - 1 - width, -1, device=device)
    hidden = keys > rows if current else keys >= rows
    if key_mask is None:
        return hidden
    return (hidden | ~key_mask[:, None, keys])[:, None, None]


def chunk_weights(qc: Tensor, keys: Tensor, hidden: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """A [B, G, r C, K] of grouped, scaled queries qc [B, G, r C, d] over reversed keys [B, G, K, d], the break
    points b, and the leftover stick rem [B, G, r C, 1]. `shape` is (B, G, r, C, K), the view the masks
    broadcast over."""
    breaks = torch.matmul(qc, keys.transpose(-1, -2))
    view = breaks.view(shape)
    if hidden.dim() == 2:  # only the first C columns hold keys some query of the chunk may not see
        view[..., :hidden.shape[-1]].masked_fill_(hidden, float("-inf"))
    else:
        view.masked_fill_(hidden, float("-inf"))
    breaks.sigmoid_()  # b = 0 for hidden keys: they break nothing
    # The stick left before each key: the product of (1 - b) over the nearer keys, a cumulative product of the
    # factors shifted by one key (the nearest key starts from the whole stick). The factors are written one element
    # further on in a flat buffer, so each row starts with the previous row's last factor, overwritten with 1: one
    # pass, into a contiguous `out` (torch.compile takes no other).
    flat = breaks.new_empty(breaks.numel() + 1)
    torch.sub(breaks.new_ones(()), breaks.reshape(-1), out=flat[1:])
    weights = flat[:-1].view(breaks.shape)
    weights[..., 0] = 1.0
    weights.cumprod_(-1)
    rem = weights[..., -1:] * (1.0 - breaks[..., -1:])
    return weights.mul_(breaks), breaks, rem


def grouped(t: Tensor, G: int, i0: int, i1: int) -> Tensor:
    """Rows i0..i1-1 of t [B, H, T, e] as [B, G, r (i1 - i0), e], the r query heads of a key head stacked."""
    B, H, _, e = t.shape
    return t.view(B, G, H // G, -1, e)[:, :, :, i0:i1].reshape(B, G, -1, e)


class StickBreakingChunks(torch.autograd.Function):
    """forward(q, k, v, key_mask, scale, current, remainder, rows) -> out [B, H, Tq, d] (module docstring)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, scale: float, current: bool,
                remainder: bool, rows: int) -> Tensor:
        B, H, Tq, d = q.shape
        G, Tk = k.shape[1], k.shape[2]
        r, past = H // G, Tk - Tq
        keys, values = k.flip(2), v.flip(2)  # nearest first: a chunk's keys are the last past + i1 of these
        out = q.new_empty(B, G, r, Tq, v.shape[-1])
        for i0 in range(0, Tq, rows):
            i1 = min(i0 + rows, Tq)
            K = past + i1
            hidden = hidden_keys(key_mask, past, i0, i1, current, q.device)
            weights, _, rem = chunk_weights(grouped(q, G, i0, i1) * scale, keys[:, :, Tk - K:], hidden,
                                            (B, G, r, i1 - i0, K))
            o = weights @ values[:, :, Tk - K:]
            if remainder:
                o += rem * v[:, :, past + i0:past + i1].repeat(1, 1, r, 1)
            out[:, :, :, i0:i1] = o.view(B, G, r, i1 - i0, -1)
        ctx.save_for_backward(q, keys, values, key_mask)
        ctx.scale, ctx.current, ctx.remainder, ctx.rows = scale, current, remainder, rows
        return out.view(B, H, Tq, -1)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, keys, values, key_mask = ctx.saved_tensors
        scale, current, remainder, rows = ctx.scale, ctx.current, ctx.remainder, ctx.rows
        B, H, Tq, d = q.shape
        G, Tk = keys.shape[1], keys.shape[2]
        r, past = H // G, Tk - Tq
        dq = torch.empty_like(q).view(B, G, r, Tq, d)
        d_keys, d_values = torch.zeros_like(keys), torch.zeros_like(values)
        for i0 in range(0, Tq, rows):
            i1 = min(i0 + rows, Tq)
            K, C = past + i1, i1 - i0
            qc, do = grouped(q, G, i0, i1) * scale, grouped(grad_out, G, i0, i1)
            kc, vc = keys[:, :, Tk - K:], values[:, :, Tk - K:]
            hidden = hidden_keys(key_mask, past, i0, i1, current, q.device)
            weights, breaks, rem = chunk_weights(qc, kc, hidden, (B, G, r, C, K))
            a = torch.matmul(do, vc.transpose(-1, -2)).mul_(weights)  # a_ij = A_ij dA_ij
            total = a.sum(-1, keepdim=True)
            if remainder:  # out_i += rem_i v_i: v_i's own gradient, and rem's through every break point
                own = values[:, :, Tk - past - i1:Tk - past - i0].flip(2).repeat(1, 1, r, 1)  # v of i0..i1-1
                total += rem * (do * own).sum(-1, keepdim=True)
                d_own = (rem * do).view(B, G, r, C, d).sum(2)
                d_values[:, :, Tk - past - i1:Tk - past - i0] += d_own.flip(2)
            # dz = a - b (c - sum of a over the nearer keys): the sum starts from -c, one cumulative sum of the a of
            # the keys before each one.
            nearer = torch.empty_like(a)
            nearer[..., :1] = -total
            nearer[..., 1:] = a[..., :-1]
            dz = a.addcmul_(breaks, nearer.cumsum_(-1))  # the gradient of the logit scale q . k
            dq[:, :, :, i0:i1] = (dz @ kc).mul_(scale).view(B, G, r, C, d)
            d_keys[:, :, Tk - K:] += dz.transpose(-1, -2) @ qc
            d_values[:, :, Tk - K:] += weights.transpose(-1, -2) @ do
        return dq.view(B, H, Tq, d), d_keys.flip(2), d_values.flip(2), None, None, None, None, None


def stick_breaking(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, scale: float, current: bool,
                   remainder: bool, rows: int) -> Tensor:
    """Exact stick-breaking attention, `rows` queries per chunk (module docstring); differentiable in q, k, v."""
    return StickBreakingChunks.apply(q, k, v, key_mask, scale, current, remainder, rows)


def stick_breaking_dense(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, scale: float, current: bool,
                         remainder: bool) -> Tensor:
    """The same with every [Tq, Tk] weight materialised and autograd's backward, in log space: log A_ij =
    log b_ij + sum over the nearer visible keys of log(1 - b_ik) (the reference of attention.forced("dense"))."""
    H, G, Tq, Tk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
    z = q @ k.transpose(-1, -2) * scale
    rows, keys = torch.arange(Tk - Tq, Tk, device=q.device)[:, None], torch.arange(Tk, device=q.device)
    seen = keys <= rows if current else keys < rows
    if key_mask is not None:
        seen = seen & key_mask[:, None, None, :]
    log_keep = torch.nn.functional.logsigmoid(-z).masked_fill(~seen, 0.0)  # log(1 - b); hidden keys: log 1
    nearer = log_keep.flip(-1).cumsum(-1).flip(-1) - log_keep  # sum over the keys after j
    weights = (torch.nn.functional.logsigmoid(z) + nearer).masked_fill(~seen, float("-inf")).exp()
    out = weights @ v
    if remainder:
        out = out + log_keep.sum(-1, keepdim=True).exp() * v[:, :, Tk - Tq:]
    return out
