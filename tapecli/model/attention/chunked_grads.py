"""The chunked path's backward by hand, from one chunk's attention weights P and score gradient dS
(tapecli/model/attention/chunked.py's `ChunkedAttention.backward` calls these):

    probs, ds = probs_and_score_grad(q, k, v, mask, do, out, lse, scale, future)   # P and dS of a chunk
    dq = input_grads(q, k, v, do, probs, ds, scale, dk, dv)      # dq; dk, dv added into their buffers
    pairs_grads(d_parameters, parameters, bias, ds)              # dS pulled back through a learned pair bias
    band_grad(d_values, q, k, v, grad_out, out, lse, band_mask(values, BAND_ROWS, window, dtype), past, i0, i1,
              scale, d_sink)                                     # a distance table's gradient from its band only
"""

from __future__ import annotations

import torch
from torch import Tensor

BAND_ROWS = 64  # queries per block of `band_grad`: each block scores its rows x (rows + band) keys


def probs_and_score_grad(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, do: Tensor, out: Tensor, lse: Tensor,
                         scale: float, future: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The chunk's attention weights P = exp(scale q k^T + mask - lse) and dS = P (dP - rowsum(dO * O))
    [B, H, C, K] for queries q [B, H, C, d] and keys k, v [B, G, K, d], fp32 at least; `future` [C, C]: weights of
    the last C keys to zero (`ChunkMasks.unmasked`: pairs the mask leaves visible). Each is one batched matmul over
    the (batch, key head) pairs with its query heads' rows stacked, adding the rest in the same call (`baddbmm`):
    P the mask, and -lse as one more column of the (scaled) queries against a column of ones in the keys; dP minus
    the row term. Then one pass each, in place: exp, and the product with P."""
    B, H, C, d = q.shape
    G, K = k.shape[1], k.shape[2]
    compute = torch.promote_types(q.dtype, torch.float32)
    q, k, v, do, out = (t.to(compute) for t in (q, k, v, do, out))
    stacked = (B * G, H // G * C)  # [B, G, H / G, C] rows: the layout of [B, H, C]
    q_lse = torch.cat((q * scale, -lse.to(compute)[..., None]), -1).reshape(*stacked, d + 1)
    k_one = torch.cat((k, k.new_ones(B, G, K, 1)), -1).reshape(B * G, K, d + 1)
    offset = mask.to(compute).expand(B, H, C, K).reshape(*stacked, K)
    probs = torch.baddbmm(offset, q_lse, k_one.transpose(-1, -2)).exp_().view(B, H, C, K)
    if future is not None:
        probs[..., K - C:].masked_fill_(future, 0)
    term = (do * out).sum(-1, keepdim=True).neg_().reshape(*stacked, 1)
    dp = torch.baddbmm(term.expand(*stacked, K), do.reshape(*stacked, -1), v.reshape(B * G, K, -1).transpose(-1, -2))
    return probs, dp.view(B, H, C, K).mul_(probs)


def input_grads(q: Tensor, k: Tensor, v: Tensor, do: Tensor, probs: Tensor, ds: Tensor, scale: float,
                dk: Tensor, dv: Tensor) -> Tensor:
    """The chunk's dq [B, H, C, d] from its P and dS, and its dk, dv added into `dk`, `dv` [B, G, K, d]: the
    kernel's backward by hand, for chunks whose P and dS exist anyway (a learned pair bias needs dS). One batched
    matmul each, with the rows of a key head's query heads stacked (dk and dv sum over them inside the matmul, and
    add into `dk`, `dv` there where their layout allows)."""
    B, H, C, d = q.shape
    G, K = k.shape[1], k.shape[2]
    stacked = (B * G, H // G * C)
    ds, probs = ds.reshape(*stacked, K), probs.reshape(*stacked, K)
    dq = torch.bmm(ds, k.to(ds.dtype).reshape(B * G, K, d)).view(B, H, C, d).mul_(scale)
    for into, weights, rows, alpha in ((dk, ds, q, scale), (dv, probs, do, 1.0)):
        rows = rows.to(ds.dtype).reshape(*stacked, -1)
        matrices = into.view(B * G, K, -1) if into.dtype == ds.dtype and mergeable(into) else None
        if matrices is not None:
            matrices.baddbmm_(weights.transpose(-1, -2), rows, alpha=alpha)
        else:
            into += torch.bmm(weights.transpose(-1, -2), rows).view(into.shape).mul_(alpha).to(into.dtype)
    return dq


def mergeable(t: Tensor) -> bool:
    """Whether t's first two dimensions view as one (`t.view(-1, *t.shape[2:])` without a copy)."""
    return t.shape[0] == 1 or t.shape[1] == 1 or t.stride(0) == t.shape[1] * t.stride(1)


def band_mask(values: Tensor, rows: int, window: int | None, dtype: torch.dtype) -> Tensor:
    """[H, rows, rows + m - 2]: the mask of a block of `rows` consecutive queries (in order) over the keys from
    m - 2 before its first query to its last one, for a distance table [H, m]: row r, column j at distance
    m - 2 + r - j (-inf in the future and from the window on). The same for every block."""
    m = values.shape[-1]
    distance = (m - 2) + torch.arange(rows, device=values.device)[:, None] - torch.arange(
        rows + m - 2, device=values.device)
    hidden = distance < 0 if window is None else (distance < 0) | (distance >= window)
    return values.detach().to(dtype)[:, distance.clamp(0, m - 1)].masked_fill(hidden, float("-inf"))


