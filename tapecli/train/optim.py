"""AdamW with the usual decay/no-decay split, and the warm-up + decay learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

SCHEDULES = ("linear", "cosine", "constant")


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]
                    ) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; weight decay only on matrices (>= 2-D), not on norms, biases or
    per-channel PE scales."""
    decay, no_decay = [], []
    for param in model.parameters():  # parameters() yields a tied weight once
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int, schedule: str) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up to `lr` over `warmup_steps` steps, then
    `schedule` from `lr` down to `min_lr` at the last step (`constant` stays at `lr`)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    decay_steps = max(1, max_steps - 1 - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, *, lr: float, min_lr: float, warmup_steps: int,
                    max_steps: int, schedule: str) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following `lr_at`; its state (the step count) goes into every checkpoint. With lr 0 (a run that
    must leave the weights as they are) every step's rate is 0."""
    def factor(step: int) -> float:
        if lr == 0:
            return 0.0
        return lr_at(step, lr=lr, min_lr=min_lr, warmup_steps=warmup_steps, max_steps=max_steps,
                     schedule=schedule) / lr

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
