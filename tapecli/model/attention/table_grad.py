"""A learned distance table's gradient beside a fused kernel that reads the table detached (FlexAttention's path).

    out = TableGrad.apply(out, lse, q, k, v, values, sinks, scale, window)     # the same out; values get their grad

FlexAttention sums the gradient of a tensor its score_mod reads with one atomic addition per score into that
tensor. For T5's table every pair farther apart than its last bucket adds into one entry per head: T^2 / 2
additions to a few addresses, which serialise. So a table that needs a gradient enters the kernel detached, and
this function, the identity on the attention output, adds the table's gradient in the backward: exact, from the
band of distances below the table's last entry only (`chunked_grads.band_grad`, the chunked path's: dS summed per
distance, the last entry minus their total, since each row of dS sums to zero; with sinks, minus the sink's column
too). q, k, v and the output's other inputs get their gradients through the kernel's own backward, untouched.

Positions must be consecutive (each key's position its index plus a constant: no padding), as for the chunked
path's table (`chunked.consecutive`); `out` and `lse` are the attention's output and log-sum-exp after any sinks
(`sinks.rescale`). The band is scored in slices of queries of at most BAND_ELEMENTS scores each.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tapecli.model.attention import chunked_grads as grads
from tapecli.model.attention.sinks import sink_grad

BAND_ELEMENTS = 1 << 24  # band scores per slice of queries (B x H x rows x keys per block): 64 MiB in fp32


class TableGrad(torch.autograd.Function):
    """forward(out, lse, q, k, v, values, sinks, scale, window) -> out; backward: grad_out to `out`, the table's
    gradient to `values` [H, m], nothing to the rest (they reach q, k, v and sinks through `out`'s own graph)."""

    @staticmethod
    def forward(ctx, out: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor, values: Tensor,
                sinks: Tensor | None, scale: float, window: int | None) -> Tensor:
        ctx.save_for_backward(out, lse, q, k, v, values, sinks)
        ctx.scale, ctx.window = scale, window
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        out, lse, q, k, v, values, sinks = ctx.saved_tensors
        d_values = None
        if ctx.needs_input_grad[5]:
            d_values = torch.zeros_like(values)
            compute = torch.promote_types(q.dtype, torch.float32)
            band = grads.band_mask(values, grads.BAND_ROWS, ctx.window, compute)
            d_sink = None if sinks is None else sink_grad(grad_out, out, lse, sinks)
            B, H, Tq, _ = q.shape
            keys = grads.BAND_ROWS + values.shape[-1] - 2
            rows = max(grads.BAND_ROWS, BAND_ELEMENTS // (B * H * keys) // grads.BAND_ROWS * grads.BAND_ROWS)
            past = k.shape[2] - Tq
            for i0 in range(0, Tq, rows):
                grads.band_grad(d_values, q, k, v, grad_out, out, lse, band, past, i0, min(i0 + rows, Tq),
                                ctx.scale, d_sink if i0 == 0 else None)
        return grad_out, None, None, None, None, d_values, None, None, None
