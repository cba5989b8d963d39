"""RULER (NVIDIA/RULER): 13 synthetic long-context tasks at several lengths, the effective context length.

Per model and (task, length), `tapecli.data.ruler.tasks.generate` makes the official samples with the model's own
tokenizer (seed 42: the same prompts for every model sharing a tokenizer). The model reads BOS (when its tokenizer
has one) + the tokens of `input + answer_prefix` (RULER's "base" template) and decodes greedily up to the family's
tokens_to_generate (niah 128, vt 30, cwe 120, fwe 50, qa 32), stopping at EOS. The prediction is post-processed and
scored by RULER's string match (`tapecli.eval.ruler_metric`: "all" for NIAH/vt/cwe/fwe, "part" for QA). A task's
score at a length is the mean over its samples x 100 (rounded to 2 decimals, as RULER rounds); the average at a
length is the mean over the tasks run. The effective length is the longest length up to which every evaluated
length's average exceeds the threshold (RULER: Llama-2-7B's 4K average, 85.6); results.json also holds NoLiMa's
effective length (85% of the model's own average at the base lengths, default the shortest) and LongScore
(`tapecli.eval.long_context`, which owns these conventions for every long-context evaluation).

Local sources: the essay haystack (`--haystack`) for niah_single_2/3, multikey_1, multivalue, multiquery; SQuAD /
HotpotQA files (`--qa-data`) for qa_1 / qa_2. With `--tasks all`, a task whose source is missing is skipped with one
line; named explicitly, it is an error. Essay sentences are split with NLTK's English Punkt model when installed (as
RULER), otherwise NLTK's untrained Punkt (settings.json names which).

`Ruler` is the protocol (`tapecli.eval.protocol`: a unit is one sample, (task, length, index); all models share one
folder, `together`). The runner writes, to --out (or RUN/eval-ruler/<checkpoint> for one model, else
./eval-ruler-comparison): settings.json, samples.jsonl (one row per model, task, length and sample: the resume log),
results.json, ruler.png (average score vs length, one line per model, the threshold dashed) and one task x length
heat-map per model (heatmap.png, or heatmap-<n>-<model>.png).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.common import generate_batch
from tapecli.eval.long_context import THRESHOLD, check_base_lengths, headline, length_summary, mean_percent
from tapecli.eval.long_context import table as score_table
from tapecli.eval.protocol import Candidate, Evaluation, Opening, run, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "ruler.png"
PROTOCOL = ("RULER (NVIDIA/RULER main): samples from the official generators (seed 42, base template, haystack sized "
            "with the model's tokenizer by RULER's binary search); prompt = BOS + input + answer_prefix; greedy "
            "decoding of up to the family's tokens_to_generate, stopping at EOS; RULER's post-processing and "
            "string match (all: niah, vt, cwe, fwe; part: qa); task score = mean x 100; average = mean over the "
            "tasks run; effective length = longest length up to which every average exceeds the threshold")


@dataclass
class Plan:
    """What will run: the tasks, the lines saying what was skipped, the generator's sources, their description."""

    tasks: list[str]
    skipped: list[str]
    sources: Any  # tapecli.data.ruler.tasks.Sources
    described: dict[str, Any]


def plan(tasks: str, haystack: str | None, qa_data: list[str] | None) -> Plan:
    """Expand --tasks, read the local sources, and skip (for `all`) or refuse (named) tasks whose source is missing."""
    from tapecli.data.ruler.constants import needs
    from tapecli.data.ruler.sources import read_essay, read_qa
    from tapecli.data.ruler.tasks import Sources, resolve_tasks
    from tapecli.data.ruler.words import wonderwords_version

    names = resolve_tasks(tasks)
    sources, described = Sources(), {"wonderwords": wonderwords_version(), "haystack": None, "qa_data": {}}
    if haystack:
        from tapecli.data.sentences import sentence_splitter

        sources.essay_words, digest = read_essay(haystack)
        splitter_name, sources.split_sentences = sentence_splitter()
        described["haystack"] = {"path": str(Path(haystack).expanduser().resolve()), "sha256": digest,
                                 "sentence_splitter": splitter_name}
    if qa_data:
        sources.qa, described["qa_data"] = read_qa(qa_data)
    available = {"essay": sources.essay_words is not None, "squad": "squad" in sources.qa,
                 "hotpotqa": "hotpotqa" in sources.qa}
    hints = {"essay": "the essay haystack (pass --haystack FILE_OR_DIR)", "squad": "SQuAD data (pass --qa-data FILE)",
             "hotpotqa": "HotpotQA data (pass --qa-data FILE)"}
    missing = {n: needs(n) for n in names if needs(n) and not available[needs(n)]}
    if missing and tasks.strip() != "all":
        name, source = next(iter(missing.items()))
        raise TapeError(f"--tasks {name} needs {hints[source]}")
    skipped = []
    for source in dict.fromkeys(missing.values()):
        these = [n for n in missing if missing[n] == source]
        skipped.append(f"skipping {', '.join(these)}: {'they need' if len(these) > 1 else 'it needs'} {hints[source]}")
    runnable = [n for n in names if n not in missing]
    if not runnable:
        raise TapeError("no task left to run; " + "; ".join(skipped))
    return Plan(runnable, skipped, sources, described)


