"""The root `tape` command group. Every command runs inside one error boundary (`tapecli.stops.boundary`, entered
here): user mistakes and faults (unreadable or corrupt files, a full disk, out of memory) print one line and exit 2
(bad input) or 1 (failed run); real bugs keep their traceback. `tape --debug ...` or `TAPE_DEBUG=1` shows tracebacks.

`tape --allow-pe FILE|MODULE ...` lets the command import a plugin PE that a run directory, checkpoint or recipe
names (tapecli.trust: the security rule for code from outside installed packages).

Every group (the root and each sub-group: `typer.Typer(cls=Group, ...)`) answers an unknown command with the nearest
real one, in the one-line format: `tape eval pass` -> "no such command 'pass'; did you mean `tape eval passkey`?".

Every command also takes `--threads N` (or TAPE_THREADS=N): the root group adds the option to each command, and it
is applied (`tapecli.threads.configure`) as the command's arguments are parsed, before the command imports torch.
Importing this module sets OpenMP's passive wait policy unless the user set one (`tapecli.threads.prepare`).

The commands live in the sibling modules (train, eval, models, recipes, experiments), which register themselves on
`app`; `tapecli.cli` imports them all. Each command imports its heavy modules lazily so `tape --help` stays fast.
"""

from __future__ import annotations

import difflib

import typer
from typer._click.exceptions import NoSuchOption, UsageError  # Typer >= 0.2x parses with its own vendored Click
from typer.core import TyperGroup

from tapecli import faults, stops, threads, trust
from tapecli.cli.options import integer
from tapecli.cli.pe_names import builtin_pes

threads.prepare()  # before anything imports torch


def _threads_option() -> typer.core.TyperOption:
    """`--threads N` as a parameter of its own, added to every command (it is not an argument of their functions)."""
    holder = typer.Typer()

    @holder.command()
    def _(count: int | None = integer(None, "--threads", min=1, envvar=threads.ENV, show_default=False,
                                      callback=threads.configure,
                                      help="CPU threads for torch (default: every core, waiting passively; 1 on a "
                                           "machine busy with other work).")) -> None:
        return None

    option = typer.main.get_command(holder).params[0]
    option.expose_value = False
    return option


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
    """The root group: every command (and sub-command) runs inside the fault boundary and takes --threads."""

    def __init__(self, **attrs: object) -> None:
        super().__init__(**attrs)
        for command in self._leaves():
            if not any(param.name == "count" for param in command.params):
                command.params.append(_threads_option())

    def _leaves(self) -> list[typer.core.TyperCommand]:
        """Every command below this group, sub-groups' included (not the groups themselves)."""
        found, groups = [], [self]
        while groups:
            for command in groups.pop().commands.values():
                (groups if isinstance(command, TyperGroup) else found).append(command)
        return found

    def make_context(self, info_name: str | None, args: list[str], parent: typer.Context | None = None,
                     **extra: object) -> typer.Context:
        """Parsing the root's own options: a mistake there is one line too, and a command's option given before the
        command (`tape --threads 1 bench`) says where it goes."""
        with stops.boundary():
            try:
                return super().make_context(info_name, args, parent=parent, **extra)
            except NoSuchOption as e:
                if not any(e.option_name in param.opts for command in self._leaves() for param in command.params):
                    raise
                raise UsageError(f"{e.option_name} is an option of the commands: put it after the command's name "
                                 f"(`tape COMMAND {e.option_name} ...`)", e.ctx) from None


    def invoke(self, ctx: typer.Context) -> object:
        with stops.boundary():
            return super().invoke(ctx)


app = typer.Typer(
    name="tape",
    help=f"Train and evaluate positional encodings: {len(builtin_pes())} built in ({', '.join(builtin_pes())}) and "
         "plugins (`tape pe list`).",
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
        trust.allow_option(target)

