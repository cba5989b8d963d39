"""How a sweep judges a trained cell: the evaluation its recipe's data kind names (`DataSchema.evaluation`, in the
kind's own module; `EVALUATIONS` maps the names to what they run).

    data.kind                          evaluation   what it is, per cell
    selective-copy, flip-flop,         synthetic    `tape eval synthetic --model RUN`: whole-sequence accuracy and
    counting                                        per-token accuracy on the iid, ood-dense and ood-sparse splits
    grid-1d, grid-2d                   synthetic    the same, and the per-token accuracy on revisited objects
                                       (grid)       (`synthetic-grid`)
    addition                           addition     `tape eval addition --model RUN`: the grid's mean accuracy and
                                                    the means inside / outside the training box (+ the grid itself)
    babilong                           babilong     `tape eval babilong --model RUN` (the run's eval keys): the
                                                    accuracy averaged over the tasks, one split per length
    text, pairs, scrolls               validation   perplexity = exp(validation loss) of the final checkpoint, i.e.
                                                    the loss the engine logged in RUN/metrics.jsonl at
                                                    train.max_steps (target tokens of the first train.eval_batches
                                                    micro-batches of the validation split); no model is run again

Each writes RUN/eval-<name>/<checkpoint>/results.json (synthetic and addition through their own resumable
evaluation, with settings.json and samples.jsonl), and `scores(results.json content)` reads back
{split: {metric: value}}, what the sweep's table and chart aggregate over seeds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.common import RESULTS_FILE
from tapecli.files import write_json

Scores = dict[str, dict[str, float | None]]  # {split: {metric: value}}


@dataclass(frozen=True)
class Evaluation:
    name: str  # RUN/eval-<name>/<checkpoint>/
    metrics: tuple[str, ...]  # what each split reports (keys of scores()), in table order
    labels: tuple[str, ...]  # their names in tables and charts
    title: str  # what the table and the chart show
    run: Callable[[Path], Any]  # evaluate (or resume) the newest checkpoint of a trained run directory
    scores: Callable[[dict[str, Any]], Scores]  # results.json -> {split: {metric: value}}
    command: str | None  # the equivalent command line ({run}: the run directory); None: nothing to run
    percent: bool = True  # values in [0, 1], printed as percentages and charted on a 0..1 axis
    digits: int = 0  # decimals printed (of the percentage when `percent`)
    chart: str = "accuracy.png"  # the sweep's bar chart
    heatmaps: bool = False  # results.json holds a grid: the sweep also draws the mean grid per group

    def results_file(self, checkpoint: Path) -> Path:
        """RUN/eval-<name>/<checkpoint name>/results.json for a checkpoint RUN/checkpoints/step-N."""
        return checkpoint.parent.parent / f"eval-{self.name}" / checkpoint.name / RESULTS_FILE


def _synthetic(run_dir: Path) -> None:
    from tapecli.data.synthetic import SPLITS
    from tapecli.eval.protocol import run
    from tapecli.eval.synthetic import Synthetic

    run(Synthetic(list(SPLITS)), [str(run_dir)], batch_size=64)  # `tape eval synthetic --model RUN`, its defaults


def _synthetic_scores(results: dict[str, Any]) -> Scores:
    return {split: {m: values[m] for m in SYNTHETIC_GRID.metrics if m in values}
            for split, values in results["splits"].items()}


def _addition(run_dir: Path) -> None:
    from tapecli.eval.addition import Addition
    from tapecli.eval.protocol import run

    run(Addition(), [str(run_dir)], batch_size=1024)  # `tape eval addition --model RUN`, its defaults


def _addition_scores(results: dict[str, Any]) -> Scores:
    box = results["settings"]["train_digits"]
    return {"grid (mean)": {"accuracy": results["mean_accuracy"]},
            f"in box (<={box})": {"accuracy": results["in_box_accuracy"]},
            "out of box": {"accuracy": results["out_of_box_accuracy"]}}


def _babilong(run_dir: Path) -> None:
    from tapecli.eval.babilong import Babilong
    from tapecli.eval.protocol import run

    run(Babilong(), [str(run_dir)], batch_size=8)  # `tape eval babilong --model RUN`: the run's eval keys


def _babilong_scores(results: dict[str, Any]) -> Scores:
    average = results["models"][0]["average"]
    return {f"{n} tokens": {"accuracy": average[n] / 100} for n in average}


def _validation(run_dir: Path) -> None:
    """results.json from the validation loss the engine logged at the final checkpoint's step."""
    from tapecli.store.checkpoint import checkpoint_step, resolve_checkpoint
    from tapecli.store.run import read_metrics, run_recipe

    checkpoint = resolve_checkpoint(run_dir)
    step, recipe = checkpoint_step(checkpoint), run_recipe(checkpoint)
    losses = [row["val_loss"] for row in read_metrics(run_dir) if "val_loss" in row and row["step"] == step]
    if not losses:
        reason = recipe.data.no_validation()
        raise TapeError(f"{run_dir}/metrics.jsonl has no validation loss at step {step}"
                        + (f" ({reason})" if reason else "")
                        + f"; a sweep over data.kind '{recipe.data.kind}' reports the validation perplexity")
    t, path = recipe.train, VALIDATION.results_file(checkpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {
        "protocol": "perplexity = exp(validation loss): mean cross-entropy over the target tokens of the first "
                    "train.eval_batches x train.micro_batch_size validation sequences, logged by the engine at "
                    "the checkpoint's step",
        "step": step, "val_loss": losses[-1], "perplexity": math.exp(losses[-1]),
        "settings": {"checkpoint": str(checkpoint.resolve()), "seq_len": recipe.data.seq_len,
                     "sequences": t.eval_batches * t.micro_batch_size, "val_fraction": recipe.data.val_fraction}})


