"""What the long-context evaluations report (`tape eval ruler`, `babilong`, `kv-retrieval`, `latent-list`): the one
owner of the effective-length conventions, LongScore, the Markdown score table and the length plots.

Scores are percentages (0-100) per length (in tokens, or another size such as kv-retrieval's number of pairs).

- `effective_length(scores, threshold)`: RULER's convention (Hsieh et al. 2024): the longest length up to which every
  evaluated length's score *exceeds* the threshold, 85.6 by default (Llama-2-7B's RULER average at 4K); None when the
  shortest length does not.
- `relative_effective_length(scores, base, fraction)`: NoLiMa's convention (Modarressi et al. 2025, arXiv
  2502.05167): the longest length up to which every score is *at least* `fraction` (0.85) of the model's own base
  score. NoLiMa takes the base score from its short contexts (250, 500 and 1K tokens); here it is the mean score over
  the base lengths (default: the shortest length evaluated, e.g. BABILong's facts-only 0K).
- `long_score(scores, base_lengths)`: LongScore (Yang et al. 2025, 100-LongBench, arXiv 2505.19293):
  LC_l = 100 (S_l - Base) / Base for every length l beyond the base lengths, Base = the mean score over the base
  lengths (the paper: 2K, 4K and 6K), LongScore = the mean of LC_l; 0 means no loss with length, -100 a total one.
  None when Base is 0.
- `length_summary(...)`: all of the above in one dict (what results.json holds per model).
- `table(...)`: one model's scores per row and length as a Markdown table, after a line with its effective lengths.
- `plot_lines(...)`, `plot_grid(...)`: the score-vs-length lines of several models, and a labelled heat-map.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

THRESHOLD = 85.6
NOLIMA_FRACTION = 0.85


def effective_length(scores: Mapping[int, float], threshold: float = THRESHOLD) -> int | None:
    """RULER: the longest length up to which every score exceeds `threshold` (None if the shortest does not)."""
    best = None
    for length in sorted(scores):
        if scores[length] <= threshold:
            break
        best = length
    return best


def relative_effective_length(scores: Mapping[int, float], base: float,
                              fraction: float = NOLIMA_FRACTION) -> int | None:
    """NoLiMa: the longest length up to which every score is at least `fraction` x `base` (None if none is, or
    when the base score is 0: there is no ability to keep)."""
    if base <= 0:
        return None
    best = None
    for length in sorted(scores):
        if scores[length] < fraction * base:
            break
        best = length
    return best


def base_score(scores: Mapping[int, float], base_lengths: Sequence[int]) -> float:
    """The mean score over the base lengths."""
    return sum(scores[n] for n in base_lengths) / len(base_lengths)


def long_score(scores: Mapping[int, float], base_lengths: Sequence[int]) -> tuple[float | None, dict[int, float]]:
    """(LongScore, {length: LC_l}) over the lengths beyond the base lengths; LongScore is None when Base is 0 or no
    length lies beyond them."""
    base = base_score(scores, base_lengths)
    longer = [n for n in sorted(scores) if n > max(base_lengths)]
    if base == 0 or not longer:
        return None, {}
    per_length = {n: round(100 * (scores[n] - base) / base, 2) for n in longer}
    return round(sum(per_length.values()) / len(per_length), 2), per_length


def check_base_lengths(base_lengths: Sequence[int] | None, lengths: Sequence[int], option: str = "--base-lengths"
                       ) -> list[int]:
    """The base lengths to use: those given (each must be evaluated) or the shortest length."""
    from tapecli.errors import TapeError

    if not base_lengths:
        return [min(lengths)]
    missing = [n for n in base_lengths if n not in lengths]
    if missing:
        raise TapeError(f"{option}: {', '.join(map(str, missing))} is not among the lengths evaluated "
                        f"({', '.join(map(str, sorted(lengths)))})")
    return sorted(set(base_lengths))


def length_summary(scores: Mapping[int, float], threshold: float, base_lengths: Sequence[int]) -> dict[str, Any]:
    """Both effective lengths and LongScore of one model's scores per length."""
    base = round(base_score(scores, base_lengths), 2)
    score, per_length = long_score(scores, base_lengths)
    return {"effective_length": effective_length(scores, threshold), "threshold": threshold,
            "base_lengths": list(base_lengths), "base_score": base,
            "nolima_threshold": round(NOLIMA_FRACTION * base, 2),
            "effective_length_nolima": relative_effective_length(scores, base),
            "long_score": score, "long_scores": {str(n): v for n, v in per_length.items()}}


