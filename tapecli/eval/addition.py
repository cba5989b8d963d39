"""Addition length generalisation: exact-match accuracy over a grid of operand lengths (McLeish et al. protocol).

For every pair of operand lengths (i, j) with 1 <= i, j <= max_len, a fixed seeded set of `samples` problems with
exactly i and j digits is answered by greedy decoding with the KV cache. A problem counts as correct only if the
model writes the whole reversed sum and then EOS: the same rule as the Abacus evaluator, which decodes as many
tokens as the gold answer plus EOS and compares the whole sequence.

`Addition` is the protocol (`tapecli.eval.protocol`: units are cells, one row per problem); the runner writes, to
--out or RUN/eval-addition/<checkpoint>:
  settings.json   what is being evaluated (checked on resume, so cells from different settings never mix)
  samples.jsonl   one row per problem, appended a whole cell at a time -- this is the resume log
  results.json    the grid, the mean accuracies, the protocol and the settings (written at the end, atomically)
  heatmap.png     the grid as a heat-map with the training box outlined (written at the end, atomically)
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tapecli.data.arithmetic import eval_problems, prompt_text, reverse_digits
from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError
from tapecli.eval.common import generate_batch
from tapecli.eval.plots import HeatmapPanel, save_heatmaps
from tapecli.eval.protocol import Evaluation, as_opened, evaluate_one
from tapecli.store.door import OpenedModel
from tapecli.store.run import run_recipe

PROTOCOL = (
    "addition grid (McLeish et al. 2024): for each operand-length pair (i, j) in 1..max_len, `samples` fixed "
    "problems with exactly i and j digits seeded by (seed, i, j); prompt `a_rev+b_rev=` (all numbers least-significant "
    "digit first, no BOS); greedy decoding with the KV cache for up to max(i, j) + 2 tokens; a problem is correct iff "
    "the tokens before the first EOS are exactly the reversed sum's digits and an EOS was produced; cell accuracy = "
    "correct / samples; mean_accuracy = unweighted mean over all max_len x max_len cells (as the paper reports); "
    "in_box = cells with both lengths <= the training max_digits, out_of_box = all other cells"
)

HEATMAP_FILE = "heatmap.png"


@dataclass
class AdditionEvalSettings:
    """Everything that determines the result; a resumed evaluation must match it exactly."""

    max_len: int
    samples: int
    seed: int = 1234
    train_digits: int | None = None  # the training box: operands up to this many digits were trained on
    checkpoint: str | None = None  # where the model came from (for the record)
    pe: str | None = None
    dtype: str = "fp32"  # the weights' dtype
    pe_overrides: dict[str, Any] = field(default_factory=dict)  # --pe-arg values applied to the model


@dataclass
class Addition(Evaluation):
    """The grid evaluation of one model (or several, compared): its options as `tape eval addition` takes them.

    `max_len` and `samples` default to the run's recipe: `eval.max_len` (2 x `data.max_digits` when null) and
    `eval.samples`; the training box is the run's `data.max_digits`. `fixed` evaluates exactly those settings
    instead (a model given in memory: the demo, tests).
    """

    name = "addition"
    unit = "cells"
    plot_file = HEATMAP_FILE
    max_len: int | None = None
    samples: int | None = None
    seed: int = 1234
    fixed: AdditionEvalSettings | None = None
    current: AdditionEvalSettings | None = field(default=None, init=False, repr=False)  # this model's settings

    def prepare(self, opened: OpenedModel) -> None:
        self.current = self.fixed or self._settings(opened)
        if self.current.max_len < 1 or self.current.samples < 1:
            raise TapeError(f"--max-len and --samples must be positive, got {self.current.max_len} and "
                            f"{self.current.samples}")

    def _settings(self, opened: OpenedModel) -> AdditionEvalSettings:
        if opened.tokenizer.kind != "addition":
            raise TapeError(f"{opened.spec} was not trained on addition (its tokenizer is {opened.tokenizer.kind!r}, "
                            "not 'addition')")
        ckpt = Path(opened.source)
        recipe = run_recipe(ckpt)
        max_len, samples = self.max_len, self.samples
        if max_len is None:
            if recipe is None:
                raise TapeError(f"{ckpt} has no run recipe to take eval.max_len from; pass --max-len")
            max_len = recipe.eval.max_len or 2 * recipe.data.max_digits
        if samples is None:
            samples = recipe.eval.samples if recipe is not None else 100
        return AdditionEvalSettings(
            max_len=max_len, samples=samples, seed=self.seed, checkpoint=opened.source, pe=opened.model.config.pe,
            train_digits=recipe.data.max_digits if recipe is not None and recipe.data.kind == "addition" else None,
            dtype=opened.dtype, pe_overrides=opened.pe_args,
        )

    def settings(self, opened: OpenedModel) -> dict[str, Any]:
        return asdict(self.current)

    def units(self, opened: OpenedModel) -> list[tuple[int, int]]:
        n = self.current.max_len
        return [(i, j) for i in range(1, n + 1) for j in range(1, n + 1)]

    def key(self, row: dict[str, Any]) -> tuple[int, int]:
        return row["i"], row["j"]

    def keep(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _whole_cells(rows, self.current.samples)  # a cell cut off mid-write is redone

    def batches(self, todo: list[tuple[int, int]], batch_size: int) -> Iterator[list[tuple[int, int]]]:
        return _batches(todo, self.current.samples, batch_size)

    def evaluate(self, opened: OpenedModel, units: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return _solve(opened.model, opened.tokenizer, units, self.current)

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        done: dict[tuple[int, int], list[bool]] = defaultdict(list)
        for row in rows:
            done[(row["i"], row["j"])].append(row["correct"])
        return _results(self.current, done)

    def dumps(self, results: dict[str, Any]) -> str:
        return _results_json(results)

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        save_heatmaps([_panel(results)], path)

    def compare(self, results: dict[str, dict[str, Any]], folder: Path) -> None:
        save_heatmaps([_panel(r, label) for label, r in results.items()], folder / HEATMAP_FILE)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        lines = []
        for label, r in results.items():
            parts = [f"{name} {r[key]:.1%}" for name, key in [("mean accuracy", "mean_accuracy"),
                     ("inside the training box", "in_box_accuracy"), ("outside it", "out_of_box_accuracy")]
                     if r[key] is not None]
            lines.append(("" if len(results) == 1 else f"{label}: ") + ", ".join(parts))
        return "\n".join(lines)


def _panel(results: dict[str, Any], label: str | None = None) -> HeatmapPanel:
    settings = results["settings"]
    title = f"{label or settings['pe'] or 'model'}: mean accuracy {results['mean_accuracy']:.1%}"
    return HeatmapPanel(results["grid"], title, settings["train_digits"])


def evaluate_addition(
    model: torch.nn.Module,
    tokenizer: CharTokenizer,
    settings: AdditionEvalSettings,
    out_dir: str | Path,
    batch_size: int = 1024,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) the grid evaluation of a model in memory into `out_dir`; returns what `results.json` holds.

    Cells already in `out_dir/samples.jsonl` from an interrupted run with the same settings are kept, not redone.
    `batch_size` (problems decoded together) changes speed only; cells are batched whole, grouped by prompt
    length, so no prompt needs padding.
    """
    opened = as_opened(model, tokenizer, name=settings.pe or "model", source=settings.checkpoint or "")
    return evaluate_one(Addition(fixed=settings), opened, out_dir, batch_size=batch_size, show_progress=show_progress)


