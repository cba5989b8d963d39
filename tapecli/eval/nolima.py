"""NoLiMa (adobe-research/NoLiMa): a needle whose question shares no words with it (one-hop: "Which character has been
to Dresden?" for "Yuki lives next to the Semper Opera House"; two-hop: "... to the state of Saxony?") in a shuffled
book of growing length; accuracy per length, the base score and NoLiMa's effective length.

Data (`tapecli.data.nolima`): `--needle-set` the needle set JSON and `--haystack` the books (a folder of .txt files or
one), or the hub dataset `amodaresi/NoLiMa` for users with a network. Per model, every test of the needle set
(`expand`: experiment x question type x test), every book and every length in `--lengths` gets a series of
`--depths` trials (needle depths np.linspace(0, 100, N) %), seeded as run_tests.py seeds them (base seed + the
experiment's id + the book's number): the needle (its {CHAR} drawn from the character set) is placed in the book by
`Haystack` with the model's own tokenizer, the official task template is filled, and the model reads its tokenizer's
default special tokens + that text and decodes greedily up to 192 tokens (the official model configs' max_tokens),
stopping at EOS. The stripped answer is scored by async_evaluate.py's `_evaluate_response` (`--metric`, the run
configs' `contains` by default) against the drawn character or the test's gold answers.

results.json, per model: `scores[length]` (the percentage right over every test, book and depth), `by_question_type`
and `by_test` (the same per question type and per test), `mean_prompt_tokens[length]`, and from
`tapecli.eval.long_context` the base score (the mean at `--base-lengths`, NoLiMa's 250, 500 and 1000 when evaluated),
NoLiMa's effective length (the longest length up to which every score is at least 85 % of it), RULER's convention and
LongScore. `NoLiMa` is the protocol (a unit is one trial, (length, test, book, depth); the models share one folder);
the runner writes settings.json, samples.jsonl, results.json and nolima.png (score vs length, one line per model and
question type).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.long_context import THRESHOLD, check_base_lengths, headline, length_summary, mean_percent
from tapecli.eval.long_context import table as score_table
from tapecli.eval.protocol import Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "nolima.png"
PROTOCOL = ("NoLiMa (adobe-research/NoLiMa main: run_tests.py, async_evaluate.py, book_haystack.py): every test of "
            "the needle set x book x length, needle depths np.linspace(0, 100, depths) %, characters drawn from "
            "np.random.seed(base seed + id[:4] + book number); the needle placed with the model's own tokenizer; the "
            "official task template; default special tokens + prompt (no system prompt, no chat template); greedy "
            "decoding of up to 192 tokens, stopping at EOS; stripped; _evaluate_response with the metric; score = % "
            "right per length; base score = the mean at the base lengths; effective length: 85 % of it")

Unit = tuple[int, int, int, int]  # (length, test index, book index, depth index)


@dataclass
class NoLiMa(Evaluation):
    """NoLiMa on one model or several, with `tape eval nolima`'s options (see the module docstring)."""

    name = "nolima"
    unit = "trials"
    plot_file = PLOT_FILE
    together = True
    needle_set: str | None = None
    haystack: str | None = None
    lengths: list[int] = field(default_factory=lambda: list((250, 500, 1000, 2000, 4000, 8000, 16000, 32000)))
    depths: int = 26
    metric: str = "contains"
    seed: int = 42
    threshold: float = THRESHOLD
    base_lengths: list[int] | None = None
    tests: list[Any] = field(default_factory=list, init=False, repr=False)
    books: list[tuple[str, str, str]] = field(default_factory=list, init=False, repr=False)
    described: str = field(default="", init=False, repr=False)
    cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)  # see per_tokenizer

    def check(self, models: list[str]) -> None:
        from tapecli.data import nolima

        if self.metric not in nolima.METRICS:
            raise TapeError(f"--metric: one of {', '.join(nolima.METRICS)}, got {self.metric!r}")
        if self.depths < 1:
            raise TapeError(f"--depths must be a positive integer, got {self.depths}")
        self.lengths = sorted(set(self.lengths))
        if not self.lengths or min(self.lengths) < 1:
            raise TapeError(f"--lengths: positive token counts, got {self.lengths}")
        if self.base_lengths is None:
            self.base_lengths = [n for n in nolima.BASE_LENGTHS if n in self.lengths] or None
        self.base_lengths = check_base_lengths(self.base_lengths, self.lengths)
        experiments, self.described = nolima.needle_set(self.needle_set)
        self.tests = nolima.expand(experiments, self.seed)
        self.books = nolima.haystacks(self.haystack)

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "nolima", "models": [source_of(m)[1] for m in models], "needle_set": self.described,
                "haystack": [b[2] for b in self.books], "lengths": self.lengths, "depths": self.depths,
                "metric": self.metric, "seed": self.seed, "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def units(self, opened: OpenedModel) -> list[Unit]:
        return [(n, t, b, d) for n in self.lengths for t in range(len(self.tests)) for b in range(len(self.books))
                for d in range(self.depths)]

    def key(self, row: dict[str, Any]) -> Unit:
        return row["length"], row["test"], row["book"], row["depth"]

    cell_fields = 1  # batches: `batch_size` trials of one length at a time

    def trial(self, tokenizer: Any, unit: Unit) -> dict[str, Any]:
        """The prompt and gold answers of one trial for this tokenizer."""
        from tapecli.data import nolima

        length, t, b, d = unit
        test = self.tests[t]
        depth_list = nolima.depths(self.depths)
        character, distractor_depth = nolima.draws(test, test.seed + b, depth_list, length)[d]
        needle, question = test.needle, test.question
        if character is not None:
            needle, question = needle.replace("{CHAR}", character), question.replace("{CHAR}", character)
        haystack = self.haystack_for(tokenizer, b)
        text = (haystack.place(needle, length, depth_list[d], test.name) if test.distractor is None else
                haystack.place_with_distractor(needle, test.distractor, length, depth_list[d], distractor_depth,
                                               test.name))
        gold = [character] if character is not None else test.gold_answers
        return {"prompt": test.task_template.format(haystack=text, question=question), "gold": gold,
                "character": character}

    def haystack_for(self, tokenizer: Any, book: int) -> Any:
        from tapecli.data.nolima import Haystack
        from tapecli.eval.common import per_tokenizer

        name, text, _ = self.books[book]
        return per_tokenizer(self.cache.setdefault(book, {}), tokenizer, lambda: Haystack(name, text, tokenizer))

    def evaluate(self, opened: OpenedModel, units: list[Unit]) -> list[dict[str, Any]]:
        from tapecli.data.nolima import MAX_TOKENS, score
        from tapecli.eval.common import generate_texts

        trials = [self.trial(opened.tokenizer, unit) for unit in units]
        answers = generate_texts(opened, [t["prompt"] for t in trials], len(units), MAX_TOKENS)
        rows = []
        for (length, t, b, d), trial, answer in zip(units, trials, answers, strict=True):
            test = self.tests[t]
            rows.append({"length": length, "test": t, "book": b, "depth": d, "name": test.name,
                         "question_type": test.question_type, "character": trial["character"],
                         "prompt_tokens": len(opened.tokenizer.encode(trial["prompt"], add_special_tokens=True)),
                         "response": answer, "score": score(self.metric, answer, trial["gold"])})
        return rows

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        def percent(selected: list[dict[str, Any]]) -> dict[str, float]:
            return {str(n): mean_percent([r["score"] for r in selected if r["length"] == n]) for n in self.lengths
                    if any(r["length"] == n for r in selected)}

        scores = percent(rows)
        kinds = list(dict.fromkeys(t.question_type for t in self.tests))
        by_type = {k: percent([r for r in rows if r["question_type"] == k]) for k in kinds}
        by_test = {name: percent([r for r in rows if r["name"] == name]) for name in dict.fromkeys(
            t.name for t in self.tests)}
        tokens = {str(n): round(sum(r["prompt_tokens"] for r in rows if r["length"] == n)
                                / sum(r["length"] == n for r in rows), 1) for n in self.lengths}
        summary = length_summary({int(n): v for n, v in scores.items()}, self.threshold, self.base_lengths)
        return {**opened.record(), "scores": scores, **summary, "by_question_type": by_type, "by_test": by_test,
                "mean_prompt_tokens": tokens}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "nolima", "protocol": PROTOCOL, "threshold": self.threshold, "settings": settings,
                "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        from tapecli.eval.long_context import plot_lines

        series = {}
        for m in results["models"]:
            series[f"{m['name']}, all"] = [(int(n), v) for n, v in m["scores"].items()]
            for kind, cells in m["by_question_type"].items():
                series[f"{m['name']}, {kind}"] = [(int(n), v) for n, v in cells.items()]
        plot_lines(series, path, xlabel="context length (tokens)", ylabel="accuracy (%)",
                   title="NoLiMa: accuracy by context length")

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        lines = []
        for folder in results.values():
            lengths = folder["settings"]["lengths"]
            for m in folder["models"]:
                lines += ["", headline(m["name"], m, " tokens"),
                          score_table({"all": m["scores"], **m["by_question_type"]}, lengths, first="questions")]
        return "\n".join(lines)
