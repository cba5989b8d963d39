"""PaTH's training attention, one chunk of queries at a time, with its backward written out (no autograd graph).

    out = QueryGroups.apply(q_own, own, keys, maps, v, mask, sub, fused)     # [B, G, r, N C, d]

The inputs are what `path_ops.training_pieces` returns (merged chunks), for N chunks of C tokens, G key heads
with r query heads each: q_own [B, G, r, N, C, d] (each query after its own chunk's maps up to itself), own
[B, G, r, N, C, C] (each chunk's logits against its own keys, -inf above the diagonal), keys [B, G, N, d, C] (chunk
m's keys carried to the chunk's end, transposed), maps [B, G, N, d, d] (M_m^T, the chunk's map of a row vector);
v [B, G, N C, d]; mask: bool [B|1, G|1, r|1, N C, N C] or None (causal); sub: the tokens of the unmerged chunks
(a divisor of C: a row block of `sub` queries sees only the first keys of its own chunk up to its own block);
fused: whether the earlier chunks' blocks go through torch's fused CPU flash kernel (`fused_available`) or are
materialised.

The queries of chunk a walk the earlier key chunks m = a-1, ..., 0 backwards: X_{a-1} = q_own[a], logits
L_m = X_m keys[m], then X_{m-1} = X_m maps[m]. Each block L_m is a plain dot product of its own queries and keys,
so it is ordinary attention of X_m over chunk m's keys and values; only the own block (a's queries against its own
keys) holds logits that are no dot product: it is materialised, one row block of `sub` queries at a time over the
keys that row block can reach (36 of the block's 64 pieces for eight merged chunks). The parts of a row (own
block, earlier blocks) are each normalised on their own and merged by their log-sum-exps.

Fused (CPU): the a blocks of chunk a are one batched call of the flash kernel (`_scaled_dot_product_flash_attention_
for_cpu`, the batch being the key chunk), which keeps each block's output and log-sum-exp only. In the backward the
kernel's own backward, given the whole row's output and log-sum-exp, gives each block's share of dX_m, d keys[m]
and dv exactly (the flash-attention recipe: P = exp(L - lse) of the whole row, dS = P (dP - rowsum(dO * O))).
Materialised (other devices): the logits live key chunk first ([m, rows, C]), so each L_m is written by its matmul
in place and every later step (softmax, P V summed over m, and in the backward dP, dV and dS) is one batched call.

The forward keeps the output and one log-sum-exp per row. The backward rebuilds one query chunk at a time (its X_m,
[rows, d] each, and its own block), and walks the chain forwards, m = 0 .. a-1: dX_m = (the block's dX_m) +
dX_{m-1} maps[m]^T, d maps[m] = X_m^T dX_{m-1}; d q_own[a] = dX_{a-1}. So memory is one chunk's blocks at most,
never [T, T] per head, and nothing of the softmax is kept between forward and backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tapecli.model.pe.base import kernels_available


def fused_available(device: torch.device) -> bool:
    """Whether the earlier chunks' blocks can go through torch's fused CPU flash kernel (the chunked path's kernel,
    `kernels_available()["chunked"]`): on the CPU, where the kernel exists."""
    return device.type == "cpu" and kernels_available()["chunked"]


def carried(q_own: Tensor, maps: Tensor, a: int) -> Tensor:
    """X [a, B, G, r C, d]: chunk a's queries carried back to the end of each earlier chunk m (X[m] = X_m)."""
    B, G, r, N, C, d = q_own.shape
    xs = q_own.new_empty(a, B, G, r * C, d)
    xs[a - 1] = q_own[:, :, :, a].reshape(B, G, r * C, d)
    for m in range(a - 1, 0, -1):
        torch.matmul(xs[m], maps[:, :, m], out=xs[m - 1])
    return xs