def mean_percent(values: Sequence[float]) -> float:
    """The mean of per-sample values in [0, 1], as a percentage rounded to 2 decimals (RULER's task score)."""
    return round(sum(values) / len(values) * 100, 2)


def headline(name: str, summary: Mapping[str, Any], unit: str = "") -> str:
    """"NAME: effective length N (threshold 85.6); N' at 85% of its base score X; LongScore Y"."""
    def show(value: Any) -> str:
        return "none" if value is None else f"{value}{unit}"

    line = (f"{name}: effective length {show(summary['effective_length'])} (threshold {summary['threshold']}); "
            f"{show(summary['effective_length_nolima'])} at 85% of its base score {summary['base_score']}")
    return line + ("" if summary["long_score"] is None else f"; LongScore {summary['long_score']}")


def table(rows: Mapping[str, Mapping[str, float]], columns: Sequence[Any], first: str = "task",
          labels: Sequence[str] | None = None) -> str:
    """A Markdown table: one row per key of `rows` ({row: {str(column): score}}), one column per entry of `columns`
    (headed by `labels`, default the columns themselves)."""
    head = [first, *(labels or [str(c) for c in columns])]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for name, cells in rows.items():
        values = [cells.get(str(c)) for c in columns]
        lines.append("| " + " | ".join([name, *("-" if v is None else f"{v:.1f}" for v in values)]) + " |")
    return "\n".join(lines)


def plot_lines(series: Mapping[str, Sequence[tuple[float, float]]], path: Path, xlabel: str, ylabel: str,
               title: str, threshold: float | None = None, log_x: bool = True) -> Path:
    """Score (0-100) vs length, one line per model; the threshold dashed; a tick at every length evaluated. Lengths
    of 0 (BABILong's facts only) are drawn at the smallest positive length's half on a log axis."""
    from tapecli.eval.plots import save_line_plot

    positive = [x for points in series.values() for x, _ in points if x > 0]
    floor = min(positive) / 2 if positive else 1

    def at(x: float) -> float:
        return x if x > 0 or not log_x else floor

    drawn = {name: [(at(x), y) for x, y in points] for name, points in series.items()}
    ticks = {at(x): f"{x:g}" for points in series.values() for x, _ in points}
    return save_line_plot(drawn, path, xlabel=xlabel, ylabel=ylabel, title=title, log_x=log_x and bool(positive),
                          ylim=(-3, 103), hline=threshold, xticks=ticks)


def plot_grid(rows: Mapping[str, Mapping[str, float]], columns: Sequence[Any], path: Path, xlabel: str,
              ylabel: str, title: str, labels: Sequence[str] | None = None) -> Path:
    """A heat-map of {row: {str(column): score 0-100}} (missing cells blank), one row per key."""
    from tapecli.eval.plots import save_grid_heatmap

    grid = [[(cells.get(str(c)) if cells.get(str(c)) is not None else float("nan")) / 100 for c in columns]
            for cells in rows.values()]
    return save_grid_heatmap(grid, path, x_labels=list(labels or [str(c) for c in columns]), y_labels=list(rows),
                             xlabel=xlabel, ylabel=ylabel, title=title, colorbar="score / 100")


def safe_name(name: str) -> str:
    """A model's name as part of a file name."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)
