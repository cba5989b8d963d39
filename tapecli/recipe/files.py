"""Where recipe YAML comes from: a file path, or a recipe shipped with tape.

The shipped recipes live in `recipes/` at the top of the repository; a built wheel carries a copy as package data
`tapecli/recipe/shipped/` (setup.py). The packaged copy wins when there is one (an installed wheel), else the
checkout's `recipes/` (a source checkout or an editable install)."""

from __future__ import annotations

import difflib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from tapecli.errors import TapeError
from tapecli.faults import reading


def shipped_dir() -> Traversable:
    """The folder of shipped recipes: the wheel's package data, else the checkout's `recipes/`."""
    packaged = resources.files("tapecli.recipe") / "shipped"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "recipes"


def _shipped() -> dict[str, Traversable]:
    return {p.name[: -len(".yaml")]: p for p in shipped_dir().iterdir() if p.name.endswith(".yaml")}


def list_recipes() -> list[tuple[str, str]]:
    """(name, one-line description) of every shipped recipe, sorted by name; the description is the file's
    first comment line."""
    out = []
    for name, path in sorted(_shipped().items()):
        first = next((ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("#")), "#")
        out.append((name, first.lstrip("#").strip()))
    return out


def locate(recipe: str) -> tuple[str, str]:
    """(origin for messages, YAML text) of a recipe path or shipped name; an existing file wins over a name."""
    path = Path(recipe).expanduser()
    if path.is_file():
        with reading(path):
            return str(path), path.read_text(encoding="utf-8")
    shipped = _shipped()
    name = recipe[: -len(".yaml")] if recipe.endswith(".yaml") else recipe
    if path.parent.name == "recipes" and path.name.endswith(".yaml"):
        name = path.name[: -len(".yaml")]  # `recipes/c4.yaml` outside a checkout: the shipped copy
    if name in shipped:
        return f"{name}.yaml", shipped[name].read_text(encoding="utf-8")
    close = difflib.get_close_matches(name, list(shipped), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise TapeError(f"recipe '{recipe}' not found{hint}; shipped recipes: {', '.join(sorted(shipped))}")


def recipe_text(recipe: str) -> str:
    """The YAML text, comments included, of a shipped recipe name or a recipe path (for `tape recipes show`)."""
    return locate(recipe)[1]
