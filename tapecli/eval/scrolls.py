"""`tape eval scrolls`: generate answers for a SCROLLS split and score them with the official metric.

Protocol (method.md 4.3): every example of the split (rows sharing an `id` are one example with several
references) gets the prompt its fine-tuning used (`tapecli.data.scrolls.prompt_ids`, same seq_len and compat),
and the model writes at most the task's target budget of new tokens (200 / 1,000 at 8,192 tokens) with the KV
cache, stopping at EOS. Decoding is greedy by default; `sample=True` draws summaries (gov_report, summ_screen_fd,
qmsum) with temperature 1 and top-k 3, as the official run did, from a generator seeded per example by (seed, id),
so the draws do not depend on batching or resuming. The text is decoded without special tokens and stripped, then
scored by `tapecli.eval.scrolls_metric` (the official `tau/scrolls` metric).

Special tokens: the protocol's own rule, not the tokenizer's default: a prompt is BOS + text whatever the tokenizer
(the official code's Llama 2 tokenizer adds BOS), exactly as the fine-tuning examples start, since a model is
evaluated on the layout it was fine-tuned on. results.json records it under `special_tokens`
(docs/special-tokens.md).

`ScrollsTask` is the protocol of one task (`tapecli.eval.protocol`: a unit is an example); `run_scrolls_eval` loops
over models and tasks. Files per (model, task) directory (--out/TASK-SPLIT, OUT/<model>/TASK-SPLIT for several
models, or RUN/eval-scrolls/TASK-SPLIT):
  settings.json, samples.jsonl   the shared resumable log: one row per finished example
  predictions.json               {id: prediction}, the official submission format
  results.json                   the official metric's keys (`scrolls_score`, `f1` / `exact_match` / `rouge/...`),
                                 the settings and the protocol
`score_predictions_file` scores an existing predictions.json without a model, as the official evaluator does
(with --out, into OUT/results.json).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.data import scrolls as data
from tapecli.errors import TapeError
from tapecli.eval import scrolls_metric as metric
from tapecli.eval.common import RESULTS_FILE, generate_batch
from tapecli.eval.protocol import Evaluation, Opening, default_folder, evaluate_one, free_memory
from tapecli.files import write_json
from tapecli.store.claim import claim
from tapecli.store.door import OpenedModel
from tapecli.store.run import check_output, safe_name

PROTOCOL = (
    "SCROLLS (method.md 4.3): one example per id (all of its rows' outputs are references); prompt = the "
    "fine-tuning prompt (QA/NLI: BOS + input cut to seq_len - target - 1 tokens; summaries: 'Context:\\n' + input + "
    "'\\n Please summarize this report:' in the same budget, instruction kept); at most target = round(200 or 1000 x "
    "seq_len / 8192) new tokens, KV cache, stop at EOS; greedy, or (sample, summaries only) temperature 1 top-k 3 "
    "seeded per example; decoded without special tokens, stripped; scored with the official tau/scrolls metric"
)
PREDICTIONS_FILE = "predictions.json"
SAMPLE_TOP_K = 3
# The paper's SCROLLS table: column label and task, in its order.
TABLE_COLUMNS = (("QAS F1", "qasper"), ("CNLI EM", "contract_nli"), ("NQA F1", "narrative_qa"),
                 ("QuAL EM", "quality"), ("QMS Rgm", "qmsum"), ("SumS Rgm", "summ_screen_fd"),
                 ("GovR Rgm", "gov_report"))


@dataclass
class ScrollsRun:
    """What one `tape eval scrolls` call evaluates, besides the models and tasks."""

    split: str = "validation"
    data: str | None = None  # SCROLLS zip / folder; None = the hub
    compat: str | None = None  # None = the run's data.compat (clean when unknown)
    seq_len: int | None = None  # None = the run's data.seq_len, else the model's max_seq_len
    sample: bool = False
    seed: int = 0
    batch_size: int = 8
    dtype: str = "auto"
    device: str = "auto"
    pe_args: dict[str, Any] | None = None
    limit: int | None = None  # only the first N examples (a quick look; the score is then not the official one)


def run_scrolls_eval(models: list[str], tasks: list[str], run: ScrollsRun, out: str | None = None,
                     show_progress: bool = True) -> list[list[dict[str, Any]]]:
    """Evaluate every model on every task; results[m][t] is what (model m, task t)'s results.json holds.

    A model spec may contain `{task}` (e.g. `runs/ft-{task}`), replaced by each task's name: the paper fine-tunes
    one model per task. Finished examples in an output directory are kept (resume by running the same command).
    """
    for task in tasks:
        data.check_task(task, "--task")
    if out is not None:
        check_output(out)
    opening = Opening(run.dtype, run.device, dict(run.pe_args or {}))
    results, opened = [], None
    for spec, label in zip(models, model_labels(models), strict=True):
        row = []
        for number, task in enumerate(tasks):
            if number == 0 or "{task}" in spec:  # one model for all tasks unless the spec names one per task
                if opened is not None:
                    opened = None
                    free_memory()  # the previous model's, before the next is opened
                opened = opening.open(spec.replace("{task}", task))
            row.append(evaluate_task(opened, task, run, out, label=label if len(models) > 1 else None,
                                     show_progress=show_progress))
        results.append(row)
    return results


def model_labels(models: list[str]) -> list[str]:
    """Short names for tables and folders: the last part of each spec's path, or the whole specs when two share it."""
    labels = [Path(spec.rstrip("/")).name or spec for spec in models]
    return labels if len(set(labels)) == len(labels) else list(models)


