"""The shape of an evaluation, and the one runner that does everything but its protocol.

An evaluation is a subclass of `Evaluation` (a dataclass of its options) that declares only its protocol:

    name, unit, plot_file        its folder (eval-<name>) and label, what its progress bar counts, its PNG
    check(models)                options and models, before any model is opened or any file written (optional)
    check_model(model, opening, batch_size)   each model before any is opened (a `Candidate`: its configuration
                                 read without weights, its tokenizer on request): what this protocol cannot run on
                                 it, or what would not fit (optional)
    prepare(opened)              per-model state the other hooks need: a token stream, the budgets that fit
                                 (optional; kept on `self`, replaced by the next model's)
    settings(opened) -> dict     what determines the results: settings.json, compared when a run resumes
    units(opened) -> [unit]      every unit of work, in order (a cell, a window, a trial; hashable)
    key(row) -> unit             the unit a finished samples.jsonl row belongs to: what makes resuming work
    keep(rows) -> rows           which rows an interrupted run left count as finished (optional; e.g. whole cells)
    batches(todo, batch_size)    how units are grouped for `evaluate` (optional; default batch_size at a time,
                                 within one cell when `cell_fields` names how many leading unit fields make one)
    evaluate(opened, units) -> rows     the work: samples.jsonl rows for a batch of units, on an opened model
    results(opened, settings, rows) -> dict     results.json (the runner appends seconds_this_session)
    plot(results, path, label), compare(results by label, folder)   its PNG; the PNG comparing several models
    summary(results by label) -> str | rich renderable                 what `tape eval <name>` prints

`run(evaluation, models, out, dtype=, device=, pe_args=, batch_size=)` does all the rest: it checks the options,
--out and every model (`tapecli.store.door.model_config`: it exists, its configuration and --pe-arg are valid,
`check_model`) before any work, opens each model in turn through the one door, `tapecli.store.door.open_model` (a
tape run, checkpoint or Hugging Face model; or takes an `OpenedModel` as it is), picks each model's folder (--out,
or the one rule of `tapecli.store.run.eval_dir`: RUN/eval-<name>/<checkpoint>), writes settings.json + samples.jsonl
through `SamplesLog` (a rerun resumes: units already logged are not redone), shows a progress bar, writes
results.json and the plot atomically, frees the model, and with several models writes their comparison
(comparison.json + the `compare` PNG) to --out (default ./eval-<name>-comparison). An evaluation whose models share
one folder and one results.json (perplexity's table) sets `together = True` and declares `shared_settings` and
`combine` instead of `settings`; each row then starts with the model's index ("model": i).

A minimal evaluation (a CLI command then calls `run(Echo(n=4), models, out, ...)`):

    @dataclass
    class Echo(Evaluation):
        name = "echo"                      # RUN/eval-echo/<checkpoint>
        unit = "prompts"
        n: int = 4

        def settings(self, opened):
            return {"task": "echo", "model": opened.record(), "n": self.n}

        def units(self, opened):
            return list(range(self.n))

        def key(self, row):
            return row["index"]

        def evaluate(self, opened, units):
            return [{"index": i, "correct": ...} for i in units]

        def results(self, opened, settings, rows):
            return {"task": "echo", "settings": settings, "accuracy": sum(r["correct"] for r in rows) / len(rows)}
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tapecli.errors import TapeError
from tapecli.eval.common import RESULTS_FILE, SAMPLES_FILE, NonFiniteLogits, SamplesLog, progress_bar
from tapecli.files import write_atomic, write_json
from tapecli.store.claim import claim
from tapecli.store.door import OpenedModel, find_source, model_config, open_model
from tapecli.store.run import check_output, eval_dir

if TYPE_CHECKING:
    from tapecli.model import ModelConfig

COMPARISON_FILE = "comparison.json"


class Evaluation(ABC):
    """One evaluation protocol (see the module docstring); subclasses are dataclasses of their options."""

    name: ClassVar[str]  # its folder eval-<name>, and the label of its progress bars
    unit: ClassVar[str] = "units"  # what the progress bar counts
    plot_file: ClassVar[str | None] = None  # the PNG `plot` writes beside results.json
    cell_fields: ClassVar[int] = 0  # batches share the first N fields of their units (`batches`); 0: any units
    files: ClassVar[tuple[str, ...]] = ()  # further files `results` writes beside results.json
    timed: ClassVar[bool] = True  # results.json ends with seconds_this_session
    together: ClassVar[bool] = False  # several models share one folder and one results.json

    def check(self, models: list[str]) -> None:
        """Fail with one line on a bad option or model (given by name) before any work: nothing is opened yet."""
        return None  # nothing by default

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        """Fail with one line naming `model.spec` when this protocol cannot run on it or would not fit, from its
        configuration (and tokenizer) alone, no weights loaded; called for every model before the first is opened."""
        return None  # nothing by default

    def prepare(self, opened: OpenedModel) -> None:
        """Compute what the other hooks need for this model (on `self`); called first, once per model."""
        return None  # nothing by default

    def settings(self, opened: OpenedModel) -> dict[str, Any]:
        """What determines this model's results: settings.json, compared when a run resumes into its folder."""
        raise NotImplementedError(f"{type(self).__name__} declares no settings")

    @abstractmethod
    def units(self, opened: OpenedModel) -> list[Hashable]:
        """Every unit of work for this model, in order."""

    @abstractmethod
    def key(self, row: dict[str, Any]) -> Hashable:
        """The unit a finished row belongs to (equal to an element of `units`)."""

    def keep(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows an interrupted run logged that count as finished (all of them, unless a unit has several)."""
        return rows

    def batches(self, todo: list[Hashable], batch_size: int) -> Iterator[list[Hashable]]:
        """The units still to do, grouped for `evaluate`: `batch_size` at a time, and with `cell_fields` set, only
        units (tuples) that share their first `cell_fields` fields (one cell: prompts of about one length)."""
        if self.cell_fields:
            for _, cell in itertools.groupby(todo, key=lambda unit: unit[:self.cell_fields]):
                cell = list(cell)
                for start in range(0, len(cell), batch_size):
                    yield cell[start : start + batch_size]
            return
        for start in range(0, len(todo), batch_size):
            yield todo[start : start + batch_size]

    @abstractmethod
    def evaluate(self, opened: OpenedModel, units: list[Hashable]) -> list[dict[str, Any]]:
        """The rows (JSON objects) of a batch of units: appended to samples.jsonl as soon as they are returned."""

    @abstractmethod
    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        """What this model's rows summarise to: results.json (or, `together`, this model's entry in it)."""

    def dumps(self, results: dict[str, Any]) -> str:
        """results.json's text."""
        return json.dumps(results, indent=1) + "\n"

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        """Write `plot_file` (at `path`) from one folder's results."""
        return None  # nothing by default

    def compare(self, results: dict[str, dict[str, Any]], folder: Path) -> None:
        """Write the picture comparing several models ({label: results}) into the comparison folder."""
        return None  # nothing by default

    def label(self, opened: OpenedModel, taken: dict[str, Any]) -> str:
        """A short name for this model in tables, plots and folders (`run` makes it unique among `taken`)."""
        return opened.name

    def summary(self, results: dict[str, dict[str, Any]]) -> Any:
        """What the CLI prints for {label: results}: text, or a rich renderable (a table)."""
        return ""

    # `together` evaluations: one folder and one results.json for all models.
    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        """settings.json of the shared folder, known before any model is opened."""
        raise NotImplementedError(f"{type(self).__name__} is not evaluated `together`")

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        """results.json of the shared folder from each model's `results` entry."""
        raise NotImplementedError(f"{type(self).__name__} is not evaluated `together`")


