"""BABILong (Kuratov et al. 2024, arXiv 2406.10149; booydar/babilong): bAbI's qa1-qa5 hidden in distractor text of
growing length; exact-match accuracy per task, length and depth; the effective lengths and LongScore.

Options left unset take the `eval:` keys of the models' run when it trained on data kind `babilong` (and its
`data.prompt`), else tape's defaults (all tasks; 0, 1K, 2K, 4K, 8K and 16K tokens; depths 0, 0.25, 0.5, 0.75, 1; 20
samples per cell; seed 0; the bare prompt).

Per model and (task, length, depth), the samples come from tape's generator (`tapecli.data.babilong.samples`: bAbI's
world simulated offline, RULER's noise sentences or `--haystack` text, the model's own tokenizer, `--seed`), or with
`--data DIR` from BABILong's own files (`tapecli.data.babilong.official`; then there is no depth). The model reads
its tokenizer's default special tokens + BABILong's prompt (`--prompt full | no-examples | bare`) and decodes
greedily up to 15 tokens (BABILong's `max_new_tokens`), stopping at EOS; the decoded text, stripped, is scored by
BABILong's `compare_answers` (`tapecli.eval.babilong_metric`). A task's score at a length is the percentage of its
samples answered right over all depths; the average at a length is the mean over the tasks run. Length 0 is
BABILong's "0k": the facts alone.

Depths (`--depths`): each (task, length > 0, depth) cell holds `--samples` samples whose facts lie in a window of the
distractor text at that depth (`--depth-window`, a fraction of the text); `--depths any` puts them anywhere
(BABILong's default). The cells of different depths hold different stories (story j = depth's position x samples +
sample), and every length the same ones; length 0 holds all of them once.

results.json, per model: `scores[task][length]`, `average[length]`, `by_depth[task][length][depth]` and
`depth_average[length][depth]` (with depths), `passes`, `mean_prompt_tokens[length]`, and from
`tapecli.eval.long_context` both effective lengths (RULER's 85.6 threshold on the average; NoLiMa's 85 % of the
average at the base lengths, default the shortest) and LongScore. `Babilong` is the protocol (a unit is one sample,
(task, length, depth, index); the models share one folder, `together`); the runner writes settings.json,
samples.jsonl, results.json, babilong.png (average vs length per model), a task x length heat-map per model
(heatmap*.png) and, with depths, a length x depth heat-map per task for each model (depth*.png).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.data.babilong.samples import TOKENS_TO_GENERATE
from tapecli.data.babilong.world import resolve_tasks
from tapecli.errors import TapeError
from tapecli.eval.common import generate_texts
from tapecli.eval.long_context import THRESHOLD, check_base_lengths, headline, length_summary, mean_percent
from tapecli.eval.long_context import table as score_table
from tapecli.eval.protocol import Candidate, Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "babilong.png"
DEFAULTS = {"tasks": "all", "lengths": [0, 1024, 2048, 4096, 8192, 16384], "depths": [0.0, 0.25, 0.5, 0.75, 1.0],
            "samples": 20, "seed": 0, "prompt": "bare"}
NO_DEPTH, ANY_DEPTH = "-", "any"
PROTOCOL = ("BABILong (booydar/babilong main): bAbI qa1-qa5 stories from tape's simulator of bAbI's world (or "
            "BABILong's files with --data), hidden in RULER's noise sentences or --haystack text sized with the "
            "model's tokenizer so that prompt + 15 tokens fit the length (0: facts only), facts at the given depth "
            "window; BABILong's prompt template; default special tokens + prompt; greedy decoding of up to 15 "
            "tokens, stopping at EOS; BABILong's compare_answers; score = % of samples right; average over tasks; "
            "effective lengths and LongScore as tapecli.eval.long_context defines them")

Unit = tuple[str, int, str, int]  # (task, length, depth, index)


def run_defaults(models: list[str], given: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """The eval keys (and the prompt style) of the runs the models come from, when they trained on kind babilong:
    what the evaluation defaults to for them, less the `given` ones (options set on the command line). Runs that
    differ in a key not given need that option."""
    from tapecli.store.run import run_recipe

    found = []
    for model in models:
        kind, source = source_of(model)
        recipe = run_recipe(Path(source)) if kind == "tape" else None
        if recipe is not None and recipe.data.kind == "babilong":
            e = recipe.eval
            keys = {"tasks": e.tasks, "lengths": e.lengths, "depths": ANY_DEPTH if e.depths is None else e.depths,
                    "samples": e.samples, "seed": e.seed, "prompt": recipe.data.prompt}
            found.append({k: v for k, v in keys.items() if k not in given})
    differ = [k for k in DEFAULTS if any(f.get(k) != found[0].get(k) for f in found)]
    if differ:
        options = ", ".join(f"--{k}" for k in differ)
        raise TapeError(f"the models come from babilong runs with different eval keys ({options}); pass {options} "
                        "to evaluate them alike")
    return found[0] if found else {}


def depth_key(depth: float | None) -> str:
    return ANY_DEPTH if depth is None else f"{depth:g}"


@dataclass
class Babilong(Evaluation):
    """BABILong on one model or several, with `tape eval babilong`'s options (see the module docstring)."""

    name = "babilong"
    unit = "samples"
    plot_file = PLOT_FILE
    files = ("heatmap*.png", "depth*.png")
    together = True
    # None: the eval keys of the models' run when it trained on kind babilong, else DEFAULTS.
    tasks: str | None = None
    lengths: list[int] | None = None
    depths: list[float] | str | None = None  # "any": anywhere (BABILong's own placement)
    samples: int | None = None
    seed: int | None = None
    prompt: str | None = None
    haystack: str | None = None
    data: str | None = None
    window: float = 0.2
    threshold: float = THRESHOLD
    base_lengths: list[int] | None = None
    chosen: list[str] = field(default_factory=list, init=False, repr=False)
    sources: dict[str, Any] = field(default_factory=dict, init=False, repr=False)  # haystack or official rows
    cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)  # see per_tokenizer

    def check(self, models: list[str]) -> None:
        from tapecli.data.babilong.prompts import STYLES

        given = {key for key in DEFAULTS if getattr(self, key) is not None}
        for key, value in {**DEFAULTS, **run_defaults(models, given)}.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if isinstance(self.depths, str):
            if self.depths != ANY_DEPTH:
                raise TapeError(f"--depths: fractions in [0, 1] or `any`, got {self.depths!r}")
            self.depths = None
        self.chosen = resolve_tasks(self.tasks)
        self.lengths = sorted(set(self.lengths))
        if not self.lengths or min(self.lengths) < 0:
            raise TapeError(f"--lengths: token counts of 0 (facts only) or more, got {self.lengths}")
        if self.samples < 1:
            raise TapeError(f"--samples must be a positive integer, got {self.samples}")
        if self.prompt not in STYLES:
            raise TapeError(f"--prompt: expected one of {', '.join(STYLES)}, got {self.prompt!r}")
        if not 0 < self.window <= 1:
            raise TapeError(f"--depth-window must be in (0, 1], got {self.window}")
        bad = [d for d in self.depths or [] if not 0 <= d <= 1]
        if bad or self.depths == []:
            raise TapeError(f"--depths: fractions in [0, 1] or `any`, got {bad or self.depths}")
        self.base_lengths = check_base_lengths(self.base_lengths, self.lengths)
        if self.data is not None:
            if self.haystack:
                raise TapeError("--data reads BABILong's own samples, which hold their haystack: drop --haystack")
            self._read_official()
        elif self.haystack:
            self._read_haystack()

    def _read_official(self) -> None:
        from tapecli.data.babilong import official

        rows, described = {}, []
        for task in self.chosen:
            for length in self.lengths:
                rows[task, length], files = official.rows(self.data, task, length)
                if len(rows[task, length]) < self.samples:
                    raise TapeError(f"--data {self.data}: {task} at {official.length_name(length)} has "
                                    f"{len(rows[task, length])} samples, fewer than --samples {self.samples}")
                described += files
        self.sources = {"rows": rows, "described": {"path": str(Path(self.data).expanduser().resolve()),
                                                    "files": described}}

    def _read_haystack(self) -> None:
        from tapecli.data.ruler.sources import read_essay
        from tapecli.data.sentences import sentence_splitter

        words, digest = read_essay(self.haystack)
        splitter_name, split = sentence_splitter()
        self.sources = {"essay": (words, split), "described": {
            "path": str(Path(self.haystack).expanduser().resolve()), "sha256": digest,
            "sentence_splitter": splitter_name}}

    def cells(self) -> list[tuple[str, int, str, int]]:
        """(task, length, depth, first story) of every cell, each with `samples` samples (length 0: all stories)."""
        depths = [NO_DEPTH] if self.data is not None else [depth_key(d) for d in (self.depths or [None])]
        out = []
        for task in self.chosen:
            for length in self.lengths:
                if length == 0 or self.data is not None:
                    out.append((task, length, NO_DEPTH, 0))
                else:
                    out += [(task, length, d, k * self.samples) for k, d in enumerate(depths)]
        return out

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        """The longest haystack, with the answer's tokens, fits (`tapecli.eval.budget`)."""
        from tapecli.eval.budget import check_prompt

        check_prompt(model.spec, model.config, opening, batch_size, self.lengths[-1] + TOKENS_TO_GENERATE,
                     f"--lengths {self.lengths[-1]}")

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        source = ({"data": self.sources["described"]} if self.data is not None else
                  {"haystack": self.sources.get("described"), "seed": self.seed,
                   "depths": None if self.depths is None else [depth_key(d) for d in self.depths],
                   "depth_window": self.window})
        return {"task": "babilong", "models": [source_of(m)[1] for m in models], "tasks": self.chosen,
                "lengths": self.lengths, "samples": self.samples, "prompt": self.prompt, **source,
                "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def units(self, opened: OpenedModel) -> list[Unit]:
        out = []
        for task, length, depth, first in self.cells():
            count = self.samples * len(self.depths or [None]) if depth == NO_DEPTH and self.data is None \
                else self.samples
            out += [(task, length, depth, first + i) for i in range(count)]
        return out

    def key(self, row: dict[str, Any]) -> Unit:
        return row["task"], row["length"], row["depth"], row["index"]

    cell_fields = 2  # batches: `batch_size` samples of one (task, length) at a time

    def sample(self, tokenizer: Any, unit: Unit) -> Any:
        """The sample of a unit for this tokenizer."""
        from tapecli.data.babilong.prompts import format_prompt
        from tapecli.data.babilong.samples import BabilongSample

        task, length, depth, index = unit
        if self.data is not None:
            row = self.sources["rows"][task, length][index]
            prompt = format_prompt(task, self.prompt, row["input"], row["question"])
            return BabilongSample(task, length, None, index, row["input"], row["question"], row["target"], prompt,
                                  len(tokenizer.encode(prompt, add_special_tokens=True)))
        return self.generator(tokenizer).sample(task, length, None if depth in (NO_DEPTH, ANY_DEPTH)
                                                else float(depth), index)

    def generator(self, tokenizer: Any) -> Any:
        from tapecli.data.babilong.samples import Generator, Haystack
        from tapecli.eval.common import per_tokenizer

        def make() -> Generator:
            haystack = Haystack(*self.sources["essay"]) if "essay" in self.sources else Haystack()
            return Generator(tokenizer, haystack, self.prompt, self.seed, self.window)

        return per_tokenizer(self.cache, tokenizer, make)

    def evaluate(self, opened: OpenedModel, units: list[Unit]) -> list[dict[str, Any]]:
        samples = [self.sample(opened.tokenizer, unit) for unit in units]
        predictions = generate_texts(opened, [s.prompt for s in samples], len(units), TOKENS_TO_GENERATE)
        rows = []
        for unit, sample, prediction in zip(units, samples, predictions, strict=True):
            rows.append({"task": unit[0], "length": unit[1], "depth": unit[2], "index": unit[3],
                         "prompt_tokens": sample.prompt_tokens, "question": sample.question,
                         "target": sample.target, "prediction": prediction,
                         "score": float(score(unit[0], sample.target, prediction, sample.question)),
                         **{k: sample.extra[k] for k in ("support", "fact_depths") if k in sample.extra}})
        return rows

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {**opened.record(), **summarise(rows, self.chosen, settings["lengths"], self.threshold,
                                                  self.base_lengths)}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "babilong", "protocol": PROTOCOL, "threshold": self.threshold, "settings": settings,
                "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        plot(results, path.parent)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        return "\n".join(table(entry, folder["settings"]["lengths"]) for folder in results.values()
                         for entry in folder["models"])


