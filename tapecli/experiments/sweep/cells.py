"""The cells of a sweep: one run directory per (PE, seed, grid values), what state each is in, and running one.

A cell `DIR/<pe>-seed<k>[-<key>=<value>...]` (<pe>: the PE's name; a plugin file's class name) is trained exactly as

    tape pretrain --recipe R --out DIR/<cell> <overrides> model.pe=<pe> train.seed=<k> [<key>=<value> ...]

would train it (the same resolved recipe, `--resume auto`), then evaluated by the evaluation its data kind names
(`evaluations.evaluation_for`). A --pe spec with pe_args (`tapecli.experiments.pe_specs`, e.g. rope:hope=true)
adds model.pe_args.hope=true after model.pe, and its cell directory spells `:` as `+` (DIR/rope+hope=true-seed0).
A cell is finished when its newest checkpoint is at train.max_steps and that checkpoint's results.json exists; a
partly trained cell continues from its newest checkpoint, exactly.

A cell directory that already holds a recipe.yaml must have been trained with the recipe the sweep asks for
(keys the engine resolves at training, null or auto in the sweep's recipe, are not compared); otherwise the sweep
stops before anything runs. While a process runs a cell it holds a lock on DIR/.locks/<cell>.lock, so a second
sweep over the same directory skips that cell instead of training it twice.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError
from tapecli.experiments.sweep.evaluations import Evaluation, evaluation_for

if TYPE_CHECKING:
    from tapecli.recipe import Recipe

_SET_BY_SWEEP = {"model.pe": "--pe", "train.seed": "--seeds"}
_VALUE = re.compile(r"^[A-Za-z0-9_.+-]+$")  # grid values go into directory names


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep command asks for (everything but how it runs)."""

    recipe: str
    overrides: tuple[str, ...]  # the user's, applied to every cell
    pes: tuple[str, ...]
    seeds: tuple[int, ...]
    grid: tuple[tuple[str, tuple[str, ...]], ...] = ()  # ((key, (value, ...)), ...)
    out: Path = Path("runs/sweep")

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "overrides": list(self.overrides), "pes": list(self.pes),
                "seeds": list(self.seeds), "grid": [[key, list(values)] for key, values in self.grid]}

    @classmethod
    def from_json(cls, data: dict[str, Any], out: Path) -> SweepSpec:
        return cls(data["recipe"], tuple(data["overrides"]), tuple(data["pes"]), tuple(data["seeds"]),
                   tuple((key, tuple(values)) for key, values in data["grid"]), out)


@dataclass(frozen=True)
class Cell:
    """One run of the sweep. Picklable: executors ship it to worker processes and cluster jobs."""

    name: str
    pe: str
    seed: int
    grid: tuple[tuple[str, str], ...]  # this cell's (key, value) pairs
    recipe: str
    overrides: tuple[str, ...]  # the user's, then model.pe, train.seed, then the grid's
    run_dir: Path
    command: tuple[str, ...]  # the sweep command, recorded in run.json: it resumes the whole sweep
    pe_name: str = ""  # the PE's short name (a plugin file's class name), in cell names and tables; "" = pe

    @property
    def label(self) -> str:
        """The cell's group in tables: its PE and grid values (the seed is what is aggregated over)."""
        return " ".join([self.pe_name or self.pe, *(f"{key}={value}" for key, value in self.grid)])

    def load_recipe(self) -> Recipe:
        from tapecli.recipe import load_recipe

        return load_recipe(self.recipe, list(self.overrides))

    def pretrain_command(self) -> str:
        return shlex.join(["tape", "pretrain", "--recipe", self.recipe, "--out", str(self.run_dir), *self.overrides])


def parse_list(text: str, option: str) -> tuple[str, ...]:
    """`"rope, tape"` -> ("rope", "tape"); one line naming the option when empty, with an empty entry or a repeat
    (`tapecli.commas`)."""
    from tapecli import commas

    return tuple(commas.split(text, option))