@dataclass(frozen=True)
class Opening:
    """How `run` opens a model given by name (`open_model`'s options); an `OpenedModel` is taken as it is."""

    dtype: str = "auto"
    device: str = "auto"
    pe_args: dict[str, Any] = field(default_factory=dict)

    def open(self, model: str | OpenedModel) -> OpenedModel:
        if isinstance(model, OpenedModel):
            return model
        return open_model(model, dtype=self.dtype, device=self.device, pe_args=self.pe_args)

    def dtype_name(self) -> str:
        """The weights' dtype the models get (auto resolved for the device), for settings."""
        from tapecli.runtime import resolve_device, resolve_dtype

        return resolve_dtype(self.dtype, resolve_device(self.device))[0]


@dataclass
class Candidate:
    """A model as `Evaluation.check_model` sees it, before any model is opened: the spec as given, the configuration
    it opens with (`tapecli.store.door.model_config`), and its tokenizer, read on request."""

    spec: str
    config: ModelConfig
    opened: OpenedModel | None = None  # a model given in memory

    def tokenizer(self) -> Any:
        from tapecli.store.door import model_tokenizer

        return self.opened.tokenizer if self.opened is not None else model_tokenizer(self.spec)


@dataclass
class Report:
    """What `run` wrote: each folder's results.json content and the folder, by model label (a `together`
    evaluation: one entry, under the evaluation's name), and the comparison folder (several models)."""

    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    folders: dict[str, Path] = field(default_factory=dict)
    comparison: Path | None = None

    def wrote(self, evaluation: Evaluation) -> str:
        """One line naming the files written and where, for the CLI."""
        files = [RESULTS_FILE, SAMPLES_FILE, *evaluation.files, *[f for f in [evaluation.plot_file] if f]]
        names = ", ".join(files[:-1]) + f" and {files[-1]}"
        line = f"wrote {names} to {', '.join(str(f) for f in dict.fromkeys(self.folders.values()))}"
        if self.comparison is not None:
            line += f"; the comparison ({', '.join([COMPARISON_FILE, *[f for f in [evaluation.plot_file] if f]])})"
            line += f" to {self.comparison}"
        return line