def score(task: str, target: str, prediction: str, question: str) -> bool:
    from tapecli.eval.babilong_metric import TASK_LABELS, compare_answers

    return compare_answers(target, prediction, question, TASK_LABELS[task])


def summarise(rows: list[dict[str, Any]], tasks: list[str], lengths: list[int], threshold: float,
              base_lengths: list[int]) -> dict[str, Any]:
    """Scores per task and length (and depth), averages, effective lengths and LongScore of one model's rows."""
    scores: dict[str, dict[str, float]] = {}
    by_depth: dict[str, dict[str, dict[str, float]]] = {}
    tokens: dict[str, float] = {}
    for length in lengths:
        at_length = [r for r in rows if r["length"] == length]
        tokens[str(length)] = round(sum(r["prompt_tokens"] for r in at_length) / len(at_length), 1)
        for task in tasks:
            cell = [r for r in at_length if r["task"] == task]
            scores.setdefault(task, {})[str(length)] = mean_percent([r["score"] for r in cell])
            for depth in dict.fromkeys(r["depth"] for r in cell):
                if depth != NO_DEPTH:
                    by_depth.setdefault(task, {}).setdefault(str(length), {})[depth] = mean_percent(
                        [r["score"] for r in cell if r["depth"] == depth])
    averages = {n: round(sum(scores[t][str(n)] for t in tasks) / len(tasks), 2) for n in lengths}
    out = {"scores": scores, "average": {str(n): a for n, a in averages.items()},
           "passes": {str(n): a > threshold for n, a in averages.items()},
           **length_summary(averages, threshold, base_lengths), "mean_prompt_tokens": tokens}
    if by_depth:
        depths = list(dict.fromkeys(d for t in by_depth.values() for cells in t.values() for d in cells))
        out["by_depth"] = by_depth
        out["depth_average"] = {n: {d: round(sum(by_depth[t][n][d] for t in tasks) / len(tasks), 2) for d in depths}
                                for n in by_depth[tasks[0]]}
    return out