def summarise(rows: list[dict[str, Any]], tasks: list[str], lengths: list[int], threshold: float,
              base_lengths: list[int] | None = None) -> dict[str, Any]:
    """Scores per task and length, the average per length, the effective lengths and LongScore (base: the shortest
    length unless `base_lengths` are given) of one model's rows."""
    scores: dict[str, dict[str, float]] = {}
    tokens: dict[str, dict[str, float]] = {}
    for task in tasks:
        for length in lengths:
            cell = [r for r in rows if r["task"] == task and r["length"] == length]
            scores.setdefault(task, {})[str(length)] = mean_percent([r["score"] for r in cell])
            tokens.setdefault(task, {})[str(length)] = sum(r["prompt_tokens"] for r in cell) / len(cell)
    averages = {n: round(sum(scores[t][str(n)] for t in tasks) / len(tasks), 2) for n in lengths}
    return {"scores": scores, "average": {str(n): a for n, a in averages.items()},
            "passes": {str(n): a > threshold for n, a in averages.items()},
            **length_summary(averages, threshold, base_lengths or [min(lengths)]), "mean_prompt_tokens": tokens}


@dataclass
class Ruler(Evaluation):
    """RULER on one model or several, with `tape eval ruler`'s options; the models share one folder, one
    settings.json and one results.json (`together`), each row naming its model by index. `notify` receives the
    lines saying which tasks `--tasks all` skips (before any model is opened)."""

    name = "ruler"
    unit = "samples"
    plot_file = PLOT_FILE
    files = ("heatmap*.png",)
    together = True
    tasks: str = "all"
    lengths: list[int] = field(default_factory=lambda: [4096])
    samples: int = 500
    seed: int = 42
    threshold: float = THRESHOLD
    haystack: str | None = None
    qa_data: list[str] | None = None
    notify: Callable[[str], None] | None = field(default=None, repr=False)
    base_lengths: list[int] | None = None  # NoLiMa's base score and LongScore's base (default: the shortest length)
    chosen: Plan | None = field(default=None, init=False, repr=False)  # the tasks that run, their sources
    cache: dict[Any, Any] = field(default_factory=dict, init=False, repr=False)  # see _samples

    def check(self, models: list[str]) -> None:
        for name, value in (("--lengths", min(self.lengths, default=0)), ("--samples", self.samples)):
            if value < 1:
                raise TapeError(f"{name} must be a positive integer, got {value}")
        self.base_lengths = check_base_lengths(self.base_lengths, self.lengths)
        self.chosen = plan(self.tasks, self.haystack, self.qa_data)
        for line in self.chosen.skipped:
            (self.notify or (lambda _: None))(line)

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        """The longest context fits (`tapecli.eval.budget`)."""
        from tapecli.eval.budget import check_prompt

        check_prompt(model.spec, model.config, opening, batch_size, max(self.lengths),
                     f"--lengths {max(self.lengths)}")

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "ruler", "models": [source_of(m)[1] for m in models], "tasks": self.chosen.tasks,
                "lengths": sorted(set(self.lengths)), "samples": self.samples, "seed": self.seed,
                **self.chosen.described, "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def units(self, opened: OpenedModel) -> list[tuple[str, int, int]]:
        return [(task, length, i) for task in self.chosen.tasks for length in sorted(set(self.lengths))
                for i in range(self.samples)]

    def key(self, row: dict[str, Any]) -> tuple[str, int, int]:
        return row["task"], row["length"], row["index"]

    cell_fields = 2  # batches: `batch_size` samples of one (task, length) at a time

    def evaluate(self, opened: OpenedModel, units: list[tuple[str, int, int]]) -> list[dict[str, Any]]:
        task, length, _ = units[0]
        cell = _samples(self.cache, opened.tokenizer, task, length, self.samples, self.chosen.sources, self.seed)
        return _answer(opened, [cell[i] for _, _, i in units], len(units))

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {**opened.record(), **summarise(rows, self.chosen.tasks, settings["lengths"], self.threshold,
                                                  self.base_lengths)}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "ruler", "protocol": PROTOCOL, "threshold": self.threshold, "skipped": self.chosen.skipped,
                "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        _plot(results, path.parent)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        return "\n".join(_table(entry, folder["threshold"], folder["settings"]["lengths"])
                         for folder in results.values() for entry in folder["models"])


