"""Recipe values: one parser for values written as text, type-checking against the section dataclasses, and
`key=value` overrides.

`parse_value` reads every value written on a command line: recipe overrides (`model.pe_args.a=inf`) and
`--pe-arg a=inf` alike. Type-checking and overrides work on a *tree*, `{section: {key: value}}`, holding only the
keys a recipe file or an override wrote, so the caller knows which keys the user set. A `Layout` says which
sections and keys a recipe of one data kind may hold (tapecli.recipe.schema builds it). Every mistake is a TapeError
naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from tapecli import yamlsafe
from tapecli.errors import TapeError

Tree = dict[str, dict[str, Any]]
INT_MAX = 2**63 - 1  # an integer value must fit in 64 bits (torch, numpy and the file formats store it so)


def fail(key: str, problem: str) -> typing.NoReturn:
    raise TapeError(f"{key}: {problem}")


@functools.cache
def field_types(section_cls: type) -> dict[str, Any]:
    """{key: annotation} of a section dataclass's fields, in their order."""
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


@dataclass(frozen=True)
class Layout:
    """What a recipe of data kind `kind` may hold: each section's dataclass (None for a section the kind does not
    have), and `kind_keys`, the dotted `data`/`eval` keys of every kind (one of another kind is no typo)."""

    kind: str
    sections: dict[str, type | None]
    kind_keys: frozenset[str]

    def keys(self, section: str) -> dict[str, Any]:
        """{key: annotation} of `section`; {} for a section the kind does not have."""
        cls = self.sections[section]
        return field_types(cls) if cls is not None else {}


KIND_SECTIONS = ("data", "eval")  # the sections whose keys the data kind decides


