"""Tolerances that follow the dtype and the magnitudes, for a result compared with the same value computed another
way (another summation order, a merged weight, another CPU's kernels): such results differ by rounding, and rounding
scales with the size of the terms summed and the dtype's epsilon, not with a fixed 1e-6 (an fp32 LoRA forward
differed from its dense product by 1.43e-6 on another x86 CPU).

    assert_close_to_rounding(layer(x), x.double() @ dense.double().T, scale=(x.abs() @ dense.abs().T).max())

`scale` is the size of what was summed (for a sum whose terms may cancel, the sum of their magnitudes), by default
the largest |expected|; the tolerance is `ulps` units of `actual`'s dtype at that scale. A real error (a wrong
factor, a wrong mask) is many orders larger.
"""

from __future__ import annotations

import torch


def rounding_tolerance(dtype: torch.dtype, scale: float, ulps: int = 64) -> float:
    return ulps * torch.finfo(dtype).eps * float(scale)


def assert_close_to_rounding(actual: torch.Tensor, expected: torch.Tensor, *, scale: float | torch.Tensor | None = None,
                             ulps: int = 64, msg: str | None = None) -> None:
    """actual == expected up to `ulps` roundings of actual's dtype at `scale`, compared in fp64."""
    scale = float(expected.detach().abs().max() if scale is None else scale)
    atol = rounding_tolerance(actual.dtype, max(scale, torch.finfo(actual.dtype).tiny), ulps)
    torch.testing.assert_close(actual.detach().double(), expected.detach().double(), rtol=0, atol=atol, msg=msg)
