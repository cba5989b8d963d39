"""Which code from outside the package this invocation may import: the security rule for plugin PEs.

A `model.pe` value may name code: a file (`path/to/kerple.py:Kerple`) or a module (`mypkg.kerple:Kerple`). tape
imports such code only when the user named it on the command line of this invocation: as an override
(`model.pe=kerple.py:Kerple`), in a `--pe` list, or with `tape --allow-pe kerple.py ...`. A value read from a file
(a recipe, a run directory's model_config.json, a sweep.json) never allows anything by itself, so opening someone
else's run, checkpoint or recipe runs no code the user did not install or name. (Installed plugins, packages that
declare an entry point in the group `tapecli.pe`, were installed by the user: they need no naming.)

What was named lives in the environment variable TAPE_ALLOW_PE (absolute file paths and module names, separated
by os.pathsep), so the processes this invocation starts (a sweep's workers, `tape bench`'s memory probes, cluster
jobs) inherit it; a user may also set it by hand.

    allow_named(["model.pe=kerple.py:Kerple", "train.lr=1e-3"])   # the plugins these command-line values name
    is_allowed_file(Path("/abs/kerple.py")), is_allowed_module("mypkg.kerple"), allowed_files()

This module imports nothing heavy: the root command calls it before any command runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ALLOW_ENV = "TAPE_ALLOW_PE"
_PE_KEY = re.compile(r"model\.pe|model\.schedule\.kinds\.[^.=]+\.pe")  # the keys whose value is a PE


def split_code(value: str) -> tuple[str, str] | None:
    """(target, class name) of a `target:Class` value, None for a plain name (a built-in or an installed plugin).
    `:key=value` segments are a `--pe` spec's pe_args (`rope:hope=true`, `kerple.py:Kerple:init=0.5`), not code."""
    if not isinstance(value, str):
        return None
    parts = [part for part in value.split(":") if "=" not in part]
    if len(parts) < 2:
        return None
    return ":".join(parts[:-1]), parts[-1]


def is_file_target(target: str) -> bool:
    """A path to a .py file (anything with a slash or ending in .py), as opposed to a dotted module name."""
    return target.endswith(".py") or "/" in target or os.sep in target


def _entries() -> list[str]:
    return [entry for entry in os.environ.get(ALLOW_ENV, "").split(os.pathsep) if entry]


def allow(target: str) -> None:
    """Record that this invocation's command line names `target`: a file path (made absolute) or a module name,
    with or without a `:Class` suffix."""
    code = split_code(target)
    if code is not None:
        target = code[0]
    entry = str(Path(target).expanduser().resolve()) if is_file_target(target) else target
    entries = _entries()
    if entry not in entries:
        os.environ[ALLOW_ENV] = os.pathsep.join([*entries, entry])


def allow_option(target: str, option: str = "--allow-pe") -> None:
    """`tape --allow-pe TARGET`: allow it, after refusing (TapeError) a file path that is missing or a directory."""
    from tapecli.errors import TapeError

    code = split_code(target)
    given = code[0] if code is not None else target
    path = Path(given).expanduser()
    if is_file_target(given) and not path.is_file():
        problem = "is a directory" if path.is_dir() else "does not exist"
        raise TapeError(f"{option} {target}: {path} {problem}; give the plugin's Python file (FILE.py or "
                        "FILE.py:CLASS) or an importable module name")
    allow(target)


def allow_named(values: list[str] | tuple[str, ...]) -> None:
    """Allow the code that command-line values name: `model.pe=...` and `model.schedule.kinds.NAME.pe=...`
    overrides and plain PE values (a `--pe` list's items); every other value is left alone."""
    for value in values:
        key, sep, rest = value.partition("=")
        if sep and ":" not in key:  # an override, key=value
            pe = rest.strip().strip("'\"") if _PE_KEY.fullmatch(key.strip()) else None
        else:  # a --pe item: a name or target:Class, maybe with :key=value pe_args
            pe = value
        if pe is not None and split_code(pe) is not None:
            allow(pe)


def allowed_files() -> list[Path]:
    return [Path(entry) for entry in _entries() if is_file_target(entry)]


def is_allowed_file(path: Path) -> bool:
    return path.expanduser().resolve() in allowed_files()


def is_allowed_module(module: str) -> bool:
    return module in _entries()