def evaluate_ruler(
    models: list[str],
    out_dir: str | Path | None,
    tasks: str = "all",
    lengths: list[int] | None = None,
    samples: int = 500,
    seed: int = 42,
    threshold: float = THRESHOLD,
    haystack: str | None = None,
    qa_data: list[str] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    pe_args: dict[str, Any] | None = None,
    batch_size: int = 1,
    show_progress: bool = True,
    notify: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) RULER for every model into `out_dir` (None: the runner's default folder); returns what
    results.json holds."""
    evaluation = Ruler(tasks, lengths or [4096], samples, seed, threshold, haystack, qa_data, notify)
    report = run(evaluation, models, out_dir, dtype=dtype, device=device, pe_args=pe_args, batch_size=batch_size,
                 show_progress=show_progress)
    return report.results[evaluation.name]


def _table(entry: dict[str, Any], threshold: float, lengths: list[int]) -> str:
    """One model's scores as a Markdown table, after a line with its effective lengths."""
    return "\n" + headline(entry["name"], entry) + "\n" + score_table({**entry["scores"], "average": entry["average"]},
                                                                      lengths)


def _samples(cache: dict, tokenizer: Any, task: str, length: int, samples: int, sources: Any, seed: int) -> list:
    """The official samples of (task, length) for this tokenizer, made once per tokenizer."""
    from tapecli.data.ruler.tasks import generate
    from tapecli.eval.common import per_tokenizer

    made = per_tokenizer(cache, tokenizer, dict)  # (task, length) -> samples
    if (task, length) not in made:
        made[task, length] = generate(task, length, lambda text: len(tokenizer.encode(text)), samples, sources, seed)
    return made[task, length]


def _answer(opened: Any, batch: list, batch_size: int) -> list[dict[str, Any]]:
    """Greedy answers to a batch of samples of one (task, length), scored; one samples.jsonl row each."""
    from tapecli.data.ruler.constants import FAMILIES, METRICS, TASKS
    from tapecli.eval.ruler_metric import postprocess, sample_score

    tokenizer = opened.tokenizer
    family = TASKS[batch[0].task][0]
    bos, eos = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)
    prompts = [([bos] if bos is not None and bos >= 0 else []) + tokenizer.encode(s.prompt) for s in batch]
    stop = [eos] if eos is not None and eos >= 0 else None
    outputs = generate_batch(opened.model, prompts, FAMILIES[family].tokens_to_generate, batch_size=batch_size,
                             stop_tokens=stop, pad_id=eos if stop else None)
    rows = []
    for sample, prompt, output in zip(batch, prompts, outputs, strict=True):
        if stop and eos in output:
            output = output[: output.index(eos)]
        prediction = postprocess(tokenizer.decode(output))
        rows.append({"task": sample.task, "length": sample.max_length, "index": sample.index,
                     "prompt_tokens": len(prompt), "ruler_length": sample.length, "outputs": sample.outputs,
                     "prediction": prediction, "score": sample_score(METRICS[family], prediction, sample.outputs)})
    return rows


def _plot(results: dict[str, Any], out: Path) -> None:
    from tapecli.eval.long_context import plot_grid, plot_lines, safe_name

    models = results["models"]
    lengths = results["settings"]["lengths"]
    series = {m["name"]: [(n, m["average"][str(n)]) for n in lengths] for m in models}
    plot_lines(series, out / PLOT_FILE, xlabel="sequence length (tokens)", ylabel="RULER average score",
               title=f"RULER ({len(results['settings']['tasks'])} tasks); dashed: threshold {results['threshold']}",
               threshold=results["threshold"])
    for k, m in enumerate(models):
        name = "heatmap.png" if len(models) == 1 else f"heatmap-{k}-{safe_name(m['name'])}.png"
        eff = m["effective_length"]
        plot_grid({**m["scores"], "average": m["average"]}, lengths, out / name, xlabel="sequence length (tokens)",
                  ylabel="task", title=f"RULER: {m['name']} (effective length: {eff if eff else 'none'})")