def _unknown_key(key: str, layout: Layout, where: str = "") -> TapeError:
    section, _, name = key.partition(".")
    if section in KIND_SECTIONS and name:
        cls, kind = layout.sections[section], layout.kind
        # A did-you-mean only for a typo of one of the kind's keys, not for another kind's key (`blanks` for text).
        close = [] if key in layout.kind_keys else difflib.get_close_matches(name, list(layout.keys(section)), n=1,
                                                                              cutoff=0.8)
        if close:
            hint = f" (did you mean '{section}.{close[0]}'?)"
        elif cls is None:
            hint = f" (kind {kind} has no {section} keys)"
        elif name == "tokenizer" and isinstance(getattr(cls, "tokenizer", None), property):
            hint = f" (kind {kind} brings its own tokenizer)"
        else:
            hint = ""
        return TapeError(f"{where}{key} is not a key of kind {kind}{hint}")
    keys = [f"{s}.{k}" for s in layout.sections for k in layout.keys(s)]
    close = difflib.get_close_matches(key, keys + list(layout.sections), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return TapeError(f"{where}unknown key '{key}'{hint}")


def _describe(tp: Any) -> str:
    """Human wording of a type for error messages."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is list:
        return f"a list of {_describe(args[0])}s"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            type(None): "null"}[tp]


# Numbers that YAML 1.1 (PyYAML) reads as strings: `1e6`, `1.5e3`, `inf`, `-Infinity`, `nan`.
_NUMBER_STRING = re.compile(r"[-+]?((\d+\.?\d*|\.\d+)[eE][-+]?\d+|inf|infinity|nan)", re.IGNORECASE)


def parse_value(raw: str, origin: str = "value") -> Any:
    """A value written as text -- a recipe override's or a `--pe-arg`'s -- the one way: read as YAML (`null`,
    `true`, `[0.9, 0.95]`, `{a: 1}`) by `tapecli.yamlsafe` (a duplicated key, an alias bomb or deep nesting is a
    TapeError naming `origin`), then every string that spells a number YAML 1.1 leaves as text (`1e6`, `inf`,
    `nan`) made a float, at any depth. Text that is not YAML (a glob such as `*.pe.*`) stays as written."""
    try:
        value = yamlsafe.load(raw, origin)
    except yamlsafe.InvalidYaml:
        return raw
    return _numbers(value)


def _numbers(value: Any) -> Any:
    """`value` with number-spelling strings made floats, inside lists and mappings too."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and _NUMBER_STRING.fullmatch(value.strip()):
        return float(value)
    return value


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Return `value` converted to type `tp`, or raise TapeError naming `key`.

    YAML (1.1, as PyYAML reads it) parses `1e-4` as a string, so numeric strings are accepted for numbers;
    integers accept whole floats (`1e4`) but never fractions, and `true`/`false` are never numbers.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except TapeError as err:
                errors.append(err)
        if len(errors) == 1 and "out of range" in str(errors[0]):
            raise errors[0]  # the one type it could be says what is wrong with it
        fail(key, f"expected {_describe(tp)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            fail(key, f"expected one of {', '.join(str(a) for a in args)}; got {value!r}")
        return value
    if origin is list:
        if isinstance(value, str) and _accepts_str(args[0]):
            return [coerce(value, args[0], key)]  # `train.freeze=*` means ["*"]
        if not isinstance(value, (list, tuple)):
            fail(key, f"expected {_describe(tp)}, got {value!r}")
        return [coerce(v, args[0], key) for v in value]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            fail(key, f"expected a mapping with string keys, got {value!r}")
        return _numbers(value)
    if tp is bool:
        if not isinstance(value, bool):
            fail(key, f"expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            fail(key, f"expected a string, got {value!r}")
        return value
    if tp in (int, float) and not isinstance(value, bool):
        number = value
        if isinstance(value, str):
            try:
                number = float(value.replace("_", ""))
            except ValueError:
                number = None
        if isinstance(number, (int, float)) and math.isfinite(number):
            if tp is float:
                return float(number)
            if number == int(number):
                if abs(number) > INT_MAX:
                    fail(key, f"{value!r} is out of range (at most {INT_MAX:,} in size)")
                return int(number)
    fail(key, f"expected {_describe(tp)}, got {value!r}")


def check_tree(data: Any, origin: str, layout: Layout) -> Tree:
    """Type-check a parsed recipe file: known sections holding known keys with values of the right type."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TapeError(f"{origin}: expected a mapping of sections ({', '.join(layout.sections)})")
    tree: Tree = {}
    for section, body in data.items():
        if section not in layout.sections:
            raise _unknown_key(str(section), layout, f"{origin}: ")
        if body is not None and not isinstance(body, dict):
            raise TapeError(f"{origin}: section '{section}' must be a mapping of keys")
        hints = layout.keys(section)
        tree[section] = {}
        for key, value in (body or {}).items():
            if key not in hints:
                raise _unknown_key(f"{section}.{key}", layout, f"{origin}: ")
            try:
                tree[section][key] = coerce(value, hints[key], f"{section}.{key}")
            except TapeError as err:
                raise TapeError(f"{origin}: {err}") from None
    return tree


def split_override(override: str) -> tuple[list[str], str]:
    """`model.pe_args.a=1` -> (["model", "pe_args", "a"], "1"); raises TapeError unless it looks like key=value."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TapeError(f"override '{override}' must look like key=value (e.g. train.max_steps=200)")
    return key.split("."), raw


def apply_override(tree: Tree, override: str, layout: Layout) -> None:
    """Apply one `section.key=value` (or `model.pe_args.a.b=value`) override to a type-checked recipe tree."""
    parts, raw = split_override(override)
    key, section = ".".join(parts), parts[0]
    if section not in layout.sections:
        raise _unknown_key(key, layout)
    if len(parts) == 1:
        raise TapeError(f"'{key}' is a section; set one of its keys, e.g. {key}.<key>=value")
    hints = layout.keys(section)
    name = parts[1]
    if name not in hints or (len(parts) > 2 and typing.get_origin(hints[name]) is not dict):
        raise _unknown_key(key, layout)
    value = parse_value(raw, key)
    body = tree.setdefault(section, {})
    if len(parts) == 2:
        if isinstance(value, (int, float, bool)) and _accepts_str(hints[name]):
            value = raw.strip()  # keep `data.source=2024` or `data.tokenizer=1.0` as written
        body[name] = coerce(value, hints[name], key)
        return
    # A key inside the free-form mapping (model.pe_args.scaling.factor=4): create missing levels.
    if not isinstance(body.get(name), dict):
        body[name] = {}
    node = body[name]
    for part in parts[2:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _accepts_str(tp: Any) -> bool:
    args = typing.get_args(tp)
    return tp is str or (str in args) or (typing.get_origin(tp) is Literal and any(isinstance(a, str) for a in args))
