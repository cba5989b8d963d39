"""Shared by the CLI tests: what a one-line error looks like, and the Click command tree of a Typer app built once
(`command_tree`; tests/conftest.py makes CliRunner use it)."""

from __future__ import annotations

from typing import Any

import typer

_BUILT: dict[int, tuple[Any, int, Any]] = {}  # id(app) -> (the app, kept alive so its id stays its own, size, tree)


def command_tree(app: typer.Typer) -> Any:
    """`typer.main.get_command(app)`, built once per app (Typer builds it anew at each call: ~0.1 s for tape's
    commands). The tree holds no state between invocations (each gets its own Click context); an app that gained a
    command since is built again."""
    size = len(app.registered_commands) + len(app.registered_groups)
    if _BUILT.get(id(app), (None, None))[:2] != (app, size):
        _BUILT[id(app)] = (app, size, typer.main.get_command(app))
    return _BUILT[id(app)][2]


def one_line_error(result, code: int, *fragments: str) -> str:
    """The command failed with `code` and printed exactly one `error:` line holding every fragment."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception), result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
