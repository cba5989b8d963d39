"""Typed command-line options with their ranges: every number a command takes is checked where it is parsed.

    steps: int = integer(3, "--steps", min=1, help="Timed steps.")            # an int and its range
    threshold: float = number(85.6, "--threshold", min=0, max=100, help="...")  # a finite float in its range
    lengths = numbers("1024,2048", "--lengths", min=1)                        # comma-separated, each checked

`integer` makes the range part of the declaration (`min` is required; values must fit 64 bits), so an
out-of-range value (`--prompt-len 0`, `--new-tokens -2`) is Click's one-line usage error naming the option, not a
traceback deep inside the command. `number` also refuses nan and inf (`--threshold nan`), which no range catches.
`numbers` parses a comma-separated option the same way, as a TapeError naming the option (its entries split by
`tapecli.commas`: no empty or repeated entry). tests/cli/test_cli.py
checks that every int and float option of every command has its range and finiteness declared this way.
"""

from __future__ import annotations

import math
from typing import Any

import typer

from tapecli import commas
from tapecli.errors import TapeError

INT_MAX = 2**63 - 1  # the largest integer torch, numpy and the file formats hold


def finite(low: float | None = None, high: float | None = None) -> Any:
    """A float option's callback: nan and inf are refused (also inside a list value), then values outside
    [low, high]. (Typer's own range check would call nan "not <= 100".)"""

    def check(value: Any) -> Any:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None:
                continue
            if not math.isfinite(item):
                raise typer.BadParameter(f"expected a finite number, got {item}")
            if (low is not None and item < low) or (high is not None and item > high):
                bounds = " and ".join(f"{word} {bound:g}" for word, bound in (("at least", low), ("at most", high))
                                      if bound is not None)
                raise typer.BadParameter(f"must be {bounds}, got {item:g}")
        return value

    check.checks_finite = True  # what tests/cli/test_cli.py looks for on every float option
    return check


def integer(default: Any, *names: str, min: int, max: int | None = None, help: str,
            callback: Any = None, **extra: Any) -> Any:
    """An int option whose values must lie in [min, max] (max: what 64 bits hold, unless given); `callback` runs on
    the checked value."""

    def check(value: Any) -> Any:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is not None and abs(item) > INT_MAX:
                raise typer.BadParameter(f"{item} does not fit in 64 bits")
        return value if callback is None else callback(value)

    return typer.Option(default, *names, min=min, max=max, callback=check, help=help, **extra)


def number(default: Any, *names: str, min: float | None = None, max: float | None = None, help: str,
           **extra: Any) -> Any:
    """A float option: finite, and in [min, max] where they are given."""
    return typer.Option(default, *names, callback=finite(min, max), help=help, **extra)


def numbers(text: str, option: str, kind: type = int, min: float | None = None, max: float | None = None) -> list:
    """`"1024,2048"` -> [1024, 2048]: every part a finite `kind` in [min, max]; one line naming the option else."""
    values = []
    for part in commas.split(text, option):
        try:
            value = kind(part)
        except ValueError:
            raise TapeError(f"{option}: expected comma-separated {kind.__name__}s, got {text!r}") from None
        high = (INT_MAX if kind is int else math.inf) if max is None else max
        if not math.isfinite(value):
            raise TapeError(f"{option}: {part} is not a finite number")
        if min is not None and value < min:
            raise TapeError(f"{option}: {part} must be at least {min:g}")
        if value > high:
            raise TapeError(f"{option}: {part} must be at most {high:,}")
        if value in values:  # the same number spelled twice (1024 and 1k, 5 and 5.0)
            raise TapeError(f"{option} {text!r}: {part} is given twice; give each value once")
        values.append(value)
    return values
