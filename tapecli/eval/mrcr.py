"""OpenAI MRCR (multi-round co-reference resolution): reproduce the i-th of 2, 4 or 8 identical requests' answers
from a long conversation, prefixed with a hash; the SequenceMatcher ratio per needle count and context-length bin.

Data: MRCR's released rows (`tapecli.data.mrcr`): `--data` a local file or folder of its parquet files, or the hub
dataset `openai/mrcr` for users with a network. Per model, each row of the chosen needle counts (`--needles`) is
counted in the model's own tokens (transcript + answer) and put in its (lower, upper] bin of `--bins`; rows outside
every bin are left out (the official harness skips rows beyond the context window), and each (needles, bin) cell keeps
its first `--samples` rows in file order. The model reads its tokenizer's default special tokens + the conversation
as a "User:" / "Assistant:" transcript ending with "Assistant:", and decodes greedily up to twice the answer's
tokens, stopping at EOS or where it starts the next "User:" turn; the text is stripped and scored by the dataset
card's `grade` (`grade` below): 0 unless it starts with the row's hash, else the difflib SequenceMatcher ratio of
the answer and the response, both without the hash.

results.json, per model: `scores[needles][bin]` (the mean ratio as a percentage; bins named by their upper edge in
tokens), `counts[needles][bin]` (rows scored), `by_needles[needles]` and `average[bin]` (the mean over the needle
counts' cells), `overall` (the mean over every row), `missing_hash` (the percentage of answers that did not start
with the hash) and `mean_prompt_tokens[bin]`. `Mrcr` is the protocol (a unit is one row, (needles, bin, row); the
models share one folder); the runner writes settings.json, samples.jsonl, results.json and mrcr.png (score vs bin, one
line per model and needle count).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.long_context import mean_percent
from tapecli.eval.long_context import table as score_table
from tapecli.eval.protocol import Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "mrcr.png"
CHARS_PER_TOKEN = 32  # a transcript longer than this x the largest bin edge, in characters, is not tokenised
PROTOCOL = ("OpenAI MRCR (openai/mrcr dataset card): the conversation as 'User:' / 'Assistant:' turns ending with "
            "'Assistant:'; default special tokens + transcript; greedy decoding of up to twice the answer's tokens, "
            "stopping at EOS or at the next '\\nUser:'; stripped; grade(): 0 without the hash prefix, else difflib "
            "SequenceMatcher(None, response, answer).ratio() with the hash removed from both; bins (lower, upper] "
            "of prompt + answer tokens in the model's own tokenizer; score = mean ratio x 100")

Unit = tuple[int, int, int]  # (needles, bin's upper edge, row index)


def grade(response: str, answer: str, random_string_to_prepend: str) -> float:
    """The dataset card's grading function: the hash must open the response; then the ratio without it."""
    if not response.startswith(random_string_to_prepend):
        return 0.0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(SequenceMatcher(None, response, answer).ratio())