def parse_grid(entries: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`["train.lr=1e-3,2e-3"]` -> (("train.lr", ("1e-3", "2e-3")),). A key given by two --grid options, or a value
    given twice (also spelled differently: 1e-3 and 0.001, two cells training the same run), is refused naming both."""
    from tapecli.recipe.values import parse_value

    grid, where = [], {}
    for number, entry in enumerate(entries, 1):
        key, sep, values = entry.partition("=")
        if not sep or "." not in key:
            raise TapeError(f"--grid {entry!r} must look like section.key=value1,value2 (e.g. train.lr=1e-3,3e-4)")
        if key in _SET_BY_SWEEP:
            raise TapeError(f"--grid {key}: use {_SET_BY_SWEEP[key]} for it")
        if key in where:
            raise TapeError(f"--grid {key}: given twice (--grid number {where[key]} and {number}); give every value "
                            f"in one --grid {key}=A,B")
        where[key] = number
        from tapecli import commas

        parsed = commas.split(values, f"--grid {key}")
        seen: dict[str, str] = {}
        for value in parsed:
            same = repr(parse_value(value, f"--grid {key}"))
            if same in seen:
                raise TapeError(f"--grid {key}: {seen[same]} and {value} are the same value (two cells would train "
                                "the same run); give each value once")
            seen[same] = value
        bad = [v for v in parsed if not _VALUE.match(v)]
        if bad:
            raise TapeError(f"--grid {key}: value {bad[0]!r} cannot name a directory (letters, digits, . _ + - only)")
        grid.append((key, tuple(parsed)))
    return tuple(grid)


def plan(spec: SweepSpec, command: list[str]) -> list[Cell]:
    """The cells in the order they run: seed by seed, so each seed's comparison is complete before the next."""
    from tapecli.experiments.pe_specs import parse_pe_specs

    pes = parse_pe_specs(spec.pes)
    names = [pe.dirname for pe in pes]
    if len(set(names)) != len(names):
        raise TapeError(f"--pe: two PEs would share a cell name ({', '.join(spec.pes)}); give each its own name")
    grid_keys = {key for key, _ in spec.grid}
    for override in spec.overrides:
        key = override.partition("=")[0].strip()
        if key in _SET_BY_SWEEP:
            raise TapeError(f"{override}: the sweep sets {key} for each cell; use {_SET_BY_SWEEP[key]}")
        if key in grid_keys:
            raise TapeError(f"{override}: {key} is also a --grid key; give it in one place")
    cells = []
    for seed in spec.seeds:
        for values in itertools.product(*(vals for _, vals in spec.grid)):
            grid = tuple(zip((key for key, _ in spec.grid), values, strict=True))
            for pe in pes:
                name = "-".join([pe.dirname, f"seed{seed}", *(f"{key}={value}" for key, value in grid)])
                overrides = (*spec.overrides, *pe.overrides(), f"train.seed={seed}", *(f"{k}={v}" for k, v in grid))
                cells.append(Cell(name, pe.text, seed, grid, spec.recipe, overrides, spec.out / name, tuple(command),
                                  pe.label))
    return cells


def check_cell_recipe(cell: Cell, wanted: Recipe) -> None:
    """A cell directory trained before must have been trained with the recipe the sweep asks for."""
    from tapecli.recipe import load_recipe
    from tapecli.store.run import RECIPE

    path = cell.run_dir / RECIPE
    if not path.is_file():
        return
    have = load_recipe(str(path)).to_dict()
    for section, body in wanted.to_dict().items():
        for key, value in body.items():
            if value is None or value == "auto":  # resolved by the engine at training (vocab size, precision)
                continue
            if have[section][key] != value:
                raise TapeError(f"{cell.run_dir} was trained with {section}.{key}={have[section][key]!r}, this "
                                f"sweep asks for {value!r}; use another --out, or the recipe and overrides it was "
                                "trained with")


@dataclass(frozen=True)
class CellState:
    step: int  # of the newest checkpoint (0: none)
    max_steps: int
    evaluated: bool

    @property
    def finished(self) -> bool:
        return self.evaluated and self.step >= self.max_steps

    @property
    def todo(self) -> str:
        """finished, to evaluate, to continue or new."""
        if self.finished:
            return "finished"
        if self.step >= self.max_steps:
            return "to evaluate"
        return "to continue" if self.step else "new"

    def describe(self) -> str:
        return f"to continue from step {self.step} of {self.max_steps}" if self.todo == "to continue" else self.todo


def cell_state(cell: Cell, recipe: Recipe, evaluation: Evaluation) -> CellState:
    from tapecli.store.checkpoint import checkpoint_step, list_checkpoints
    from tapecli.store.run import CHECKPOINTS

    checkpoints = list_checkpoints(cell.run_dir / CHECKPOINTS)
    if not checkpoints:
        return CellState(0, recipe.train.max_steps, False)
    newest = checkpoints[-1]
    return CellState(checkpoint_step(newest), recipe.train.max_steps, evaluation.results_file(newest).is_file())


@contextmanager
def cell_lock(cell: Cell) -> Iterator[None]:
    """Hold DIR/.locks/<cell>.lock while running the cell; a cell another process is running is a TapeError.
    The lock goes with the process (flock), so a killed sweep leaves nothing to clean up."""
    import fcntl

    locks = cell.run_dir.parent / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{cell.name}.lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TapeError(f"{cell.name}: another process is running this cell; let it finish (or stop it), "
                            "then run the sweep again") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_cell(cell: Cell) -> None:
    """Train the cell (or continue it, `--resume auto`) and evaluate its final checkpoint, skipping what is done.
    Under torchrun-style variables (a multi-GPU cluster job) every rank trains and rank 0 alone evaluates."""
    from tapecli.train.engine import pretrain

    recipe = cell.load_recipe()
    evaluation = evaluation_for(recipe.data.kind)
    rank = int(os.environ.get("RANK", "0"))
    with cell_lock(cell) if rank == 0 else nullcontext():
        state = cell_state(cell, recipe, evaluation)
        if state.finished:
            return
        if state.step < state.max_steps:
            pretrain(recipe, cell.run_dir, resume="auto", command=list(cell.command))
        if rank == 0:
            evaluation.run(cell.run_dir)
