"""The root `tape` command group. Every command runs inside one error boundary (`tapecli.faults.boundary`, entered
here): user mistakes and faults (unreadable or corrupt files, a full disk, out of memory) print one line and exit 2
(bad input) or 1 (failed run); real bugs keep their traceback. `tape --debug ...` or `TAPE_DEBUG=1` shows tracebacks.

Every group (the root and each sub-group: `typer.Typer(cls=Group, ...)`) answers an unknown command with the nearest
real one, in the one-line format: `tape eval pass` -> "no such command 'pass'; did you mean `tape eval passkey`?".

The commands live in the sibling modules (train, eval, models, recipes, experiments), which register themselves on
`app`; `tapecli.cli` imports them all. Each command imports its heavy modules lazily so `tape --help` stays fast.
"""

from __future__ import annotations

import difflib

import typer
from typer._click.exceptions import UsageError  # Typer >= 0.2x parses with its own vendored Click
from typer.core import TyperGroup

from tapecli import faults


class Group(TyperGroup):
    """A command group whose unknown sub-command is one line naming the nearest real command."""

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None and not ctx.resilient_parsing:
            nearest = self.nearest(name)
            hint = f"; did you mean `{ctx.command_path} {nearest}`?" if nearest else ""
            raise UsageError(f"no such command '{name}'{hint}", ctx)
        return super().resolve_command(ctx, args)

    def nearest(self, name: str) -> str | None:
        """The command (or `group command`, e.g. `eval addition` for `addition`) nearest to `name`, if any is near:
        the same name one level down, the one command it starts, else the closest spelling."""
        candidates: dict[str, str] = {}
        for command_name in self.commands:
            candidates[command_name] = command_name
        for command_name, command in self.commands.items():
            if isinstance(command, TyperGroup):
                for sub in command.commands:
                    candidates.setdefault(sub, f"{command_name} {sub}")
        if name in candidates:
            return candidates[name]
        started = [c for c in candidates if c.startswith(name)]
        if len(started) == 1:
            return candidates[started[0]]
        close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
        return candidates[close[0]] if close else None


class _Guarded(Group):
    """The root group: every command (and sub-command) runs inside the fault boundary."""

    def invoke(self, ctx: typer.Context) -> object:
        with faults.boundary():
            return super().invoke(ctx)


app = typer.Typer(
    name="tape",
    help="Train and evaluate positional encodings (RoPE, ALiBi, FIRE, xPos, NoPE, RandPE, T5 bias, TAPE, CoPE, PaTH).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Guarded,
)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="TAPE_DEBUG",
                                     help="Show the full traceback of any error (also: TAPE_DEBUG=1).")) -> None:
    faults.set_debug(debug)
