"""Stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention: An Efficient Implementation
and In-depth Study", arXiv 2410.17980; official code shawntan/stickbreaking-attention): no softmax and no position
encoding. Walking back from query i, each earlier key j breaks off the share b_ij = sigmoid(q_i . k_j / sqrt(d))
of what is left of a unit stick:

  A_ij = b_ij prod_{j < k < i} (1 - b_ik),      out_i = sum_{j < i} A_ij v_j,      rem_i = prod_{j < i} (1 - b_ij)

so the nearest key with a high logit wins (a recency bias that replaces the position encoding), and the weights
of a query sum to 1 - rem_i <= 1. As in the official code (`attend_current=False`, its default) a query does not
see its own key: the first token's output is zero. The leftover stick rem_i is dropped, as in the official
model's layer (and fla's `StickBreakingAttention`, which returns `o` and discards `rem`); `remainder: true` adds
rem_i v_i instead, the variant of the official repository's tests and benchmarks (`o = o + rem[..., None] * v`).
The computation and its backward: `tapecli.model.pe.stickbreaking_ops` (products of (1 - b) by a cumulative
product along each chunk's keys, nearest first, in fp32 at least even under bf16 autocast; a hand-written
backward that rebuilds each chunk).

Padding: a padded key breaks nothing (its factor is 1) and gets no weight, so every real token computes what its
row computes alone. The KV cache holds keys and values only (a query's weights depend on its own q and the keys).

On CUDA, `kernel: auto` uses fla's fused `parallel_stickbreaking_attn` (flash-linear-attention, an optional extra,
imported behind a guard) for half precision without a past or padding, when that fla version's kernel also
trains (checked once); otherwise the chunked torch path runs there too. No FlexAttention form exists: a weight
depends on every nearer logit of its row, not on its own score alone.

pe_args:
  attend_current  false (official default) | true: query i also sees key i (j <= i, and k <= i in the product)
  remainder       false (default: rem_i dropped) | true: out_i += rem_i v_i
  kernel          auto (default) | torch (always the chunked torch path)
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    forced_path,
    optional_kernel,
    rows_for,
)
from tapecli.model.pe.stickbreaking_ops import stick_breaking, stick_breaking_dense

KERNELS = ("auto", "torch")


def fla_stick_breaking():
    """fla's fused kernel, or None when flash-linear-attention is not installed (or broken, or too old)."""
    return optional_kernel("fla.ops.stickbreaking_attn", "parallel_stickbreaking_attn")


@functools.cache
def fla_trains(device: torch.device) -> bool:
    """Whether this fla version's kernel has a backward (some releases ship the forward only) and takes
    `attend_current`: one tiny forward + backward on the device."""
    q = torch.randn(1, 32, 1, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
    try:
        out, _ = fla_stick_breaking()(q=q, k=q, v=q, scale=0.25, attend_current=False)
        out.float().sum().backward()
    except Exception:  # noqa: BLE001
        return False
    return q.grad is not None


class StickBreakingLayer(LayerPE):
    """No parameters: the layer only replaces softmax attention."""

    def __init__(self, attend_current: bool, remainder: bool, kernel: str) -> None:
        super().__init__()
        self.attend_current, self.remainder, self.kernel = attend_current, remainder, kernel

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=self.attend, plan=self.plan)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool,
             padded: bool = False, device: torch.device | None = None) -> str:
        """fla (CUDA, half precision, no past, no padding, fla installed; training only where its kernel has a
        backward); stickbreaking-recompute (gradients: chunks rebuilt by the hand-written backward);
        stickbreaking-chunked (no gradients, or a KV cache); stickbreaking-dense (attention.forced("dense"): every
        weight materialised, autograd; the reference)."""
        if forced_path() == "dense":
            return "stickbreaking-dense"
        if (device_type == "cuda" and self.kernel == "auto" and dtype in (torch.float16, torch.bfloat16)
                and not cached and not padded and fla_stick_breaking() is not None
                and (not grad or fla_trains(device or torch.device("cuda")))):
            return "fla"
        return "stickbreaking-recompute" if grad and not cached else "stickbreaking-chunked"

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None) -> Tensor:
        """Queries q [B, H, Tq, d] over keys and values k, v [B, G, Tk, d] (past + current); `key_mask` hides
        padding (`mask`, the dense form of the same, is not used)."""
        H, G, Tq, d = q.shape[1], k.shape[1], q.shape[2], q.shape[-1]
        scale = d ** -0.5
        path = self.plan(q.device.type, q.dtype, Tq, k.shape[2], torch.is_grad_enabled(), k.shape[2] > Tq,
                         key_mask is not None, q.device)
        if path == "fla":
            out, rem = fla_stick_breaking()(q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2),
                                            scale=scale, attend_current=self.attend_current)
            out = out.transpose(1, 2)
            if self.remainder:
                out = out + rem.transpose(1, 2)[..., None].to(out.dtype) * v.repeat_interleave(H // G, 1)
            return out
        compute = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            q, k_in, v_in = q.to(compute), k.to(compute), v.to(compute)
            if path == "stickbreaking-dense":
                out = stick_breaking_dense(q, k_in, v_in, key_mask, scale, self.attend_current, self.remainder)
            else:
                rows = rows_for(q.shape[0], H, k.shape[2], Tq)
                out = stick_breaking(q, k_in, v_in, key_mask, scale, self.attend_current, self.remainder, rows)
        return out.to(v.dtype)


class StickBreaking(PositionalEncoding):
    claims = ("shift-invariance",)  # positions enter as differences only, or not at all
    attention_options: frozenset[str] = frozenset()  # its own attention has no temperature or window (yet)

    def __init__(self, config, *, attend_current: bool = False, remainder: bool = False,
                 kernel: str = "auto") -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'stickbreaking' breaks the stick from each query backwards; it needs "
                             "causal attention")
        if kernel not in KERNELS:
            raise ValueError(f"model.pe_args.kernel: unknown value {kernel!r}; allowed: {', '.join(KERNELS)}")
        self.layer_args = dict(attend_current=attend_current, remainder=remainder, kernel=kernel)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return StickBreakingLayer(**self.layer_args)
