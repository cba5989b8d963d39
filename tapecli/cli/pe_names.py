"""The built-in PE names for help texts and option defaults, without importing torch.

    builtin_pes()   # ("nope", "rope", ...): the keys of tapecli.model.pe.registry.BUILTINS, in its order

The registry is the one list of built-ins, but importing it imports every PE and torch, which `tape --help` must not
(it stays fast). So this reads the registry's source and takes the keys of its `BUILTINS = {...}` literal; help texts
and defaults built from it cannot go stale. tests/docs/test_docs_truth.py checks it equals `BUILTINS`.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REGISTRY = Path(__file__).resolve().parents[1] / "model" / "pe" / "registry.py"


@cache
def builtin_pes() -> tuple[str, ...]:
    """The built-in PE names, in the registry's order."""
    tree = ast.parse(REGISTRY.read_text(encoding="utf-8"), str(REGISTRY))
    for node in tree.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        named = any(isinstance(target, ast.Name) and target.id == "BUILTINS" for target in targets)
        if named and isinstance(getattr(node, "value", None), ast.Dict):
            return tuple(key.value for key in node.value.keys if isinstance(key, ast.Constant))
    raise RuntimeError(f"{REGISTRY}: no `BUILTINS = {{...}}` literal to read the built-in PE names from")
