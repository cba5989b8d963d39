"""`tape sweep`: plan the cells, check them, run what is not finished, aggregate (and `--report`: aggregate only).

DIR/sweep.json records the recipe, the overrides, the PEs, seeds and grid of the last sweep command over DIR; a
later command over the same DIR must use the same recipe and overrides (it may add or drop PEs, seeds or grid
values: finished cells are reused), and `tape sweep --report DIR` aggregates the cells it lists.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tapecli.errors import RunFailed, TapeError
from tapecli.experiments.sweep.cells import Cell, SweepSpec, cell_state, check_cell_recipe, plan
from tapecli.experiments.sweep.evaluations import Evaluation, evaluation_for
from tapecli.experiments.sweep.report import aggregate, table
from tapecli.files import write_json
from tapecli.store.claim import claim

SWEEP_FILE = "sweep.json"


def _prepare(spec: SweepSpec, command: list[str]) -> tuple[list[Cell], dict[str, Any], Evaluation]:
    """The cells, each one's resolved recipe (every override checked before anything runs) and the evaluation."""
    cells = plan(spec, command)
    recipes = {cell.name: cell.load_recipe() for cell in cells}
    kinds = sorted({recipe.data.kind for recipe in recipes.values()})
    if len(kinds) > 1:
        raise TapeError(f"--grid: the cells would train on different data kinds ({', '.join(kinds)}); one sweep "
                        "compares cells under one evaluation")
    for cell in cells:
        check_cell_recipe(cell, recipes[cell.name])
    evaluation = evaluation_for(kinds[0])
    if evaluation.name == "validation":  # judged by the validation loss: every cell needs a validation split
        for cell in cells:
            reason = recipes[cell.name].data.no_validation()
            if reason:
                raise TapeError(f"cell {cell.name}: no validation split, and a sweep over data.kind '{kinds[0]}' "
                                f"reports the validation perplexity: {reason}")
    return cells, recipes, evaluation


def _check_out(spec: SweepSpec) -> None:
    """DIR is new or a sweep's: checked before it is claimed, so another command's output gets no claim file."""
    from tapecli.store.run import check_output, output_kind

    check_output(spec.out)
    kind = output_kind(spec.out)
    if kind not in (None, "a sweep directory"):
        raise TapeError(f"--out {spec.out} is {kind}; a sweep writes its cells into a directory of its own: pass a "
                        "new --out (or a directory this sweep wrote)")


def _claim(spec: SweepSpec) -> None:
    """Write DIR/sweep.json; a DIR swept before must have been swept with the same recipe and overrides."""
    from tapecli.faults import reading

    path = spec.out / SWEEP_FILE
    if path.is_file():
        with reading(path):
            before = json.loads(path.read_text(encoding="utf-8"))
        if [before["recipe"], before["overrides"]] != [spec.recipe, list(spec.overrides)]:
            raise TapeError(f"{spec.out} holds a sweep of --recipe {before['recipe']} "
                            f"{' '.join(before['overrides'])}".rstrip() + "; use the same recipe and overrides to "
                            "extend it, or another --out")
    spec.out.mkdir(parents=True, exist_ok=True)
    write_json(path, spec.to_json())


def run_sweep(spec: SweepSpec, executor: Any, command: list[str], dry_run: bool = False, title: str | None = None,
              caption: str | None = None) -> dict[str, Any] | None:
    """Run every cell of `spec` that is not finished with `executor`, then aggregate and print the table.
    `dry_run`: print the cells, their state and their equivalent commands, and run nothing."""
    from rich.console import Console

    from tapecli.experiments.pe_specs import parse_pe_specs

    parse_pe_specs(spec.pes)  # each --pe names a PE, maybe with pe_args (before any recipe is loaded with it)
    cells, recipes, evaluation = _prepare(spec, command)
    states = {cell.name: cell_state(cell, recipes[cell.name], evaluation) for cell in cells}
    console = Console()
    if dry_run:
        console.print(f"{len(cells)} cells in {spec.out}, each trained and evaluated (evaluation: {evaluation.name}) "
                      "as these commands would:", markup=False, highlight=False)
        for cell in cells:
            console.print(f"{cell.name} ({states[cell.name].describe()})", style="bold", markup=False,
                          highlight=False)
            for line in (cell.pretrain_command(), evaluation.command.format(run=cell.run_dir) if evaluation.command
                         else f"(evaluation: {evaluation.name}, read from {cell.run_dir}/metrics.jsonl)"):
                console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
        return None
    _check_out(spec)
    with claim(spec.out):  # one sweep per DIR; each cell's run directory is claimed by its own training
        _claim(spec)
        todo = [cell for cell in cells if not states[cell.name].finished]
        counts = Counter(state.todo for state in states.values())
        console.print(f"{len(cells)} cells in {spec.out} (evaluation: {evaluation.name}): "
                      + ", ".join(f"{n} {key}" for key, n in counts.items()), markup=False, highlight=False)
        failures = executor.run(todo)
        results = aggregate(spec, cells, recipes, evaluation)
    console.print(table(results, evaluation, title, caption))
    console.print(f"wrote {spec.out / 'results.json'} and {spec.out / evaluation.chart}"
                  + (f" and {spec.out / 'heatmaps.png'}" if evaluation.heatmaps else "")
                  + f"; each cell's run and evaluation under {spec.out}/<cell>/", markup=False, highlight=False)
    if failures:
        raise RunFailed(f"{len(failures)} of {len(cells)} cells failed: "
                        + "; ".join(f"{name}: {why}" for name, why in failures.items())
                        + "; run the same command again to retry them")
    return results


def report_sweep(out: Path) -> dict[str, Any]:
    """`tape sweep --report DIR`: aggregate the cells of DIR/sweep.json that are finished; print the table."""
    from rich.console import Console

    from tapecli.faults import reading

    path = Path(out) / SWEEP_FILE
    if not path.is_file():
        raise TapeError(f"{path} not found: {out} is not a sweep directory (tape sweep ... --out {out} makes one)")
    with reading(path):
        spec = SweepSpec.from_json(json.loads(path.read_text(encoding="utf-8")), Path(out))
    cells, recipes, evaluation = _prepare(spec, [])
    with claim(out):  # it rewrites DIR/results.json and the charts
        results = aggregate(spec, cells, recipes, evaluation)
    Console().print(table(results, evaluation))
    return results
