"""What `--pe` names in `tape bench`, `tape demo` and `tape sweep`: a PE, optionally with some of its pe_args.

    rope                              the PE (its pe_args: the recipe's, or the PE's defaults)
    rope:hope=true                    plus pe_args.hope = true
    rope:fope=true:fope_sigma=0.5     several, each key=value (values are read like recipe overrides: YAML)

so a PE's options (RoPE's p-RoPE, HoPE, FoPE, ...) are compared like PEs. The spec text is the variant's label in
tables; `dirname` is its directory name in a sweep (`:` becomes `+`).

    spec = parse_pe_spec("rope:hope=true")  # PESpec(text, pe="rope", args={"hope": True}); TapeError naming --pe
    spec.overrides()                        # ("model.pe=rope", "model.pe_args.hope=true"): recipe overrides
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tapecli.errors import TapeError

_TEXT = re.compile(r"^[A-Za-z0-9_.+=:-]+$")  # a spec names a directory, so: letters, digits and . _ + = : -


@dataclass(frozen=True)
class PESpec:
    text: str
    pe: str
    args: dict[str, Any] = field(default_factory=dict)
    raw: tuple[tuple[str, str], ...] = ()  # (key, value as written)

    @property
    def dirname(self) -> str:
        return self.text.replace(":", "+")

    def overrides(self) -> tuple[str, ...]:
        """The recipe overrides that select this variant (pe_args merged key by key into the recipe's)."""
        return (f"model.pe={self.pe}", *(f"model.pe_args.{key}={value}" for key, value in self.raw))


def parse_pe_spec(text: str, option: str = "--pe") -> PESpec:
    """`name[:key=value...]` -> PESpec; an unknown PE or pe_args key, or a malformed entry, is one line naming
    `option`. (Values are checked by the PE when the model is built.)"""
    from tapecli.model import PE_NAMES
    from tapecli.model.pe import PE_REGISTRY, check_pe_args
    from tapecli.recipe.values import parse_value

    text = text.strip()
    name, *pairs = text.split(":")
    if name not in PE_NAMES:
        raise TapeError(f"{option}: unknown positional encoding {name!r}; allowed: {', '.join(PE_NAMES)} "
                        "(optionally with pe_args, e.g. rope:hope=true)")
    if not _TEXT.match(text):
        raise TapeError(f"{option} {text!r}: a PE spec names a directory (letters, digits, . _ + = : - only)")
    raw = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            raise TapeError(f"{option} {text!r}: each pe_args entry must look like key=value (e.g. rope:hope=true)")
        raw.append((key, value))
    if len({key for key, _ in raw}) != len(raw):
        raise TapeError(f"{option} {text!r}: a pe_args key is given twice")
    args = {key: parse_value(value) for key, value in raw}
    try:
        args = check_pe_args(PE_REGISTRY[name], name, args)
    except ValueError as e:
        raise TapeError(f"{option} {text!r}: {e}") from None
    return PESpec(text, name, args, tuple(raw))


def parse_pe_specs(texts, option: str = "--pe") -> list[PESpec]:
    """Each text a spec; repeats dropped."""
    return [parse_pe_spec(text, option) for text in dict.fromkeys(t.strip() for t in texts if t.strip())]