def own_rows(own: Tensor, mask: Tensor | None, a: int, sub: int) -> list[tuple[slice, Tensor]]:
    """Chunk a's own block by rows of `sub` queries (the unmerged chunks'): each row block's logits against the
    keys it can reach, the chunk's first (s + 1) sub, [B, G, r, sub, (s + 1) sub], padding masked (views of
    `own` without a mask: not to be written). The keys after those are the later sub-chunks' (-inf in `own`)."""
    C = own.shape[-1]
    blocks = []
    for s0 in range(0, C, sub):
        rows, reach = slice(s0, s0 + sub), s0 + sub
        block = own[:, :, :, a, rows, :reach]
        if mask is not None:
            block = block.masked_fill(~mask[..., a * C + s0:a * C + reach, a * C:a * C + reach], float("-inf"))
        blocks.append((rows, block))
    return blocks


def finite(top: Tensor) -> Tensor:
    """A row maximum with -inf (a row that sees no key) replaced by 0, so exp(logits - top) is 0 there, not nan."""
    return top.masked_fill(top == float("-inf"), 0.0)


def normalised(num: Tensor, total: Tensor, top: Tensor) -> tuple[Tensor, Tensor]:
    """Output and log-sum-exp from sum_j p_j v_j, sum_j p_j with p_j = exp(logit_j - top): 0 and -inf for a row
    that sees no key."""
    return num / total.clamp_min(torch.finfo(total.dtype).tiny), top + total.log()


def own_forward(own: Tensor, values: Tensor, mask: Tensor | None, a: int, sub: int) -> tuple[Tensor, Tensor]:
    """Attention of chunk a's queries over its own keys alone: output [B, G, r, C, d] and log-sum-exp
    [B, G, r, C, 1]; values [B, G, C, d] are the chunk's."""
    B, G, r, N, C, _ = own.shape
    out = own.new_empty(B, G, r, C, values.shape[-1])
    lse = own.new_empty(B, G, r, C, 1)
    for rows, block in own_rows(own, mask, a, sub):
        top = finite(block.amax(-1, keepdim=True))
        probs = (block - top).exp_()
        num = probs @ values[:, :, None, :block.shape[-1]]
        out[..., rows, :], lse[..., rows, :] = normalised(num, probs.sum(-1, keepdim=True), top)
    return out, lse


def own_backward(d_own: Tensor, own: Tensor, values: Tensor, d_values: Tensor, mask: Tensor | None, a: int,
                 sub: int, do: Tensor, lse: Tensor, delta: Tensor) -> None:
    """Chunk a's own block's gradients: written into d_own [B, G, r, C, C] (the reachable keys of each row block;
    the rest stays as it is) and added to d_values [B, G, C, d]; do [B, G, r, C, d], lse and delta
    (rowsum(dO * O)) [B, G, r, C, 1] are the chunk's rows'."""
    for rows, block in own_rows(own, mask, a, sub):
        reach = block.shape[-1]
        probs = (block - lse[..., rows, :]).exp_()
        d_values[:, :, :reach] += (probs.transpose(-1, -2) @ do[..., rows, :]).sum(2)
        d_block = do[..., rows, :] @ values[:, :, None, :reach].transpose(-1, -2)
        d_own[..., rows, :reach] = d_block.sub_(delta[..., rows, :]).mul_(probs)


def earlier_mask(mask: Tensor | None, a: int, shape: torch.Size) -> Tensor | None:
    """Which earlier keys chunk a's queries see, [a, B|1, G|1, r|1, C, C] (key chunk first), or None (all)."""
    if mask is None:
        return None
    C = shape[4]
    return mask[..., a * C:(a + 1) * C, :a * C].unflatten(-1, (a, C)).movedim(-2, 0)


def materialised_logits(q_own: Tensor, keys: Tensor, maps: Tensor, mask: Tensor | None,
                        a: int) -> tuple[Tensor, Tensor]:
    """L [a, B, G, r C, C]: chunk a's masked logits against the key chunks before it, and X [a, B, G, r C, d]."""
    B, G, r, N, C, d = q_own.shape
    xs = carried(q_own, maps, a)
    logits = q_own.new_empty(a, B, G, r * C, C)
    torch.matmul(xs, keys[:, :, :a].movedim(2, 0), out=logits)
    hidden = earlier_mask(mask, a, q_own.shape)
    if hidden is not None:
        logits.view(a, B, G, r, C, C).masked_fill_(~hidden, float("-inf"))
    return logits, xs