def band_grad(d_values: Tensor, q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, out: Tensor, lse: Tensor,
              mask: Tensor, past: int, i0: int, i1: int, scale: float, d_sink: Tensor | None = None) -> None:
    """Add the gradient of a distance table [H, m] from queries i0..i1-1 (in order; `mask` is `band_mask`): dS
    summed per distance 0..m-2, and minus that total to entry m-1 (every row of dS sums to zero; with sinks,
    `d_sink` [H] is the chunk's sum of the sink's column, which the real keys' rows sum to minus).
    Only the band is scored: the queries in blocks of `BAND_ROWS`, each over the m - 2 keys before it and its
    own (one batched matmul per product over every block), and each distance's entries read as a column of a
    strided view of dS (entry (r, r + u) is distance m - 2 - u), so the sum per distance is one reduction."""
    m = d_values.shape[-1]
    if m > 1:
        per_distance = 0
        rows = min(BAND_ROWS, i1 - i0)
        whole = (i1 - i0) // rows * rows
        for a, b in ((i0, i0 + whole), (i0 + whole, i1)):
            if b > a:
                s = rows if b - a >= rows else b - a
                per_distance = per_distance + band_sums(q, k, v, grad_out, out, lse, mask[:, :s, :s + m - 2],
                                                        past, a, b, s, scale)
        per_distance = per_distance.to(d_values.dtype)  # [H, m - 1]
        d_values[:, :-1] += per_distance
        d_values[:, -1] -= per_distance.sum(-1)
    if d_sink is not None:
        d_values[:, -1] -= d_sink.to(d_values.dtype)


def band_sums(q: Tensor, k: Tensor, v: Tensor, grad_out: Tensor, out: Tensor, lse: Tensor, mask: Tensor,
              past: int, a: int, b: int, rows: int, scale: float) -> Tensor:
    """dS summed per distance 0..D-1 [H, D] (D = mask.shape[-1] - rows + 1) over queries a..b-1, in blocks of
    `rows` (b - a a multiple of it): block n's keys are the D - 1 before its first query and its own."""
    B, H, _, d = q.shape
    G = k.shape[1]
    D = mask.shape[-1] - rows + 1
    blocks, keys = (b - a) // rows, mask.shape[-1]
    compute = torch.promote_types(q.dtype, torch.float32)
    first = past + a - (D - 1)  # the first key of the first block; before key 0 the keys are zeros, masked below
    k_c, v_c = (t[:, :, max(0, first):past + b].to(compute) for t in (k, v))
    if first < 0:
        k_c, v_c = (torch.cat((t.new_zeros(B, G, -first, t.shape[-1]), t), 2) for t in (k_c, v_c))

    def windows(t: Tensor) -> Tensor:  # [B * H * blocks, keys, d]: block n's keys, shared by a key head's queries
        s = t.stride()
        view = t.as_strided((B, G, 1, blocks, keys, t.shape[-1]), (s[0], s[1], 0, rows * s[2], s[2], s[3]))
        return view.expand(B, G, H // G, blocks, keys, t.shape[-1]).reshape(B * H * blocks, keys, t.shape[-1])

    def per_block(t: Tensor) -> Tensor:  # queries a..b-1 of [B, H, T, ...] as [B * H * blocks, rows, ...]
        return t[:, :, a:b].to(compute).reshape(B * H * blocks, rows, *t.shape[3:])

    q_b, do_b, l_b = per_block(q), per_block(grad_out), per_block(lse)
    term = (do_b * per_block(out)).sum(-1, keepdim=True)  # rowsum(dO * O)
    offset = mask.to(compute)[None, :, None] - l_b.view(B, H, blocks, rows, 1)
    probs = offset.view(-1, rows, keys).baddbmm_(q_b, windows(k_c).transpose(-1, -2), alpha=scale).exp_()
    ds = torch.bmm(do_b, windows(v_c).transpose(-1, -2)).sub_(term).mul_(probs).view(B, H, blocks, rows, keys)
    for n in range(blocks):  # the zero keys before key 0 (the first blocks of the sequence only)
        before = -(first + n * rows)
        if before <= 0:
            break
        ds[:, :, n, :, :before] = 0
    band = ds.as_strided((B, H, blocks, rows, D), (*ds.stride()[:3], keys + 1, 1))  # (r, u): distance D - 1 - u
    return band.sum((0, 2, 3)).flip(-1)


def pairs_grads(d_parameters: list[Tensor | None], parameters: list[Tensor], bias: Tensor, ds: Tensor) -> None:
    """Pull dS of one chunk back through its bias (built by `ScoreBias.pairs` with autograd) to the tensors it
    reads."""
    wanted = [i for i, g in enumerate(d_parameters) if g is not None]
    ds = ds.sum(0, keepdim=True) if bias.shape[0] == 1 < ds.shape[0] else ds  # (a sum over one row is a copy)
    grads = torch.autograd.grad(bias, [parameters[i] for i in wanted], ds.to(bias.dtype), allow_unused=True)
    for i, g in zip(wanted, grads, strict=True):
        if g is not None:
            d_parameters[i] += g