def run(evaluation: Evaluation, models: list[str | OpenedModel], out: str | Path | None = None, *,
        dtype: str = "auto", device: str = "auto", pe_args: dict[str, Any] | None = None, batch_size: int = 1,
        show_progress: bool = True) -> Report:
    """Evaluate (or resume) every model under `evaluation`'s protocol; see the module docstring for the folders.

    Models are opened one at a time (`open_model(spec, dtype=, device=, pe_args=)`), so only one is in memory.
    One model writes to `out` (default: its `eval_dir`); several write to OUT/<label>/ (default: each its own
    `eval_dir`) and their comparison to `out` (default ./eval-<name>-comparison), unless `together`.
    """
    if not models:
        raise TapeError("--model: pass at least one model")
    _check_batch_size(batch_size)
    if out is not None:
        check_output(out)
    opening = Opening(dtype, device, dict(pe_args or {}))
    evaluation.check([m for m in models if not isinstance(m, OpenedModel)])
    check_models(evaluation, models, opening, batch_size)
    if evaluation.together:
        return _run_together(evaluation, models, out, opening, batch_size, show_progress)
    report = Report()
    for index, model in enumerate(models):
        if index:
            free_memory()  # the previous model's, before this one is opened
        opened = opening.open(model)
        label = evaluation.label(opened, report.results)
        while label in report.results:
            label += "'"
        if out is None:
            folder = default_folder(evaluation.name, opened)
        else:
            folder = Path(out) / label.replace("/", "_") if len(models) > 1 else Path(out)
        report.results[label] = evaluate_one(evaluation, opened, folder, label=label, batch_size=batch_size,
                                             show_progress=show_progress)
        report.folders[label] = folder
        del opened
    if len(models) > 1:
        report.comparison = Path(out) if out is not None else Path(f"eval-{evaluation.name}-comparison")
        with claim(report.comparison):
            write_json(report.comparison / COMPARISON_FILE, report.results)
            evaluation.compare(report.results, report.comparison)
    return report


