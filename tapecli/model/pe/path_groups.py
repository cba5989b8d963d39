"""PaTH's training attention, one chunk of queries at a time, with its backward written out (no autograd graph).

    out = QueryGroups.apply(q_own, own, keys, maps, v, mask)     # [B, G, r, N C, d]

The inputs are what `path_ops.training_pieces` returns (merged chunks), for N chunks of C tokens, G key heads
with r query heads each: q_own [B, G, r, N, C, d] (each query after its own chunk's maps up to itself), own
[B, G, r, N, C, C] (each chunk's logits against its own keys, -inf above the diagonal), keys [B, G, N, d, C] (chunk
m's keys carried to the chunk's end, transposed), maps [B, G, N, d, d] (M_m^T, the chunk's map of a row vector);
v [B, G, N C, d]; mask: bool [B|1, G|1, r|1, N C, N C] or None (causal).

The queries of chunk a walk the earlier key chunks m = a-1, ..., 0 backwards: X_{a-1} = q_own[a], logits
L_m = X_m keys[m], then X_{m-1} = X_m maps[m]. The logits live key chunk first ([m, rows, C]), so each L_m is
written by its matmul in place and every later step (softmax over all m and the own block, P V summed over m, and
in the backward dP, dV and dS) is one batched call.

The forward keeps the output and one log-sum-exp per row. The backward rebuilds one query chunk at a time (its L
and X_m; the X_m are [rows, d] each), takes P = exp(L - lse) and dS = P (dP - rowsum(dO * O)), and walks the chain
forwards, m = 0 .. a-1: dX_m = dS_m keys[m]^T + dX_{m-1} maps[m]^T, d keys[m] = X_m^T dS_m, d maps[m] = X_m^T
dX_{m-1}; d q_own[a] = dX_{a-1}. So memory is one chunk's [rows, T] logits, never [T, T] per head, and a step is
the flash-attention recipe: no softmax graph, no blocks to copy in and slice gradients out of, no checkpoint replay.
"""

from __future__ import annotations

import torch
from torch import Tensor


def chunk_logits(q_own: Tensor, keys: Tensor, maps: Tensor, a: int) -> tuple[Tensor, list[Tensor]]:
    """L [a, B, G, r C, C]: chunk a's queries against the key chunks before it, and X_m [B, G, r C, d], m < a."""
    B, G, r, N, C, d = q_own.shape
    logits = q_own.new_empty(a, B, G, r * C, C)
    carried: list[Tensor] = []  # X_{a-1}, ..., X_0
    x = q_own[:, :, :, a].reshape(B, G, r * C, d)
    for m in range(a - 1, -1, -1):
        carried.append(x)
        torch.matmul(x, keys[:, :, m], out=logits[m])
        if m > 0:
            x = x @ maps[:, :, m]
    return logits, carried[::-1]


def hide(logits: Tensor, own: Tensor, mask: Tensor | None, a: int) -> None:
    """Apply the padding mask, in place, to chunk a's logits L [a, B, G, r C, C] and own block [B, G, r, C, C]."""
    if mask is None:
        return
    C = own.shape[-1]
    rows = mask[..., a * C:(a + 1) * C, :(a + 1) * C]  # [B|1, G|1, r|1, C, (a + 1) C]
    own.masked_fill_(~rows[..., a * C:], float("-inf"))
    if a:
        earlier = rows[..., :a * C].unflatten(-1, (a, C)).movedim(-2, 0)  # [a, B|1, G|1, r|1, C, C]
        logits.view(a, *own.shape).masked_fill_(~earlier, float("-inf"))


