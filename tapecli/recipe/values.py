"""Recipe values: type-check parsed YAML against the section dataclasses, and apply `key=value` overrides.

Both work on a *tree*, `{section: {key: value}}`, holding only the keys a recipe file or an override wrote, so the
caller knows which keys the user set. `sections` maps each section name to its dataclass (tapecli.recipe owns them).
Every mistake is a TapeError naming the key.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import types
import typing
from typing import Any, Literal

import yaml

from tapecli.errors import TapeError

Tree = dict[str, dict[str, Any]]


def fail(key: str, problem: str) -> typing.NoReturn:
    raise TapeError(f"{key}: {problem}")


@functools.cache
def field_types(section_cls: type) -> dict[str, Any]:
    return typing.get_type_hints(section_cls)


def _unknown_key(key: str, sections: dict[str, type], where: str = "") -> TapeError:
    keys = [f"{s}.{k}" for s, cls in sections.items() for k in field_types(cls)]
    close = difflib.get_close_matches(key, keys + list(sections), n=1)
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


_EXPONENT_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _exponent_floats(value: Any) -> Any:
    """Turn `1e6`-style strings inside free-form mappings into floats (PyYAML reads them as strings)."""
    if isinstance(value, dict):
        return {k: _exponent_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exponent_floats(v) for v in value]
    if isinstance(value, str) and _EXPONENT_FLOAT.fullmatch(value):
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
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except TapeError:
                pass
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
        return _exponent_floats(value)
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
                return int(number)
    fail(key, f"expected {_describe(tp)}, got {value!r}")


def check_tree(data: Any, origin: str, sections: dict[str, type]) -> Tree:
    """Type-check a parsed recipe file: known sections holding known keys with values of the right type."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TapeError(f"{origin}: expected a mapping of sections ({', '.join(sections)})")
    tree: Tree = {}
    for section, body in data.items():
        if section not in sections:
            raise _unknown_key(str(section), sections, f"{origin}: ")
        if body is not None and not isinstance(body, dict):
            raise TapeError(f"{origin}: section '{section}' must be a mapping of keys")
        hints = field_types(sections[section])
        tree[section] = {}
        for key, value in (body or {}).items():
            if key not in hints:
                raise _unknown_key(f"{section}.{key}", sections, f"{origin}: ")
            try:
                tree[section][key] = coerce(value, hints[key], f"{section}.{key}")
            except TapeError as err:
                raise TapeError(f"{origin}: {err}") from None
    return tree


def apply_override(tree: Tree, override: str, sections: dict[str, type]) -> None:
    """Apply one `section.key=value` (or `model.pe_args.a.b=value`) override to a type-checked recipe tree."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise TapeError(f"override '{override}' must look like key=value (e.g. train.max_steps=200)")
    parts = key.split(".")
    section = parts[0]
    if section not in sections:
        raise _unknown_key(key, sections)
    if len(parts) == 1:
        raise TapeError(f"'{key}' is a section; set one of its keys, e.g. {key}.<key>=value")
    hints = field_types(sections[section])
    name = parts[1]
    if name not in hints or (len(parts) > 2 and typing.get_origin(hints[name]) is not dict):
        raise _unknown_key(key, sections)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw  # e.g. a glob like `*.pe.*`, which YAML reads as an alias
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
    node[parts[-1]] = _exponent_floats(value)


def _accepts_str(tp: Any) -> bool:
    args = typing.get_args(tp)
    return tp is str or (str in args) or (typing.get_origin(tp) is Literal and any(isinstance(a, str) for a in args))