def _whole_cells(rows: list[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    by_cell: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_cell[(row["i"], row["j"])].append(row)
    return [row for cell_rows in by_cell.values() if len(cell_rows) == samples for row in cell_rows]


def _batches(cells: list[tuple[int, int]], samples: int, batch_size: int) -> Iterator[list[tuple[int, int]]]:
    """Group whole cells with the same prompt length (i + j) into chunks of about `batch_size` problems."""
    per_chunk = max(1, batch_size // samples)
    by_length: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for i, j in cells:
        by_length[i + j].append((i, j))
    for length in sorted(by_length):
        group = by_length[length]
        for start in range(0, len(group), per_chunk):
            yield group[start : start + per_chunk]


@torch.inference_mode()
def _solve(
    model: torch.nn.Module, tokenizer: CharTokenizer, cells: list[tuple[int, int]], settings: AdditionEvalSettings
) -> list[dict[str, Any]]:
    """Greedy-decode every problem of `cells` (equal prompt lengths) in one batch; one result row per problem."""
    problems = [(i, j, a, b) for i, j in cells for a, b in eval_problems(i, j, settings.samples, settings.seed)]
    prompts = [tokenizer.encode(prompt_text(a, b)) for _, _, a, b in problems]
    longest_answer = max(max(i, j) + 1 for i, j in cells)
    outputs = generate_batch(model, prompts, max_new_tokens=longest_answer + 1, batch_size=len(prompts),
                             stop_tokens=[tokenizer.eos_id], pad_id=tokenizer.pad_id)
    rows = []
    for (i, j, a, b), generated in zip(problems, outputs, strict=True):
        stopped = tokenizer.eos_id in generated
        answer = generated[: generated.index(tokenizer.eos_id)] if stopped else generated
        gold = str(a + b)
        # Compared on token ids: decode() drops special tokens, which must not turn a wrong answer right.
        correct = stopped and answer == tokenizer.encode(reverse_digits(a + b))
        rows.append({"i": i, "j": j, "a": a, "b": b, "gold": gold, "prediction": tokenizer.decode(answer)[::-1],
                     "eos": stopped, "correct": correct})
    return rows


def _results(settings: AdditionEvalSettings, done: dict[tuple[int, int], list[bool]]) -> dict[str, Any]:
    n, box = settings.max_len, settings.train_digits
    accuracy = {cell: sum(hits) / len(hits) for cell, hits in done.items()}
    grid = [[accuracy[(i, j)] for j in range(1, n + 1)] for i in range(1, n + 1)]

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    # Without a known training box (a checkpoint outside a run directory) both are None.
    inside = [acc for (i, j), acc in accuracy.items() if box is not None and max(i, j) <= box]
    outside = [acc for (i, j), acc in accuracy.items() if box is not None and max(i, j) > box]
    return {
        "task": "addition",
        "protocol": PROTOCOL,
        "settings": asdict(settings),
        "mean_accuracy": mean(list(accuracy.values())),
        "in_box_accuracy": mean(inside),
        "out_of_box_accuracy": mean(outside),
        "grid": grid,  # grid[i - 1][j - 1]: accuracy with i digits in the first operand and j in the second
        "problems": n * n * settings.samples,
    }


def _results_json(results: dict[str, Any]) -> str:
    """Indented JSON with one line per grid row, so the file reads as the grid it holds."""
    rows = ",\n  ".join(json.dumps(row) for row in results["grid"])
    return json.dumps({**results, "grid": "@grid"}, indent=1).replace('"@grid"', f"[\n  {rows}\n ]") + "\n"
