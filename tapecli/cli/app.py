"""The root `tape` command group. Every command runs inside one error boundary (`tapecli.faults.boundary`, entered
here): user mistakes and faults (unreadable or corrupt files, a full disk, out of memory) print one line and exit 2
(bad input) or 1 (failed run); real bugs keep their traceback. `tape --debug ...` or `TAPE_DEBUG=1` shows tracebacks.

`tape --allow-pe FILE|MODULE ...` lets the command import a plugin PE that a run directory, checkpoint or recipe
names (tapecli.trust: the security rule for code from outside installed packages).

The commands live in the sibling modules (train, eval, models, recipes, experiments), which register themselves on
`app`; `tapecli.cli` imports them all. Each command imports its heavy modules lazily so `tape --help` stays fast.
"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from tapecli import faults, trust


class _Guarded(TyperGroup):
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
                                     help="Show the full traceback of any error (also: TAPE_DEBUG=1)."),
          allow_pe: list[str] | None = typer.Option(
              None, "--allow-pe", metavar="FILE|MODULE", show_default=False,
              help="Let this command import a plugin PE's file or module that a run, checkpoint or recipe names "
                   "(repeatable; also TAPE_ALLOW_PE). tape imports code from outside installed packages only "
                   "when the command line names it.")) -> None:
    faults.set_debug(debug)
    for target in allow_pe or []:
        trust.allow(target)

