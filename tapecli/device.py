"""Picking the device a command runs on (training picks its own per torchrun rank: tapecli.train.distributed)."""

from __future__ import annotations

import torch

from tapecli.errors import TapeError


def resolve_device(name: str) -> torch.device:
    """`auto` = the GPU when there is one, else the CPU; `cpu` and `cuda[:N]` as given, if available."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TapeError(f"--device {name}: no CUDA device is available")
    try:
        return torch.device(name)
    except RuntimeError:
        raise TapeError(f"--device: unknown device {name!r}; use auto, cpu or cuda") from None