def table(entry: dict[str, Any], lengths: list[int]) -> str:
    """One model's scores per task and length (Markdown), after its effective lengths; with depths, then the average
    over the tasks per depth and length."""
    text = "\n" + headline(entry["name"], entry) + "\n" + score_table({**entry["scores"], "average": entry["average"]},
                                                                      lengths)
    if "depth_average" in entry:
        columns = [n for n in lengths if str(n) in entry["depth_average"]]
        rows = {f"depth {d}": {str(n): entry["depth_average"][str(n)][d] for n in columns}
                for d in entry["depth_average"][str(columns[0])]}
        text += "\n\n" + score_table(rows, columns, first="average by depth")
    return text


def plot(results: dict[str, Any], out: Path) -> None:
    from tapecli.eval.long_context import plot_grid, plot_lines, safe_name
    from tapecli.eval.plots import save_grid_heatmaps

    models, lengths = results["models"], results["settings"]["lengths"]
    series = {m["name"]: [(n, m["average"][str(n)]) for n in lengths] for m in models}
    plot_lines(series, out / PLOT_FILE, xlabel="length (tokens; 0: facts only)", ylabel="BABILong accuracy (%)",
               title=f"BABILong ({', '.join(results['settings']['tasks'])}); dashed: threshold "
                     f"{results['threshold']}", threshold=results["threshold"])
    for k, m in enumerate(models):
        suffix = "" if len(models) == 1 else f"-{k}-{safe_name(m['name'])}"
        plot_grid({**m["scores"], "average": m["average"]}, lengths, out / f"heatmap{suffix}.png",
                  xlabel="length (tokens)", ylabel="task",
                  title=f"BABILong: {m['name']} (effective length: {m['effective_length'] or 'none'})")
        if "by_depth" in m:
            columns = [n for n in lengths if str(n) in m["depth_average"]]
            depths = list(m["depth_average"][str(columns[0])])
            panels = [(task, [[cells[str(n)].get(d, float("nan")) / 100 for n in columns] for d in depths])
                      for task, cells in [*m["by_depth"].items(), ("average", m["depth_average"])]]
            save_grid_heatmaps(panels, out / f"depth{suffix}.png", x_labels=[str(n) for n in columns],
                               y_labels=depths, xlabel="length (tokens)", ylabel="depth of the facts",
                               title=f"BABILong accuracy by length and depth: {m['name']}")