def evaluate_task(opened: OpenedModel, task: str, run: ScrollsRun, out: str | None, label: str | None = None,
                  show_progress: bool = True) -> dict[str, Any]:
    """Evaluate (or resume) one opened model on one task; returns what results.json holds. With `label`, the
    output folder is OUT/label/TASK-SPLIT (several models), else OUT/TASK-SPLIT."""
    folder = _out_dir(opened, task, run.split, out, label)
    return evaluate_one(ScrollsTask(task, run, folder), opened, folder, label=f"{opened.name} {task}",
                        batch_size=run.batch_size, show_progress=show_progress)


@dataclass
class ScrollsTask(Evaluation):
    """One task of one split on one model (`run_scrolls_eval` loops over models and tasks); its results.json names
    its `folder` ("out_dir"), where predictions.json is written too."""

    name = "scrolls"
    unit = "examples"
    files = (PREDICTIONS_FILE,)
    timed = False
    task: str
    run: ScrollsRun
    folder: Path
    rows: Any = field(default=None, init=False, repr=False)  # the split's rows, its examples, this model's budgets
    examples: list[data.Example] = field(default_factory=list, init=False, repr=False)
    budgets: Any = field(default=None, init=False, repr=False)
    compat: str = field(default="clean", init=False, repr=False)
    seq_len: int = field(default=0, init=False, repr=False)
    sample: bool = field(default=False, init=False, repr=False)

    def prepare(self, opened: OpenedModel) -> None:
        recipe = _run_recipe(opened)
        trained = recipe is not None and recipe.data.kind == "scrolls"
        self.compat = self.run.compat or (recipe.data.compat if trained else "clean")
        self.seq_len = self.run.seq_len or (recipe.data.seq_len if trained else opened.model.config.max_seq_len)
        if self.seq_len > opened.model.config.max_seq_len:
            raise TapeError(f"--seq-len {self.seq_len} exceeds the model's max_seq_len "
                            f"({opened.model.config.max_seq_len})")
        self.budgets = data.Budgets.for_task(self.task, self.seq_len)
        self.sample = self.run.sample and self.task in data.SUMMARY_TASKS
        self.rows = data.load_split(self.task, self.run.split, self.run.data)
        self.examples = data.group_examples(self.rows)[: self.run.limit]

    def settings(self, opened: OpenedModel) -> dict[str, Any]:
        run = self.run
        return {
            "task": self.task, "split": run.split, "model": opened.record(),
            "data": data.HUB_REPO if data.is_hub(run.data) else str(Path(run.data).expanduser().resolve()),
            "compat": self.compat, "seq_len": self.seq_len, "prompt_tokens": self.budgets.prompt,
            "max_new_tokens": self.budgets.target,
            "decoding": {"sample": True, "temperature": 1.0, "top_k": SAMPLE_TOP_K, "seed": run.seed} if self.sample
            else {"sample": False}, "protocol": PROTOCOL,
        }  # --limit is not a setting: a limited run's examples count towards the full one

    def units(self, opened: OpenedModel) -> list[str]:
        return [e.id for e in self.examples]

    def key(self, row: dict[str, Any]) -> str:
        return row["id"]

    def keep(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        wanted = {e.id for e in self.examples}
        return [r for r in rows if r["id"] in wanted]

    def evaluate(self, opened: OpenedModel, units: list[str]) -> list[dict[str, Any]]:
        by_id = {e.id: e for e in self.examples}
        chunk, tok = [by_id[id_] for id_ in units], opened.tokenizer
        prompts = [data.prompt_ids(tok, self.task, self.rows[e.row]["input"], self.budgets, self.compat)
                   for e in chunk]
        outputs = _generate(opened.model, tok, prompts, self.budgets.target, self.run, self.sample, units)
        return [_sample_row(self.task, e, p, o, tok) for e, p, o in zip(chunk, prompts, outputs, strict=True)]

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        by_id = {r["id"]: r for r in rows}
        predictions = {e.id: by_id[e.id]["prediction"] for e in self.examples}
        write_json(self.folder / PREDICTIONS_FILE, predictions)
        results: dict[str, Any] = {"task": self.task, "split": self.run.split, "model": opened.name,
                                   "limit": self.run.limit}
        if all(e.references for e in self.examples):
            results.update(metric.score_predictions(self.task, predictions, data.references_by_id(self.examples)))
        else:
            results["note"] = (f"the {self.run.split} split has no reference outputs; submit predictions.json to be "
                               "scored")
        tok = opened.tokenizer
        results.update({"settings": settings, "special_tokens": tok.describe_specials([tok.bos_id], []),
                        "out_dir": str(self.folder)})
        return results


def _generate(model: Any, tok: Any, prompts: list[list[int]], max_new: int, run: ScrollsRun, sample: bool,
              ids: list[str]) -> list[list[int]]:
    """New tokens for each prompt (EOS-padded after the first EOS): greedy for the whole left-padded batch, or seeded
    sampling one example at a time (one seed per example, so batching never changes a draw)."""
    eos = tok.eos_id
    if not sample:
        return generate_batch(model, prompts, max_new, batch_size=len(prompts), stop_tokens=[eos], pad_id=eos)
    outputs = []
    for prompt, id_ in zip(prompts, ids, strict=True):
        seed = int.from_bytes(hashlib.blake2b(f"{run.seed}:{id_}".encode(), digest_size=4).digest(), "big")
        outputs += generate_batch(model, [prompt], max_new, batch_size=1, stop_tokens=[eos], pad_id=eos,
                                  temperature=1.0, top_k=SAMPLE_TOP_K, seed=seed)
    return outputs


def _sample_row(task: str, example: data.Example, prompt: list[int], new: list[int], tok: Any) -> dict[str, Any]:
    prediction = decode_answer(tok, new)
    row = {"id": example.id, "prediction": prediction, "references": example.references,
           "prompt_tokens": len(prompt), "new_tokens": new.index(tok.eos_id) if tok.eos_id in new else len(new)}
    if example.references:
        row.update({k: round(v, 4) for k, v in metric.example_scores(task, prediction, example.references).items()})
    return row


def decode_answer(tok: Any, new: list[int]) -> str:
    """The text of generated tokens: up to the first EOS, without special tokens (and without ids past the
    tokenizer's vocabulary, which a model with a padded embedding can emit), stripped."""
    if tok.eos_id in new:
        new = new[: new.index(tok.eos_id)]
    return tok.decode([t for t in new if t < tok.vocab_size]).strip()


def _run_recipe(opened: Any) -> Any:
    """The recipe of the tape run the model comes from (None for Hugging Face models or bare checkpoints)."""
    if opened.kind != "tape":
        return None
    from tapecli.store.run import run_recipe

    return run_recipe(Path(opened.source))


def _out_dir(opened: Any, task: str, split: str, out: str | None, label: str | None) -> Path:
    """OUT/[label/]task-split; without --out, next to a tape run (RUN/eval-scrolls/task-split; one folder per run, not
    per checkpoint), else the one default of every evaluation (`tapecli.store.run.eval_dir`) + task-split."""
    leaf = f"{task}-{split}"
    if out is None:
        return default_folder("scrolls", opened, per_checkpoint=False) / leaf
    return Path(out) / safe_name(label.replace("{task}", "TASK")) / leaf if label else Path(out) / leaf


def score_predictions_file(task: str, predictions: str, split: str = "validation", data_source: str | None = None,
                           out: str | None = None) -> dict[str, Any]:
    """Score an official-format predictions.json ({id: text}) against a split's references, without a model; with
    `out`, the scores also go to OUT/results.json, as every evaluation writes them."""
    data.check_task(task, "--task")
    if out is not None:
        check_output(out)
    path = Path(predictions).expanduser()
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TapeError(f"--predictions {predictions} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TapeError(f"--predictions {predictions} is not JSON ({e})") from None
    if not isinstance(loaded, dict):
        raise TapeError(f"--predictions {predictions}: expected a JSON object {{id: prediction}}, got "
                        f"{type(loaded).__name__}")
    examples = data.group_examples(data.load_split(task, split, data_source))
    if not all(e.references for e in examples):
        raise TapeError(f"the {split} split of {task} has no reference outputs to score against")
    scores = metric.score_predictions(task, loaded, data.references_by_id(examples), where=str(predictions))
    result = {"task": task, "split": split, "predictions": str(path.resolve()), **scores}
    if out is not None:
        with claim(out):
            write_json(Path(out) / RESULTS_FILE, result)
    return result


def table(models: list[str], results: list[list[dict[str, Any]]], tasks: list[str],
          ) -> tuple[list[str], list[list[str]]]:
    """(header, rows) in the paper's layout: one row per model (`model_labels`), the tasks in the paper's order."""
    columns = [(label, task) for label, task in TABLE_COLUMNS if task in tasks]
    header = ["model", *(label for label, _ in columns)]
    labels = model_labels(models)
    rows = []
    for label, row in zip(labels, results, strict=True):
        by_task = {r["task"]: r for r in row}
        cells = [f"{by_task[t]['scrolls_score']:.2f}" if "scrolls_score" in by_task[t] else "-" for _, t in columns]
        rows.append([label, *cells])
    return header, rows
