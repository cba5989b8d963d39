"""Addition length generalisation: exact-match accuracy over a grid of operand lengths (McLeish et al. protocol).

For every pair of operand lengths (i, j) with 1 <= i, j <= max_len, a fixed seeded set of `samples` problems with
exactly i and j digits is answered by greedy decoding with the KV cache. A problem counts as correct only if the
model writes the whole reversed sum and then EOS: the same rule as the Abacus evaluator, which decodes as many
tokens as the gold answer plus EOS and compares the whole sequence.

Files in the output directory (the shared layout of `tapecli.eval.common`):
  settings.json   what is being evaluated (checked on resume, so cells from different settings never mix)
  samples.jsonl   one row per problem, appended a whole cell at a time -- this is the resume log
  results.json    the grid, the mean accuracies, the protocol and the settings (written at the end, atomically)
  heatmap.png     the grid as a heat-map with the training box outlined (written at the end, atomically)
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tapecli.data.arithmetic import eval_problems, prompt_text, reverse_digits
from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError
from tapecli.eval.common import RESULTS_FILE, SamplesLog, generate_batch, progress_bar
from tapecli.eval.plots import HeatmapPanel, save_heatmaps
from tapecli.faults import check_output_dir
from tapecli.files import write_atomic
from tapecli.store.door import open_model
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


def evaluate_addition(
    model: torch.nn.Module,
    tokenizer: CharTokenizer,
    settings: AdditionEvalSettings,
    out_dir: str | Path,
    batch_size: int = 1024,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) the grid evaluation into `out_dir` and return what `results.json` holds.

    Cells already in `out_dir/samples.jsonl` from an interrupted run with the same settings are kept, not redone.
    `batch_size` (problems decoded together) changes speed only; cells are batched whole, grouped by prompt
    length, so no prompt needs padding.
    """
    if settings.max_len < 1 or settings.samples < 1:
        raise TapeError(f"--max-len and --samples must be positive, got {settings.max_len} and {settings.samples}")
    if batch_size < 1:
        raise TapeError(f"--batch-size must be a positive integer, got {batch_size}")
    out = Path(out_dir)
    cells = [(i, j) for i in range(1, settings.max_len + 1) for j in range(1, settings.max_len + 1)]
    started = time.perf_counter()
    model.eval()
    # Only whole cells count as done: a cell cut off mid-write is redone.
    with SamplesLog(out, asdict(settings), keep=lambda rows: _whole_cells(rows, settings.samples)) as log, \
            progress_bar("cells", show_progress) as progress:
        finished = {(row["i"], row["j"]) for row in log.rows}
        todo = [cell for cell in cells if cell not in finished]
        task = progress.add_task("addition grid", total=len(cells), completed=len(cells) - len(todo))
        for chunk in _batches(todo, settings.samples, batch_size):
            log.append(_solve(model, tokenizer, chunk, settings))
            progress.advance(task, len(chunk))
    done: dict[tuple[int, int], list[bool]] = defaultdict(list)
    for row in log.rows:
        done[(row["i"], row["j"])].append(row["correct"])
    results = _results(settings, done, time.perf_counter() - started)
    write_atomic(out / RESULTS_FILE, _results_json(results))
    title = f"{settings.pe or 'model'}: mean accuracy {results['mean_accuracy']:.1%}"
    save_heatmaps([HeatmapPanel(results["grid"], title, settings.train_digits)], out / HEATMAP_FILE)
    return results


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


def _results(
    settings: AdditionEvalSettings, done: dict[tuple[int, int], list[bool]], seconds: float
) -> dict[str, Any]:
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
        "seconds_this_session": round(seconds, 2),
    }


def _results_json(results: dict[str, Any]) -> str:
    """Indented JSON with one line per grid row, so the file reads as the grid it holds."""
    rows = ",\n  ".join(json.dumps(row) for row in results["grid"])
    return json.dumps({**results, "grid": "@grid"}, indent=1).replace('"@grid"', f"[\n  {rows}\n ]") + "\n"


def run_addition_eval(
    model: str,
    max_len: int | None = None,
    samples: int | None = None,
    seed: int = 1234,
    batch_size: int = 1024,
    out: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    pe_args: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Path]:
    """`tape eval addition`: open a run or checkpoint, evaluate (or resume) its grid; returns (results, output dir).

    The training box and the defaults of `max_len` / `samples` come from the run's recipe.yaml when the checkpoint
    lives in a run directory: `eval.max_len` (2 x `data.max_digits` when null) and `eval.samples`.
    """
    if out:
        check_output_dir(out)
    opened = open_model(model, dtype=dtype, device=device, pe_args=pe_args)
    ckpt = Path(opened.source)
    if opened.tokenizer.kind != "addition":
        raise TapeError(f"{opened.spec} was not trained on addition (its tokenizer is {opened.tokenizer.kind!r}, "
                        "not 'addition')")
    recipe = run_recipe(ckpt)
    if max_len is None:
        if recipe is None:
            raise TapeError(f"{ckpt} has no run recipe to take eval.max_len from; pass --max-len")
        max_len = recipe.eval.max_len or 2 * recipe.data.max_digits
    if samples is None:
        samples = recipe.eval.samples if recipe is not None else 100
    settings = AdditionEvalSettings(
        max_len=max_len, samples=samples, seed=seed, checkpoint=opened.source, pe=opened.model.config.pe,
        train_digits=recipe.data.max_digits if recipe is not None and recipe.data.kind == "addition" else None,
        dtype=opened.dtype, pe_overrides=opened.pe_args,
    )
    # Next to the run's checkpoints by default, one folder per checkpoint step.
    out_dir = Path(out) if out else (ckpt.parent.parent if recipe else ckpt) / "eval-addition" / ckpt.name
    return evaluate_addition(opened.model, opened.tokenizer, settings, out_dir, batch_size=batch_size), out_dir
