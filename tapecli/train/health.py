"""Checks that a checkpoint about to be written is worth keeping: every weight finite.

A loss can stay finite for the step that first pushes a weight to inf; without this check that checkpoint would be
saved and then called "the last good one" when the next loss comes out nan.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tapecli.errors import LossNotFinite


def nonfinite_tensors(model: nn.Module) -> list[str]:
    """Names of the parameters and buffers holding a nan or inf."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    return [name for name, t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite_weights(model: nn.Module, step: int, last_good: Path | None) -> None:
    """Raise LossNotFinite, naming the last good checkpoint, instead of saving nan/inf weights at `step`."""
    bad = nonfinite_tensors(model)
    if bad:
        where = last_good if last_good is not None else "none (no checkpoint saved yet)"
        raise LossNotFinite(f"after step {step} {len(bad)} weight tensors hold nan or inf (e.g. {bad[0]}); "
                            f"not saved; the last good checkpoint is {where}")
