"""`tape analyze position-loss`: mean token loss (and accuracy) at every position, up to several times the
training length, for one model or several side by side.

Each model reads the same --samples sequences of --seq-len tokens (`sequences.DataSource`; text: the same text in
its own tokens). One forward pass per sequence through the model's normal attention path (the linear-memory paths
of `tapecli.model.attention`: no [T, T] tensor at any length), logits formed 1,024 positions at a time, so a CPU
runs 16K tokens. Position t (context t tokens, 1..T) gets the token's loss (natural log) and whether the argmax was
right, where the data scores it.

Positions are binned on a log axis (`bins_per_octave` bins per doubling). For every bin and sequence the mean over
the bin's scored positions is taken; a bin's value is the mean of those per-sequence means over the sequences that
have a scored position in it, and its band is the normal-approximation 95% interval of that mean over sequences,
mean +/- 1.96 sd / sqrt(n) (no band from one sequence). The same estimator gives the summary ranges: positions up to
the training length L (`sequences.training_length`), then L..2L, 2L..4L, ... (each model its own L).

`PositionLoss` is an evaluation protocol (`tapecli.eval.protocol`): a unit is a sequence, the models share one
folder (--out): settings.json, samples.jsonl (per sequence and model: per-bin sums, the resume log), results.json
(per model: bins with loss, accuracy, their bands, and the ranges) and position-loss.png (loss, and accuracy for a
synthetic task, against position: one line and band per model, training lengths dashed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.protocol import Evaluation, Opening, source_of
from tapecli.experiments.analyze.sequences import IGNORE, DataSource, OverSequences, Sequence
from tapecli.store.door import OpenedModel

PLOT_FILE = "position-loss.png"
LOGIT_ROWS = 1024  # positions whose logits exist at once
ESTIMATOR = ("per bin: the mean over sequences of each sequence's mean over the bin's scored positions; band: "
             "mean +/- 1.96 sd / sqrt(sequences), the normal-approximation 95% interval (none from one sequence)")


def log_bins(seq_len: int, per_octave: int) -> list[int]:
    """First positions of the bins covering 1..seq_len: 2^(k / per_octave) rounded down, repeats removed."""
    edges, k = [], 0
    while (first := math.floor(2 ** (k / per_octave))) <= seq_len:
        if not edges or first > edges[-1]:
            edges.append(first)
        k += 1
    return edges


def ranges(length: int, seq_len: int) -> list[tuple[int, int, str]]:
    """(first, last, label) of the summary ranges: 1..L, then L+1..2L, 2L+1..4L, ... up to seq_len."""
    out, low, factor = [(1, min(length, seq_len), "<= L")], length, 1
    while low < seq_len:
        out.append((low + 1, min(2 * low, seq_len), f"{factor if factor > 1 else ''}L-{2 * factor}L"))
        low, factor = 2 * low, 2 * factor
    return out


def token_scores(model: Any, ids: Any, targets: Any) -> tuple[Any, Any]:
    """(loss, correct), [B, T] each (fp32 loss, 0 where the target is ignored; bool), of input ids [B, T] and
    targets [B, T] (-100: not scored); logits are formed LOGIT_ROWS positions at a time."""
    import torch
    import torch.nn.functional as F

    with torch.inference_mode():
        hidden, _ = model.run(ids)
        losses, correct = [], []
        for s in range(0, ids.shape[1], LOGIT_ROWS):
            logits = model.lm_head(hidden[:, s : s + LOGIT_ROWS]).float()
            target = targets[:, s : s + LOGIT_ROWS]
            losses.append(F.cross_entropy(logits.transpose(1, 2), target, reduction="none", ignore_index=IGNORE))
            correct.append(logits.argmax(-1) == target)
    return torch.cat(losses, 1), torch.cat(correct, 1)


def sums(values: Any, mask: Any, spans: list[tuple[int, int]]) -> list[list[float]]:
    """[sum, count] of `values` [T] where `mask` [T] holds, over positions first..last (1-based) of each span."""
    return [[float(values[a - 1 : b][mask[a - 1 : b]].double().sum()), int(mask[a - 1 : b].sum())] for a, b in spans]


def mean_band(values: list[float]) -> tuple[float | None, list[float] | None]:
    """(mean, [low, high] of its 95% normal interval) over sequences; (None, None) without values, no band from
    one."""
    n = len(values)
    if not n:
        return None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    half = 1.96 * math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    return mean, [mean - half, mean + half]


def summarise(rows: list[dict[str, Any]], metric: str) -> tuple[list[float | None], list[list[float] | None]]:
    """Per bin (or range) of the rows' `metric` ("loss" or "accuracy"): mean over sequences and band."""
    width = len(rows[0][metric]) if rows else 0
    means, bands = [], []
    for b in range(width):
        values = [r[metric][b][0] / r[metric][b][1] for r in rows if r[metric][b][1]]
        mean, band = mean_band(values)
        means.append(mean)
        bands.append(band)
    return means, bands