def check_models(evaluation: Evaluation, models: list[str | OpenedModel], opening: Opening,
                 batch_size: int = 1) -> None:
    """Every model exists, opens with a valid configuration (and --pe-arg) and suits `evaluation`, read without
    weights, before any of them is opened: a bad second --model is refused before the first is evaluated."""
    for model in models:
        if isinstance(model, OpenedModel):
            candidate = Candidate(model.spec, model.model.config, model)
        else:
            candidate = Candidate(model, model_config(model, pe_args=opening.pe_args))
        evaluation.check_model(candidate, opening, batch_size)


def evaluate_one(evaluation: Evaluation, opened: OpenedModel, folder: str | Path, *, label: str | None = None,
                 batch_size: int = 1, show_progress: bool = True) -> dict[str, Any]:
    """Evaluate (or resume) one opened model into `folder`; returns what its results.json holds. (`run` calls it
    for each model; call it directly for a model in memory, `as_opened`, after `evaluation.check([])`.)"""
    _check_batch_size(batch_size)
    started = time.perf_counter()
    evaluation.prepare(opened)
    settings = evaluation.settings(opened)
    units = evaluation.units(opened)
    label = label or opened.name
    with SamplesLog(folder, settings, keep=evaluation.keep) as log, \
            progress_bar(evaluation.unit, show_progress) as progress:
        rows = _work(evaluation, opened, units, log, progress, f"{evaluation.name} {label}", batch_size)
    return _finish(evaluation, evaluation.results(opened, settings, rows), Path(folder), label, started)


def _run_together(evaluation: Evaluation, models: list[str | OpenedModel], out: str | Path | None,
                  opening: Opening, batch_size: int, show_progress: bool) -> Report:
    """All models in one folder: one settings.json for all, rows tagged with the model's index, one results.json."""
    if out is not None:
        folder = Path(out)
    elif len(models) == 1:
        folder = default_folder(evaluation.name, models[0])
    else:
        folder = Path(f"eval-{evaluation.name}-comparison")
    started = time.perf_counter()
    settings = evaluation.shared_settings(models, opening)
    entries, names = [], []
    with SamplesLog(folder, settings, keep=evaluation.keep) as log, \
            progress_bar(evaluation.unit, show_progress) as progress:
        for index, model in enumerate(models):
            if index:
                free_memory()
            opened = opening.open(model)
            evaluation.prepare(opened)
            units = evaluation.units(opened)
            rows = _work(evaluation, opened, units, log, progress, f"{evaluation.name} {opened.name}", batch_size,
                         tag={"model": index})
            entries.append(evaluation.results(opened, settings, rows))
            names.append(opened.name)
            del opened
    results = _finish(evaluation, evaluation.combine(settings, entries), folder, ", ".join(names), started)
    return Report({evaluation.name: results}, {evaluation.name: folder})


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise TapeError(f"--batch-size must be a positive integer, got {batch_size}")