def chunk_scores(q_own: Tensor, own: Tensor, keys: Tensor, maps: Tensor, mask: Tensor | None,
                 a: int) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Chunk a's masked logits: L [a, B, G, r C, C] against the earlier key chunks, its own block [B, G, r C, C] (a
    copy), and the carried queries X_m (`chunk_logits`)."""
    B, G, r, N, C, d = q_own.shape
    logits, carried = chunk_logits(q_own, keys, maps, a)
    block = own[:, :, :, a].clone()
    hide(logits, block, mask, a)
    return logits, block.view(B, G, r * C, C), carried


def by_chunk(t: Tensor, C: int) -> Tensor:
    """[B, G, N C, d] viewed as [N, B, G, C, d]."""
    return t.unflatten(2, (-1, C)).permute(2, 0, 1, 3, 4)


class QueryGroups(torch.autograd.Function):
    """Exact PaTH attention from its per-chunk pieces (module docstring); differentiable in q_own, own, keys, maps
    and v."""

    @staticmethod
    def forward(ctx, q_own: Tensor, own: Tensor, keys: Tensor, maps: Tensor, v: Tensor, mask: Tensor | None,
                ) -> Tensor:
        B, G, r, N, C, d = q_own.shape
        out = q_own.new_empty(B, G, r, N * C, d)
        lse = q_own.new_empty(B, G, r, N * C, 1)
        values = by_chunk(v, C)
        for a in range(N):
            logits, block, _ = chunk_scores(q_own, own, keys, maps, mask, a)
            top = torch.maximum(logits.amax((0, -1)), block.amax(-1)) if a else block.amax(-1)
            top = top.unsqueeze(-1)
            block = block.sub_(top).exp_()
            total = block.sum(-1, keepdim=True)
            o = block @ values[a]
            if a:
                probs = logits.sub_(top).exp_()
                total += probs.sum((0, -1)).unsqueeze(-1)
                o += (probs @ values[:a]).sum(0)
            out[..., a * C:(a + 1) * C, :] = (o / total).view(B, G, r, C, d)
            lse[..., a * C:(a + 1) * C, :] = (top + total.log()).view(B, G, r, C, 1)
        ctx.save_for_backward(q_own, own, keys, maps, v, out, lse, mask)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q_own, own, keys, maps, v, out, lse, mask = ctx.saved_tensors
        B, G, r, N, C, d = q_own.shape
        d_q_own, d_own = torch.zeros_like(q_own), torch.zeros_like(own)
        d_keys, d_maps, dv = torch.zeros_like(keys), torch.zeros_like(maps), torch.zeros_like(v)
        values, d_values = by_chunk(v, C), by_chunk(dv, C)
        delta = (grad_out * out).sum(-1, keepdim=True)
        for a in range(N):
            rows = slice(a * C, (a + 1) * C)
            do = grad_out[..., rows, :].reshape(B, G, r * C, d)
            row_lse = lse[..., rows, :].reshape(B, G, r * C, 1)
            row_delta = delta[..., rows, :].reshape(B, G, r * C, 1)
            logits, block, carried = chunk_scores(q_own, own, keys, maps, mask, a)
            block = block.sub_(row_lse).exp_()
            d_values[a] += block.transpose(-1, -2) @ do
            d_own[:, :, :, a] = ((do @ values[a].transpose(-1, -2)).sub_(row_delta).mul_(block)).view(B, G, r, C, C)
            if not a:
                continue
            probs = logits.sub_(row_lse).exp_()
            d_values[:a] += probs.transpose(-1, -2) @ do
            ds = (do @ values[:a].transpose(-1, -2)).sub_(row_delta).mul_(probs)
            del logits, probs
            dx = None  # the gradient of X_{m-1}
            for m in range(a):
                x = carried[m]
                d_keys[:, :, m] += x.transpose(-1, -2) @ ds[m]
                grad_x = ds[m] @ keys[:, :, m].transpose(-1, -2)
                if dx is not None:
                    d_maps[:, :, m] += x.transpose(-1, -2) @ dx
                    grad_x += dx @ maps[:, :, m].transpose(-1, -2)
                dx = grad_x
            d_q_own[:, :, :, a] = dx.view(B, G, r, C, d)
        return d_q_own, d_own, d_keys, d_maps, dv, None