@dataclass
class PositionLoss(OverSequences, Evaluation):
    """Loss and accuracy per position of several models on the same sequences (module docstring)."""

    name = "position-loss"
    unit = "sequences"
    plot_file = PLOT_FILE
    together = True
    source: DataSource
    bins_per_octave: int = 4
    sequences: list[Sequence] = field(default_factory=list, init=False, repr=False)
    length: int = field(default=0, init=False, repr=False)  # this model's training length

    def check(self, models: list[str]) -> None:
        if self.bins_per_octave < 1:
            raise TapeError(f"--bins-per-octave must be a positive integer, got {self.bins_per_octave}")
        self.source.check(models)

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "position-loss", "models": [source_of(m)[1] for m in models], **self.source.describe(),
                "bins_per_octave": self.bins_per_octave, "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def evaluate(self, opened: OpenedModel, units: list[int]) -> list[dict[str, Any]]:
        import torch

        device = next(opened.model.parameters()).device
        ids = torch.stack([self.sequences[i].ids for i in units]).to(device)
        targets = torch.stack([self.sequences[i].targets for i in units]).to(device)
        loss, correct = (t.cpu() for t in token_scores(opened.model, ids, targets))
        T = ids.shape[1]
        edges = [*log_bins(T, self.bins_per_octave), T + 1]
        spans = [(a, b - 1) for a, b in zip(edges, edges[1:], strict=False)]
        summary = [(a, b) for a, b, _ in ranges(self.length, T)]
        rows = []
        for row, i in enumerate(units):
            scored_loss = (targets[row] != IGNORE).cpu()
            scored_acc = scored_loss & self.sequences[i].scored
            rows.append({"sequence": i, "loss": sums(loss[row], scored_loss, spans),
                         "accuracy": sums(correct[row], scored_acc, spans),
                         "range_loss": sums(loss[row], scored_loss, summary),
                         "range_accuracy": sums(correct[row], scored_acc, summary)})
        return rows

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        T = settings["seq_len"]
        edges = [*log_bins(T, self.bins_per_octave), T + 1]
        loss, loss_band = summarise(rows, "loss")
        accuracy, accuracy_band = summarise(rows, "accuracy")
        bins = [{"first": a, "last": b - 1, "center": math.sqrt(a * (b - 1)), "loss": loss[k],
                 "loss_band": loss_band[k], "accuracy": accuracy[k], "accuracy_band": accuracy_band[k],
                 "tokens": sum(r["loss"][k][1] for r in rows)}
                for k, (a, b) in enumerate(zip(edges, edges[1:], strict=False))]
        range_loss, range_loss_band = summarise(rows, "range_loss")
        range_acc, range_acc_band = summarise(rows, "range_accuracy")
        summary = [{"first": a, "last": b, "label": label, "loss": range_loss[k], "loss_band": range_loss_band[k],
                    "accuracy": range_acc[k], "accuracy_band": range_acc_band[k]}
                   for k, (a, b, label) in enumerate(ranges(self.length, T))]
        return {**opened.record(), "training_length": self.length, "sequences": len(rows), "bins": bins,
                "ranges": summary}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "position-loss", "estimator": ESTIMATOR, "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        from tapecli.experiments.analyze.plots import position_loss_plot

        position_loss_plot(results, path)

    def summary(self, results: dict[str, dict[str, Any]]) -> Any:
        from tapecli.experiments.analyze.tables import position_loss_table

        return position_loss_table(results[self.name])
