"""The public PE API (`tapecli.pe`): a version a plugin can check, a surface no larger than the built-ins need, and
the one helper that imports an optional kernel."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import tapecli.model.pe as builtins
import tapecli.pe as api
from tapecli.pe import optional_kernel

EXTRAS = {"API_VERSION", "CLAIMS", "default_positions"}  # the API beyond what the built-ins import (its docstring)


def test_api_version_is_major_minor() -> None:
    major, minor = api.API_VERSION
    assert isinstance(major, int) and isinstance(minor, int) and major >= 1


def _names_the_built_ins_import() -> set[str]:
    """Every name a built-in PE file imports from the API's home (base.py, and rope.py for RoPE, RotaryLayer)."""
    homes = {"tapecli.model.pe.base", "tapecli.model.pe.rope"}
    names = set()
    for path in Path(builtins.__file__).parent.glob("*.py"):
        if path.name in {"__init__.py", "registry.py", "plugins.py", "base.py"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in homes:
                names |= {alias.name for alias in node.names}
    return names


def test_the_api_is_what_the_built_ins_use_and_no_more() -> None:
    used = _names_the_built_ins_import()
    assert used <= set(api.__all__), f"built-ins use names outside tapecli.pe: {sorted(used - set(api.__all__))}"
    assert set(api.__all__) <= used | EXTRAS, f"not needed by any PE: {sorted(set(api.__all__) - used - EXTRAS)}"
    assert all(hasattr(api, name) for name in api.__all__)


def test_names_taken_out_of_the_api_stay_importable() -> None:
    """Plugins written before API_VERSION may import these; they are no longer part of the API."""
    from tapecli.pe import Need, pe_arguments  # noqa: F401


def test_optional_kernel_returns_the_function_or_none(tmp_path: Path, monkeypatch) -> None:
    assert optional_kernel("math", "sqrt") is math.sqrt
    assert optional_kernel("no_such_kernel_package.ops", "attn") is None
    assert optional_kernel("math", "no_such_function") is None
    (tmp_path / "broken_kernel_build.py").write_text("raise RuntimeError('CUDA symbol not found')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert optional_kernel("broken_kernel_build", "attn") is None  # a broken build raises more than ImportError
