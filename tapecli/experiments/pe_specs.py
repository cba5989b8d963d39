"""What `--pe` names in `tape bench`, `tape demo` and `tape sweep`: a PE, optionally with some of its pe_args.

    rope                              the PE (its pe_args: the recipe's, or the PE's defaults)
    rope:hope=true                    plus pe_args.hope = true
    rope:fope=true:fope_sigma=0.5     several, each key=value (values are read like recipe overrides: YAML)
    kerple.py:Kerple:init=0.5         a plugin PE (tapecli.model.pe.registry.resolve_pe) with its own pe_args

so a PE's options (RoPE's p-RoPE, HoPE, FoPE, ...) are compared like PEs. `label` names the variant in tables
(a file or module plugin by its class: `Kerple:init=0.5`); `dirname` is its directory name in a sweep (`:` becomes
`+`).

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
    text: str  # as written
    pe: str  # the model.pe value
    args: dict[str, Any] = field(default_factory=dict)
    raw: tuple[tuple[str, str], ...] = ()  # (key, value as written)

    @property
    def label(self) -> str:
        from tapecli.model.pe import pe_label

        return ":".join([pe_label(self.pe), *(f"{key}={value}" for key, value in self.raw)])

    @property
    def dirname(self) -> str:
        return self.label.replace(":", "+")

    def overrides(self) -> tuple[str, ...]:
        """The recipe overrides that select this variant (pe_args merged key by key into the recipe's)."""
        return (f"model.pe={self.pe}", *(f"model.pe_args.{key}={value}" for key, value in self.raw))


def parse_pe_spec(text: str, option: str = "--pe") -> PESpec:
    """`name[:key=value...]` -> PESpec; an unknown PE or pe_args key, or a malformed entry, is one line naming
    `option`. (Values are checked by the PE when the model is built.)"""
    from tapecli.model.pe import PE_NAMES, check_pe_args, resolve_pe
    from tapecli.recipe.values import parse_value

    text = text.strip()
    segments = text.split(":")
    names = [s for s in segments if "=" not in s]
    if segments[:len(names)] != names:
        raise TapeError(f"{option} {text!r}: pe_args entries follow the PE (e.g. rope:hope=true)")
    if len(names) > 1 and names[0] in PE_NAMES:  # rope:hope: a built-in's pe_args entry without its value
        raise TapeError(f"{option} {text!r}: each pe_args entry must look like key=value (e.g. rope:hope=true)")
    name, pairs = ":".join(names), segments[len(names):]
    try:
        cls = resolve_pe(name).cls
    except ValueError as e:
        raise TapeError(f"{option}: {str(e).removeprefix('model.pe: ')} (optionally with pe_args, e.g. "
                        "rope:hope=true)") from None
    raw = []
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not key or not value:
            raise TapeError(f"{option} {text!r}: each pe_args entry must look like key=value (e.g. rope:hope=true)")
        raw.append((key, value))
    if len({key for key, _ in raw}) != len(raw):
        raise TapeError(f"{option} {text!r}: a pe_args key is given twice")
    spec = PESpec(text, name, {}, tuple(raw))
    if not _TEXT.match(spec.label):
        raise TapeError(f"{option} {text!r}: a PE spec names a directory (letters, digits, . _ + = : - only)")
    args = {key: parse_value(value) for key, value in raw}
    try:
        args = check_pe_args(cls, name, args)
    except ValueError as e:
        raise TapeError(f"{option} {text!r}: {e}") from None
    return PESpec(text, name, args, tuple(raw))


def parse_pe_specs(texts, option: str = "--pe") -> list[PESpec]:
    """Each text a spec; repeats dropped."""
    return [parse_pe_spec(text, option) for text in dict.fromkeys(t.strip() for t in texts if t.strip())]