class FlashBlocks:
    """Chunk a's blocks through the fused CPU kernel: keys and values by chunk, [N, B, G, C, d] contiguous (the
    kernel misreads an operand whose last dimension is not contiguous), and each chunk's additive mask."""

    def __init__(self, keys: Tensor, v: Tensor, mask: Tensor | None, q_shape: torch.Size) -> None:
        B, G, r, N, C, d = q_shape
        self.shape, self.mask = q_shape, mask
        self.keys = keys.permute(2, 0, 1, 4, 3).contiguous()
        self.values = v.unflatten(2, (N, C)).permute(2, 0, 1, 3, 4).contiguous()

    def operands(self, xs: Tensor, a: int) -> tuple[Tensor, Tensor, Tensor]:
        B, G, r, N, C, d = self.shape
        return (xs.view(a * B, G, r * C, d), self.keys[:a].view(a * B, G, C, d),
                self.values[:a].view(a * B, G, C, d))

    def attn_mask(self, a: int, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """The additive mask [a B, G|1, r C, C] of chunk a's blocks and its rows that see no key [a B, G|1, r C]
        (None, None without padding)."""
        seen = earlier_mask(self.mask, a, self.shape)
        if seen is None:
            return None, None
        B, G, r, N, C, d = self.shape
        seen = seen.expand(a, B, seen.shape[2], r, C, C).reshape(a * B, seen.shape[2], r * C, C)
        additive = torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill_(~seen, float("-inf"))
        return additive, ~seen.any(-1)

    def forward(self, xs: Tensor, a: int) -> tuple[Tensor, Tensor]:
        """Each block's output [a, B, G, r C, d] (0 for a row that sees no key) and log-sum-exp [a, B, G, r C, 1]
        (-inf there)."""
        B, G, r, N, C, d = self.shape
        additive, blind = self.attn_mask(a, xs.dtype)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*self.operands(xs, a),
                                                                            attn_mask=additive, scale=1.0)
        if blind is not None:  # the kernel gives such rows a log-sum-exp of 0
            lse = lse.masked_fill(blind, float("-inf"))
        return o.view(a, B, G, r * C, d), lse.view(a, B, G, r * C, 1)

    def backward(self, xs: Tensor, a: int, do: Tensor, out: Tensor, lse: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each block's share of dX [a, B, G, r C, d], of d keys and dv [a, B, G, C, d], given the whole rows'
        gradient do, output and log-sum-exp ([B, G, r C, d | 1])."""
        B, G, r, N, C, d = self.shape
        additive, _ = self.attn_mask(a, xs.dtype)
        rep = lambda t: t.expand(a, *t.shape).reshape(a * B, *t.shape[1:])  # noqa: E731
        dx, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            rep(do), *self.operands(xs, a), rep(out), rep(lse.squeeze(-1)), 0.0, False, attn_mask=additive,
            scale=1.0)
        return dx.view(a, B, G, r * C, d), dk.view(a, B, G, C, d), dv.view(a, B, G, C, d)


class QueryGroups(torch.autograd.Function):
    """Exact PaTH attention from its per-chunk pieces (module docstring); differentiable in q_own, own, keys, maps
    and v."""

    @staticmethod
    def forward(ctx, q_own: Tensor, own: Tensor, keys: Tensor, maps: Tensor, v: Tensor, mask: Tensor | None,
                sub: int, fused: bool) -> Tensor:
        B, G, r, N, C, d = q_own.shape
        out = q_own.new_empty(B, G, r, N * C, d)
        lse = q_own.new_empty(B, G, r, N * C, 1)
        values = v.unflatten(2, (N, C)).movedim(2, 0)  # [N, B, G, C, d]
        flash = FlashBlocks(keys, v, mask, q_own.shape) if fused else None
        for a in range(N):
            o, m = own_forward(own, values[a], mask, a, sub)
            o, m = o.view(B, G, r * C, d)[None], m.view(B, G, r * C, 1)[None]
            if a and flash is not None:
                o_m, lse_m = flash.forward(carried(q_own, maps, a), a)
                o, m = torch.cat((o, o_m)), torch.cat((m, lse_m))
            elif a:
                logits, _ = materialised_logits(q_own, keys, maps, mask, a)
                top = finite(logits.amax((0, -1)).unsqueeze(-1))
                probs = logits.sub_(top).exp_()
                o_m, lse_m = normalised((probs @ values[:a]).sum(0), probs.sum((0, -1)).unsqueeze(-1), top)
                o, m = torch.cat((o, o_m[None])), torch.cat((m, lse_m[None]))
            if a:  # merge the parts by their log-sum-exps
                top = m.amax(0)
                scales = (m - top).exp_()
                total = scales.sum(0)
                o, m = (scales * o).sum(0) / total, top + total.log()
            out[..., a * C:(a + 1) * C, :] = o.view(B, G, r, C, d)
            lse[..., a * C:(a + 1) * C, :] = m.view(B, G, r, C, 1)
        ctx.save_for_backward(q_own, own, keys, maps, v, out, lse, mask)
        ctx.fused, ctx.sub = fused, sub
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q_own, own, keys, maps, v, out, lse, mask = ctx.saved_tensors
        B, G, r, N, C, d = q_own.shape
        flash = FlashBlocks(keys, v, mask, q_own.shape) if ctx.fused else None
        d_q_own, d_maps = torch.zeros_like(q_own), torch.zeros_like(maps)
        d_own = own.new_zeros(N, B, G, r, C, C)  # chunk first: each chunk's gradient written in place
        values = v.unflatten(2, (N, C)).movedim(2, 0)  # [N, B, G, C, d]
        # Gradients of keys and values by chunk, [N, B, G, C, d]
        d_keys = keys.new_zeros(N, B, G, C, d)
        d_values = v.new_zeros(N, B, G, C, d)
        delta = (grad_out * out).sum(-1, keepdim=True)
        for a in range(N):
            rows = slice(a * C, (a + 1) * C)
            do = grad_out[..., rows, :].reshape(B, G, r * C, d)
            row_lse = lse[..., rows, :].reshape(B, G, r * C, 1)
            row_delta = delta[..., rows, :].reshape(B, G, r * C, 1)
            own_backward(d_own[a], own, values[a], d_values[a], mask, a, ctx.sub, do.view(B, G, r, C, d),
                         row_lse.view(B, G, r, C, 1), row_delta.view(B, G, r, C, 1))
            if not a:
                continue
            if flash is not None:
                xs = carried(q_own, maps, a)
                direct, dk, dv = flash.backward(xs, a, do.contiguous(),
                                                out[..., rows, :].reshape(B, G, r * C, d), row_lse)
                d_keys[:a] += dk
                d_values[:a] += dv
            else:
                logits, xs = materialised_logits(q_own, keys, maps, mask, a)
                probs = logits.sub_(row_lse).exp_()
                d_values[:a] += probs.transpose(-1, -2) @ do
                ds = (do @ values[:a].transpose(-1, -2)).sub_(row_delta).mul_(probs)
                del logits, probs
                d_keys[:a] += ds.transpose(-1, -2) @ xs
                direct = ds @ keys[:, :, :a].movedim(2, 0).transpose(-1, -2)
            dx = None  # the gradient of X_{m-1}
            for m in range(a):
                grad_x = direct[m]
                if dx is not None:
                    d_maps[:, :, m] += xs[m].transpose(-1, -2) @ dx
                    grad_x = grad_x + dx @ maps[:, :, m].transpose(-1, -2)
                dx = grad_x
            d_q_own[:, :, :, a] = dx.view(B, G, r, C, d)
        d_keys = d_keys.permute(1, 2, 0, 4, 3)
        dv = d_values.permute(1, 2, 0, 3, 4).reshape(B, G, N * C, d)
        return d_q_own, d_own.permute(1, 2, 3, 0, 4, 5), d_keys, d_maps, dv, None, None, None
