"""Which parameters train: `train.freeze` / `train.unfreeze` globs, or the plan of a context extension
(`tapecli.train.extend`).

    apply_freeze(model, ["*"], ["*.pe.*"])   # freeze everything, then unfreeze the PE
    apply_plan(model, plan)                  # an extension: its method's trainable set, S²-Attn for longlora

Parameters the model declares inert (they never get a gradient) always stay frozen, which DDP requires. A pattern
that matches no parameter is a TapeError naming the recipe key.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

from tapecli.errors import TapeError

if TYPE_CHECKING:
    from torch import nn

    from tapecli.train.extend import Plan


def apply_freeze(model: nn.Module, freeze: list[str], unfreeze: list[str], keys: tuple[str, str] = (
        "train.freeze", "train.unfreeze")) -> None:
    """Freeze parameters whose name matches a `freeze` glob, then unfreeze those matching an `unfreeze` glob.
    Parameters the model declares inert (they never get a gradient) stay frozen, which DDP requires. A pattern
    that matches no parameter is a TapeError naming it (`keys` name the recipe keys in the message)."""
    inert = getattr(model, "inert_parameters", set())
    names = [name for name, _ in model.named_parameters()]
    for key, patterns in zip(keys, (freeze, unfreeze), strict=True):
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                raise TapeError(f"{key}: pattern {pattern!r} matches no parameter (names look like {names[-1]!r})")
    for name, param in model.named_parameters():
        frozen = any(fnmatch.fnmatchcase(name, p) for p in freeze)
        if frozen and any(fnmatch.fnmatchcase(name, p) for p in unfreeze):
            frozen = False
        param.requires_grad_(not frozen and name not in inert)


def apply_plan(model: nn.Module, plan: Plan) -> None:
    """Freeze all but the plan's trainable set (a pattern matching nothing is a TapeError), then switch longlora's
    attention to S²-Attn (training only)."""
    from tapecli.model.extend.s2attn import enable_s2_attn

    apply_freeze(model, ["*"], plan.unfreeze, keys=("extend.method", "extend.trainable"))
    for name, param in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, p) for p in plan.freeze_after):
            param.requires_grad_(False)
    if plan.s2_fraction is not None:
        enable_s2_attn(model, plan.s2_fraction)
