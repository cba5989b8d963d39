"""A rough estimate of the memory one device needs for a training run, printed before training starts.

    estimate_memory(model, recipe, world_size, sharded) -> {"weights": bytes, "gradients": ..., "optimizer": ...,
                                                           "activations": ..., "total": ...}

Weights at their dtypes; gradients as large as the trainable parameters; AdamW keeps two states per trainable
parameter; FSDP divides all three by the number of processes, DDP does not. Activations per micro-batch of B
sequences of T tokens, at 2 bytes (bf16/fp16) or 4 (fp32): each layer keeps about (8 dim + 4 ffn_dim) values per
token (attention projections and output, norms, residuals, the SwiGLU branch; attention itself runs in a fused
kernel without a T x T matrix), TAPE adds its fp32 state, and the fp32 logits count twice (with their gradient).
With activation checkpointing only each layer's input is kept, plus one layer recomputed at a time. It ignores
allocator fragmentation and temporary buffers, so treat it as a lower bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from tapecli.recipe import Recipe


def estimate_memory(model: nn.Module, recipe: Recipe, world_size: int, sharded: bool) -> dict[str, int]:
    c, t = model.config, recipe.train
    seen: set[int] = set()
    weights = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        weights += p.numel() * p.element_size()
        trainable += p.numel() * p.element_size() if p.requires_grad else 0
    shards = world_size if sharded else 1
    act_bytes = 4 if t.precision == "fp32" else 2
    tokens = t.micro_batch_size * recipe.data.seq_len
    per_layer = tokens * (8 * c.dim + 4 * c.ffn_dim) * act_bytes
    if c.pe == "tape":
        per_layer += tokens * c.n_heads * c.head_dim * 4 * 2  # E before and after each update, fp32
    if t.activation_checkpointing:
        layers = c.n_layers * tokens * c.dim * act_bytes + per_layer
    else:
        layers = c.n_layers * per_layer
    activations = layers + 2 * tokens * c.vocab_size * 4
    estimate = {"weights": weights // shards, "gradients": trainable // shards, "optimizer": 2 * trainable // shards,
                "activations": activations}
    estimate["total"] = sum(estimate.values())
    return estimate


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def describe(estimate: dict[str, int]) -> str:
    parts = ", ".join(f"{key} {_size(estimate[key])}" for key in ("weights", "gradients", "optimizer", "activations"))
    return f"memory per device (estimate): {parts}; total {_size(estimate['total'])}"
