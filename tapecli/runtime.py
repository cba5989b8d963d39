"""Where and how a command computes: the one rule for device, weights dtype, training precision and seeding.

    device = resolve_device("auto")                 # the GPU when there is one, else the CPU
    name, dtype = resolve_dtype("auto", device)     # weights: bf16 on a GPU, fp32 on the CPU
    precision = resolve_precision("auto", device)   # training autocast: bf16 on a GPU that supports it, else fp32
    training_dtype(precision, on_base=True)          # what a training run opens its weights in
    seed_everything(0); state = rng_state(); set_rng_state(state)
    startup_line(device)                            # a command's first line: "cpu, 2 threads (...), torch 2.x"

Training picks its device per torchrun rank (tapecli.train.distributed) and then follows the same rules.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from tapecli.errors import TapeError

DTYPE_NAMES = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


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


def startup_line(device: torch.device | str) -> str:
    """What a command computing with torch prints first: the device, the threads (tapecli.threads) and torch."""
    from tapecli import threads

    return f"{device}, {threads.describe()}, torch {torch.__version__}"


def resolve_dtype(name: str, device: torch.device | str) -> tuple[str, torch.dtype]:
    """(name, torch dtype) of the weights; `auto` is bf16 on a GPU and fp32 on the CPU."""
    if name == "auto":
        name = "bf16" if torch.device(device).type == "cuda" else "fp32"
    if name not in _DTYPES:
        raise TapeError(f"--dtype: unknown dtype {name!r}; allowed: {', '.join(DTYPE_NAMES)}")
    return name, _DTYPES[name]


def resolve_precision(precision: str, device: torch.device) -> str:
    """Training precision: `auto` means bf16 autocast where the hardware supports it (CUDA with bf16), fp32
    otherwise (the CPU); an explicit choice is kept."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def training_dtype(precision: str, on_base: bool) -> str:
    """The dtype a training run opens its weights in, at a resolved `precision`: fp32 (the weights are the
    optimizer's master copy), except a frozen Hugging Face base (`on_base`) under bf16 precision, held in bf16:
    autocast computes in bf16 anyway, and it halves a 7B base's memory. The parameters that train over such a base
    are cast back to fp32 once frozen (tapecli.train.build)."""
    return "bf16" if on_base and precision == "bf16" else "fp32"


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every random generator's state, as plain tensors and numbers (so `torch.load(weights_only=True)` reads it)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