SYNTHETIC = Evaluation(
    name="synthetic", metrics=("accuracy", "token_accuracy"), labels=("sequence", "token"),
    title="accuracy per split, whole sequence / per token", run=_synthetic, scores=_synthetic_scores,
    command="tape eval synthetic --model {run}")
SYNTHETIC_GRID = dataclasses.replace(
    SYNTHETIC, metrics=(*SYNTHETIC.metrics, "object_accuracy"), labels=(*SYNTHETIC.labels, "object"),
    title="accuracy per split, whole sequence / per token / per object token")
ADDITION = Evaluation(
    name="addition", metrics=("accuracy",), labels=("accuracy",), title="accuracy (greedy, exact match)",
    run=_addition, scores=_addition_scores, command="tape eval addition --model {run}", digits=1, heatmaps=True)
BABILONG = Evaluation(
    name="babilong", metrics=("accuracy",), labels=("accuracy",),
    title="BABILong accuracy per length (mean over the tasks)", run=_babilong, scores=_babilong_scores,
    command="tape eval babilong --model {run}", digits=1)
VALIDATION = Evaluation(
    name="validation", metrics=("perplexity",), labels=("perplexity",), title="validation perplexity",
    run=_validation, scores=lambda r: {"validation": {"perplexity": r["perplexity"]}}, command=None, percent=False,
    digits=2, chart="perplexity.png")

# Keyed by the names data kinds give (`DataSchema.evaluation`); the grid's variant writes where `synthetic` does.
EVALUATIONS: dict[str, Evaluation] = {"synthetic": SYNTHETIC, "synthetic-grid": SYNTHETIC_GRID,
                                      "addition": ADDITION, "babilong": BABILONG, "validation": VALIDATION}


def evaluation_for(kind: str) -> Evaluation:
    """The evaluation data kind `kind` names (tapecli.data.build.KINDS)."""
    from tapecli.data.build import KINDS

    if kind not in KINDS:
        raise TapeError(f"data.kind '{kind}': unknown; known: {', '.join(KINDS)}")
    return EVALUATIONS[KINDS[kind].evaluation]
