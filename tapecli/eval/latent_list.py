"""Michelangelo's Latent List (arXiv 2409.12640): what a long Python program that changes a list prints at its end;
accuracy per length and number of relevant operations.

Per model, length and number of relevant lines R (`--relevant-ops`), `--samples` programs of
`tapecli.data.latent_list` (seeded, the model's own tokenizer: the same questions at every length). The model reads
its tokenizer's default special tokens + the prompt and decodes greedily up to 256 tokens, stopping at EOS or at the
end of its first non-empty line. Scoring (`score`): the first line of the answer is read as a Python literal (a list
or an integer); it is **right** when it equals what the program prints (so "[1,2]" and "[1, 2]" are equal). The
paper scores the task with an approximate metric that gives partial credit; its formula is not restated here, and
tape reports, besides the exact accuracy, its own partial credit (`approximate`): for a number,
max(0, 1 - |answer - truth| / max(1, |truth|)); for a list, the share of positions where both lists hold the same
value, over the longer list's length; 1 for an exact answer, 0 for an answer that is not a literal of the
right kind.

results.json, per model: `scores[R][length]` and `approximate[R][length]` (percentages), `average[length]` (exact,
over the R values), `mean_prompt_tokens[length]`, and from `tapecli.eval.long_context` both effective lengths and
LongScore on `average`. `LatentList` is the protocol (a unit is one program, (length, R, index); the models share
one folder); the runner writes settings.json, samples.jsonl, results.json, latent-list.png (average vs length, one
line per model) and heatmap*.png (R x length per model).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.long_context import THRESHOLD, check_base_lengths, headline, length_summary, mean_percent
from tapecli.eval.long_context import table as score_table
from tapecli.eval.protocol import Candidate, Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "latent-list.png"
MAX_NEW_TOKENS = 256
PROTOCOL = ("Michelangelo's Latent List, tape's generator (tapecli.data.latent_list): a Python program changing list "
            "a by R relevant lines among distractor lines that leave it alone, sized with the model's tokenizer so "
            "that prompt + answer + EOS fit the length; default special tokens + prompt; greedy decoding of up to "
            "256 tokens, stopping at EOS or the end of the first non-empty line; exact: the line read as a Python "
            "literal equals the printed value; approximate: tape's partial credit (see tapecli.eval.latent_list)")

Unit = tuple[int, int, int]  # (length, relevant lines, index)


def parse(text: str) -> Any:
    """The first non-empty line of an answer as a Python literal (None when it is not one)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def score(truth: Any, answer: str) -> tuple[float, float]:
    """(exact, approximate) of an answer, each in [0, 1] (see the module docstring)."""
    got = parse(answer)
    if isinstance(truth, list):
        if not isinstance(got, list):
            return 0.0, 0.0
        same = sum(1 for x, y in zip(got, truth, strict=False) if x == y and type(x) is type(y))
        return (1.0, 1.0) if got == truth else (0.0, same / max(len(got), len(truth)))
    if isinstance(got, bool) or not isinstance(got, int):
        return 0.0, 0.0
    return float(got == truth), max(0.0, 1 - abs(got - truth) / max(1, abs(truth)))