@dataclass
class Mrcr(Evaluation):
    """MRCR on one model or several, with `tape eval mrcr`'s options (see the module docstring)."""

    name = "mrcr"
    unit = "conversations"
    plot_file = PLOT_FILE
    together = True
    data: str | None = None
    needles: list[int] = field(default_factory=lambda: [2, 4, 8])
    bins: list[int] = field(default_factory=list)  # edges in tokens; empty: the official ones
    samples: int | None = None  # rows per (needles, bin); None: all
    rows: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    described: Any = field(default=None, init=False, repr=False)
    cells: dict[Unit, int] = field(default_factory=dict, init=False, repr=False)  # this model's units -> tokens
    cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)  # see per_tokenizer

    def check(self, models: list[str]) -> None:
        from tapecli.data import mrcr

        self.needles = sorted(set(self.needles))
        if not self.needles or any(n not in mrcr.NEEDLES for n in self.needles):
            raise TapeError(f"--needles: comma-separated numbers among 2, 4, 8, got {self.needles}")
        self.bins = sorted(set(self.bins or mrcr.BINS))
        if len(self.bins) < 2:
            raise TapeError(f"--bins: at least two edges in tokens (e.g. 4k,8k,16k), got {self.bins}")
        if self.samples is not None and self.samples < 1:
            raise TapeError(f"--samples must be a positive integer, got {self.samples}")
        self.rows, self.described = mrcr.read(self.data)

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "mrcr", "models": [source_of(m)[1] for m in models], "data": self.described,
                "needles": self.needles, "bins": self.bins, "samples": self.samples, "dtype": opening.dtype_name(),
                "pe_args": opening.pe_args}

    def prepare(self, opened: OpenedModel) -> None:
        from tapecli.eval.common import per_tokenizer

        self.cells = per_tokenizer(self.cache, opened.tokenizer, lambda: self._cells(opened.tokenizer))
        if not self.cells:
            raise TapeError(f"{opened.name}: no MRCR conversation of {', '.join(map(str, self.needles))} needles "
                            f"falls in --bins {','.join(map(str, self.bins))} (prompt + answer tokens in its "
                            "tokenizer); widen --bins")

    def _cells(self, tokenizer: Any) -> dict[Unit, int]:
        """{(needles, bin, row): prompt + answer tokens} of the rows each cell keeps, in file order."""
        from tapecli.data import mrcr

        found: dict[Unit, int] = {}
        taken: dict[tuple[int, int], int] = {}
        for index, row in enumerate(self.rows):
            if row["n_needles"] not in self.needles:
                continue
            text = mrcr.transcript(mrcr.messages(row, index))
            if len(text) > CHARS_PER_TOKEN * self.bins[-1]:
                continue
            count = len(tokenizer.encode(text, add_special_tokens=True)) + len(tokenizer.encode(row["answer"]))
            upper = mrcr.bin_of(count, self.bins)
            cell = (row["n_needles"], upper)
            if upper is None or (self.samples is not None and taken.get(cell, 0) >= self.samples):
                continue
            taken[cell] = taken.get(cell, 0) + 1
            found[row["n_needles"], upper, index] = count
        return found

    def units(self, opened: OpenedModel) -> list[Unit]:
        return sorted(self.cells)

    def key(self, row: dict[str, Any]) -> Unit:
        return row["needles"], row["bin"], row["row"]

    cell_fields = 2  # batches: `batch_size` rows of one (needles, bin) at a time (about one length)

    def evaluate(self, opened: OpenedModel, units: list[Unit]) -> list[dict[str, Any]]:
        from tapecli.data import mrcr
        from tapecli.eval.common import generate_batch

        tokenizer = opened.tokenizer
        rows = [self.rows[index] for _, _, index in units]
        prompts = [tokenizer.encode(mrcr.transcript(mrcr.messages(row, i)), add_special_tokens=True)
                   for row, (_, _, i) in zip(rows, units, strict=True)]
        limits = [2 * max(1, len(tokenizer.encode(row["answer"]))) for row in rows]
        eos = getattr(tokenizer, "eos_id", None)
        stop = [eos] if eos is not None and eos >= 0 else None

        def next_turn(new: list[int]) -> bool:  # the last 16 tokens hold the stop string the step it completes
            return mrcr.STOP in tokenizer.decode(new[-16:])

        outputs = generate_batch(opened.model, prompts, max(limits), batch_size=len(units), stop_tokens=stop,
                                 pad_id=eos if stop else None, stop_check=next_turn)
        out = []
        for (needles, upper, index), row, prompt, limit, output in zip(units, rows, prompts, limits, outputs,
                                                                        strict=True):
            output = output[:limit]  # each row's own budget: what it generates alone, whatever the batch
            if stop and eos in output:
                output = output[: output.index(eos)]
            response = tokenizer.decode(output).split(mrcr.STOP)[0].strip()
            prefix = row["random_string_to_prepend"]
            out.append({"needles": needles, "bin": upper, "row": index, "tokens": self.cells[needles, upper, index],
                        "prompt_tokens": len(prompt), "answer_tokens": limit // 2, "prefix": prefix,
                        "response": response, "has_prefix": response.startswith(prefix),
                        "score": grade(response, row["answer"], prefix)})
        return out

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {**opened.record(), **summarise(rows, self.needles, self.bins[1:])}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "mrcr", "protocol": PROTOCOL, "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        plot(results, path)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        lines = []
        for folder in results.values():
            for m in folder["models"]:
                columns = [int(b) for b in m["average"]]
                lines += ["", f"{m['name']}: mean ratio {m['overall']} over {m['rows']} conversations; "
                              f"{m['missing_hash']}% of answers lack the hash",
                          score_table({f"{n} needles": cells for n, cells in m["scores"].items()}, columns,
                                      first="needles / bin (tokens)")]
        return "\n".join(lines)


def summarise(rows: list[dict[str, Any]], needles: list[int], uppers: list[int]) -> dict[str, Any]:
    """The scores of one model's rows (each with needles, bin, score, has_prefix, prompt_tokens); empty cells are
    left out."""
    def cell(n: int, b: int) -> list[dict[str, Any]]:
        return [r for r in rows if r["needles"] == n and r["bin"] == b]

    scores = {str(n): {str(b): mean_percent([r["score"] for r in cell(n, b)]) for b in uppers if cell(n, b)}
              for n in needles}
    counts = {str(n): {str(b): len(cell(n, b)) for b in uppers if cell(n, b)} for n in needles}
    by_needles = {str(n): mean_percent([r["score"] for r in rows if r["needles"] == n])
                  for n in needles if any(r["needles"] == n for r in rows)}
    average, tokens = {}, {}
    for b in uppers:
        present = [scores[str(n)][str(b)] for n in needles if str(b) in scores[str(n)]]
        if present:
            average[str(b)] = round(sum(present) / len(present), 2)
            in_bin = [r["prompt_tokens"] for r in rows if r["bin"] == b]
            tokens[str(b)] = round(sum(in_bin) / len(in_bin), 1)
    overall = mean_percent([r["score"] for r in rows]) if rows else None
    missing = mean_percent([not r["has_prefix"] for r in rows]) if rows else None
    return {"scores": scores, "counts": counts, "by_needles": by_needles, "average": average, "overall": overall,
            "rows": len(rows), "missing_hash": missing, "mean_prompt_tokens": tokens}


def plot(results: dict[str, Any], path: Path) -> None:
    from tapecli.eval.long_context import plot_lines

    series = {}
    for m in results["models"]:
        for n, cells in m["scores"].items():
            series[f"{m['name']}, {n} needles"] = [(int(b), v) for b, v in cells.items()]
    plot_lines(series, path, xlabel="prompt + answer tokens (upper edge of the bin)", ylabel="mean ratio (%)",
               title="MRCR: SequenceMatcher ratio by context length")