def _work(evaluation: Evaluation, opened: OpenedModel, units: list[Hashable], log: SamplesLog, progress: Any,
          description: str, batch_size: int, tag: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Evaluate the units not yet in the log, a batch at a time, logging each batch's rows at once; returns this
    model's rows (those carrying `tag`, when models share the log)."""
    tag = tag or {}

    def mine(row: dict[str, Any]) -> bool:
        return all(row.get(k) == v for k, v in tag.items())

    done = {evaluation.key(row) for row in log.rows if mine(row)}
    todo = [unit for unit in units if unit not in done]
    bar = progress.add_task(description, total=len(units), completed=len(units) - len(todo))
    for batch in evaluation.batches(todo, batch_size):
        try:
            rows = evaluation.evaluate(opened, batch)
        except NonFiniteLogits as e:
            raise TapeError(f"--model {opened.spec}: {evaluation.name}: {e} on {evaluation.unit.removesuffix('s')} "
                            f"{batch[0]!r} (nothing of it written); check its weights and its PE (`tape pe check`, "
                            "a --pe-arg), or evaluate an earlier checkpoint") from None
        for row in rows:
            _check_finite(row, opened, f"{evaluation.name} computed",
                          f"on {evaluation.unit.removesuffix('s')} {evaluation.key(row)!r}")
        log.append([{**tag, **row} for row in rows])
        progress.advance(bar, len(batch))
    return [row for row in log.rows if mine(row)]


def non_finite(value: Any, path: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in a row or results (nested dicts and lists): (its key path, the value)."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = non_finite(item, f"{path}.{key}" if path and isinstance(key, str) else f"{path}[{key}]"
                           if path else str(key))
        if found:
            return found
    return None


def _check_finite(value: Any, model: OpenedModel | str, what: str, where: str) -> None:
    """A non-finite score is an error, not a result: one line naming the model, the value and where it first
    appeared, raised before it is written (samples.jsonl keeps the finite rows before it)."""
    found = non_finite(value)
    if found is None:
        return
    spec = model.spec if isinstance(model, OpenedModel) else model
    where = f" {where}" if where else ""
    raise TapeError(f"--model {spec}: {what} {found[0]}={found[1]}{where} (the first non-finite value; not "
                    "written): the model computes NaN or infinity there; check its weights and its PE (`tape pe "
                    "check`, a --pe-arg), or evaluate an earlier checkpoint")


def _finish(evaluation: Evaluation, results: dict[str, Any], folder: Path, label: str, started: float
            ) -> dict[str, Any]:
    """Write results.json (with the session's seconds, if `timed`) and the plot, atomically; a non-finite value in
    them is a TapeError (`_check_finite`) and nothing is written."""
    _check_finite(results, label, f"{evaluation.name}'s results hold", "")
    if evaluation.timed:
        results["seconds_this_session"] = round(time.perf_counter() - started, 2)
    write_atomic(folder / RESULTS_FILE, evaluation.dumps(results))
    if evaluation.plot_file:
        evaluation.plot(results, folder / evaluation.plot_file, label)
    return results


def default_folder(name: str, model: str | OpenedModel, per_checkpoint: bool = True) -> Path:
    """Evaluation `name`'s folder for a model when no --out is given (`tapecli.store.run.eval_dir`), without
    loading it."""
    kind, source = source_of(model)
    if not source:
        raise TapeError(f"{model.name}: a model given in memory needs an output folder (--out)")
    return eval_dir(name, kind, source, per_checkpoint)


def source_of(model: str | OpenedModel) -> tuple[str, str]:
    """("tape" | "hf", the checkpoint directory, Hugging Face directory or hub id) of a model, without loading it."""
    if isinstance(model, OpenedModel):
        return model.kind, model.source
    source = find_source(model)
    return source.kind, source.location


def as_opened(model: Any, tokenizer: Any, name: str = "model", source: str = "") -> OpenedModel:
    """A model already in memory (a demo's, a test's), in eval mode, in the form `run` takes; `source` is the
    checkpoint it came from, if any."""
    try:
        param = next(model.parameters())
        device, dtype = str(param.device), {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(param.dtype),
                                                                                                  "fp32")
    except StopIteration:
        device, dtype = "cpu", "fp32"
    return OpenedModel(model=model.eval(), tokenizer=tokenizer, spec=source or name, source=source, kind="tape",
                       dtype=dtype, device=device, name=name)


def free_memory() -> None:
    """Let the last model's memory go before the next is opened (a full garbage collection: up to half a second in a
    process holding many objects, so only between two models, never after the last)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