@dataclass
class LatentList(Evaluation):
    """Latent List on one model or several, with `tape eval latent-list`'s options."""

    name = "latent-list"
    unit = "programs"
    plot_file = PLOT_FILE
    files = ("heatmap*.png",)
    together = True
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192, 16384])
    relevant: list[int] = field(default_factory=lambda: [1, 5, 20])
    samples: int = 20
    seed: int = 0
    threshold: float = THRESHOLD
    base_lengths: list[int] | None = None
    cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)  # see per_tokenizer

    def check(self, models: list[str]) -> None:
        self.lengths, self.relevant = sorted(set(self.lengths)), sorted(set(self.relevant))
        if not self.lengths or min(self.lengths) < 1:
            raise TapeError(f"--lengths: positive token counts, got {self.lengths}")
        if not self.relevant or min(self.relevant) < 0:
            raise TapeError(f"--relevant-ops: counts of 0 or more, got {self.relevant}")
        if self.samples < 1:
            raise TapeError(f"--samples must be a positive integer, got {self.samples}")
        self.base_lengths = check_base_lengths(self.base_lengths, self.lengths)

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        """The longest list, with the answer's tokens, fits (`tapecli.eval.budget`)."""
        from tapecli.eval.budget import check_prompt

        check_prompt(model.spec, model.config, opening, batch_size, max(self.lengths) + MAX_NEW_TOKENS,
                     f"--lengths {max(self.lengths)}")

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "latent-list", "models": [source_of(m)[1] for m in models], "lengths": self.lengths,
                "relevant_ops": self.relevant, "samples": self.samples, "seed": self.seed,
                "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def units(self, opened: OpenedModel) -> list[Unit]:
        return [(n, r, i) for n in self.lengths for r in self.relevant for i in range(self.samples)]

    def key(self, row: dict[str, Any]) -> Unit:
        return row["length"], row["relevant_ops"], row["index"]

    cell_fields = 1  # batches: `batch_size` programs of one length at a time

    def evaluate(self, opened: OpenedModel, units: list[Unit]) -> list[dict[str, Any]]:
        from tapecli.data.latent_list import Generator
        from tapecli.eval.common import generate_texts, per_tokenizer

        tokenizer = opened.tokenizer
        generator = per_tokenizer(self.cache, tokenizer, lambda: Generator(tokenizer, self.seed))
        samples = [generator.sample(n, r, i) for n, r, i in units]
        answers = generate_texts(opened, [s.prompt for s in samples], len(units), MAX_NEW_TOKENS,
                                 stop_check=lambda ids: "\n" in tokenizer.decode(ids).strip())
        rows = []
        for (n, r, i), sample, text in zip(units, samples, answers, strict=True):
            exact, approximate = score(sample.value, text)
            rows.append({"length": n, "relevant_ops": r, "index": i, "prompt_tokens": sample.prompt_tokens,
                         "distractors": sample.extra["distractors"], "answer": sample.answer, "prediction": text,
                         "score": exact, "approximate": approximate})
        return rows

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        def cells(metric: str) -> dict[str, dict[str, float]]:
            return {f"{r} ops": {str(n): mean_percent([x[metric] for x in rows if x["relevant_ops"] == r
                                                       and x["length"] == n]) for n in self.lengths}
                    for r in self.relevant}

        scores, approximate = cells("score"), cells("approximate")
        averages = {n: round(sum(c[str(n)] for c in scores.values()) / len(scores), 2) for n in self.lengths}
        tokens = {str(n): round(sum(x["prompt_tokens"] for x in rows if x["length"] == n)
                                / sum(x["length"] == n for x in rows), 1) for n in self.lengths}
        return {**opened.record(), "scores": scores, "approximate": approximate,
                "average": {str(n): a for n, a in averages.items()},
                **length_summary(averages, self.threshold, self.base_lengths), "mean_prompt_tokens": tokens}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "latent-list", "protocol": PROTOCOL, "threshold": self.threshold, "settings": settings,
                "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        from tapecli.eval.long_context import plot_grid, plot_lines, safe_name

        out, models, lengths = path.parent, results["models"], results["settings"]["lengths"]
        plot_lines({m["name"]: [(n, m["average"][str(n)]) for n in lengths] for m in models}, out / PLOT_FILE,
                   xlabel="length (tokens)", ylabel="exact accuracy (%)",
                   title=f"Latent List; dashed: threshold {results['threshold']}", threshold=results["threshold"])
        for k, m in enumerate(models):
            plot_grid({**m["scores"], "average": m["average"]}, lengths,
                      out / ("heatmap.png" if len(models) == 1 else f"heatmap-{k}-{safe_name(m['name'])}.png"),
                      xlabel="length (tokens)", ylabel="relevant operations", title=f"Latent List: {m['name']}")

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        return "\n".join("\n" + headline(m["name"], m) + "\n"
                         + score_table({**m["scores"], "average": m["average"]}, folder["settings"]["lengths"],
                                       first="relevant ops")
                         for folder in results.values() for m in folder["models"])

