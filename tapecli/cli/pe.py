"""`tape pe ...`: working on positional encodings: `check` (the conformance kit, tapecli.pe.check),
`new` (a skeleton that passes it, tapecli.pe.templates) and `list` (built-ins and installed plugins)."""

from __future__ import annotations

from pathlib import Path

import typer

from tapecli import trust
from tapecli.cli.app import Group
from tapecli.cli.options import numbers
from tapecli.errors import TapeError

pe_app = typer.Typer(cls=Group, name="pe", help="Write, check and list positional encodings (built-in and plugins).",
                     no_args_is_help=True)

_PE_HELP = ("A PE: a built-in or installed plugin name (rope, kerple), FILE.py:CLASS, FILE.py (its one PE class) or "
            "MODULE:CLASS.")


def named_pe(value: str) -> str:
    """The model.pe value a command-line PE names (allowed to be imported: the user named it); FILE.py alone
    stands for the one PositionalEncoding class it defines."""
    trust.allow_named([value])
    if trust.split_code(value) is not None or not value.endswith(".py"):
        return value
    from tapecli.model.pe.plugins import pe_classes

    trust.allow(value)
    try:
        classes = pe_classes(Path(value))
    except ValueError as e:
        raise TapeError(str(e).removeprefix("model.pe: ")) from None
    if len(classes) != 1:
        found = ", ".join(classes) or "none"
        raise TapeError(f"{value} defines {len(classes)} PositionalEncoding classes ({found}); name one as "
                        f"{value}:CLASS")
    return f"{value}:{classes[0]}"


def check(
    pe: str = typer.Argument(..., help=_PE_HELP, show_default=False),
    pe_arg: list[str] | None = typer.Option(None, "--pe-arg", help="One of the PE's pe_args as key=value "
                                            "(repeatable).", show_default=False),
    device: str = typer.Option("auto", help="cpu, cuda or auto (the GPU when there is one)."),
    compile: bool = typer.Option(False, "--compile", help="Also check that a torch.compile'd training step equals "
                                                          "the eager one (inductor: slow on a CPU)."),
    speed: bool = typer.Option(True, help="After the checks, time a training step and measure its peak memory vs "
                                          "RoPE (tape bench's table)."),
    speed_len: str = typer.Option("1024", help="--speed: sequence lengths, comma-separated (one table each)."),
    sinks: bool = typer.Option(False, "--sinks", help="Check the PE with learned attention sinks in every layer "
                                                      "(model.sinks): the models of every check have them."),
) -> None:
    """Check that a PE is correct: causal, the same with and without the KV cache (chunked prefill too), the same on its linear-memory attention path as with every score materialised (outputs and gradients), unchanged by padding and batching, saved and reopened intact, finite in fp32 and bf16, with gradients reaching its parameters; torch.compile with --compile; and the claims it declares (shift-invariance, rotation-equivariance). Then its speed and memory vs RoPE.

    Tiny models (2 layers, dim 64): exact checks run in fp64 on the CPU, in fp32 on a GPU. One line per check: its name, ok or FAILED, and the number behind it. Exits with 1 when a check fails.

    Example: tape pe check kerple.py:Kerple --no-speed ; tape pe check alibi --device cuda --compile ; tape pe check alibi --sinks --no-speed
    """
    from rich.console import Console

    from tapecli.eval.common import parse_pe_args
    from tapecli.experiments.bench import pe_speed_rows
    from tapecli.model.pe import resolve_pe
    from tapecli.pe.check import run_pe_check
    from tapecli.runtime import resolve_device

    value = named_pe(pe)
    lengths = numbers(speed_len, "--speed-len", min=1) if speed else []
    pe_args, console = parse_pe_args(pe_arg), Console()
    outcomes = run_pe_check(value, pe_args, device=device, compile=compile, console=console,
                            keys={"sinks": True} if sinks else None)
    if lengths:
        pe_speed_rows(value, resolve_pe(value).name, pe_args, str(resolve_device(device)), lengths, console)
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


def new(
    name: str = typer.Argument(..., help="The PE's name: letters, digits and _ (my_bias writes my_bias.py, class "
                               "MyBias).", show_default=False),
    kind: str = typer.Option("bias", "--kind", help="bias (a learned logit bias of the distance) or rotary (a "
                                                    "rotation of queries and keys, RoPE from scratch)."),
    out: Path | None = typer.Option(None, "--out", help="The file to write (default: NAME.py here).",
                                    show_default=False),
) -> None:
    """Write a commented skeleton of a PE that `tape pe check` passes as written, to edit into your own.

    Example: tape pe new my_bias ; tape pe check my_bias.py --no-speed
    """
    import re

    from tapecli.files import write_atomic
    from tapecli.pe.templates import TEMPLATES, template_source
    from tapecli.store.run import check_output

    if kind not in TEMPLATES:
        raise TapeError(f"--kind: expected one of {', '.join(TEMPLATES)}, got {kind!r}")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise TapeError(f"NAME {name!r}: use letters, digits and _ (it names a file and a class), e.g. my_bias")
    out = out or Path(f"{name}.py")
    if out.exists():
        raise TapeError(f"--out {out} already exists; choose another name or --out")
    check_output(out, file=True)  # a read-only place or a file in the way: one line naming --out, not the temporary name
    class_name = "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)
    write_atomic(out, template_source(kind, class_name))
    print(f"wrote {out}: class {class_name}, a {kind} PE. Check it: tape pe check {out}:{class_name} --no-speed ; "
          f"train with it: model.pe={out}:{class_name}")


def list_pes() -> None:
    """List the PEs model.pe accepts: the built-ins and the installed plugins, each with its arguments (model.pe_args) and their defaults, and where it comes from.

    Files and modules (model.pe=FILE.py:CLASS or MODULE:CLASS) are not listed: they are named, not installed.
    """
    import inspect

    from rich.console import Console
    from rich.table import Table

    from tapecli.model.pe.base import pe_arguments
    from tapecli.model.pe.registry import available_pes

    table = Table(title="Positional encodings (model.pe)", show_lines=False)
    for column in ("model.pe", "model.pe_args (defaults)", "from", "what it is"):
        table.add_column(column, overflow="fold")
    for name, resolved, problem in available_pes():
        if resolved is None:
            table.add_row(name, "-", "installed plugin", f"[red]{problem}[/]")
            continue
        args = ", ".join(f"{key}={p.default!r}" for key, p in pe_arguments(resolved.cls).items()) or "-"
        doc = (inspect.getdoc(inspect.getmodule(resolved.cls)) or inspect.getdoc(resolved.cls) or "").strip()
        where = "built in" if resolved.record is None else f"{resolved.record['package']} {resolved.record['version']}"
        table.add_row(name, args, where, (doc.splitlines() or [""])[0] + (f" {problem}" if problem else ""))
    Console().print(table)


pe_app.command("check")(check)
pe_app.command("new")(new)
pe_app.command("list")(list_pes)
