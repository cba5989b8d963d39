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

Files per (model, task) directory:
  settings.json, samples.jsonl   the shared resumable log (tapecli.eval.common): one row per finished example
  predictions.json               {id: prediction}, the official submission format
  results.json                   the official metric's keys (`scrolls_score`, `f1` / `exact_match` / `rouge/...`),
                                 the settings and the protocol
`score_predictions_file` scores an existing predictions.json without a model, as the official evaluator does.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapecli.data import scrolls as data
from tapecli.errors import TapeError
from tapecli.eval import scrolls_metric as metric
from tapecli.eval.common import (
    RESULTS_FILE,
    OpenedModel,
    SamplesLog,
    generate_batch,
    open_model,
    progress_bar,
)
from tapecli.files import write_json

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
    results = []
    for spec, label in zip(models, model_labels(models), strict=True):
        row, opened = [], None
        for task in tasks:
            if opened is None or "{task}" in spec:  # one model for all tasks unless the spec names one per task
                opened = open_model(spec.replace("{task}", task), dtype=run.dtype, device=run.device,
                                    pe_args=run.pe_args)
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
    recipe = _run_recipe(opened)
    trained = recipe is not None and recipe.data.kind == "scrolls"
    compat = run.compat or (recipe.data.compat if trained else "clean")
    seq_len = run.seq_len or (recipe.data.seq_len if trained else opened.model.config.max_seq_len)
    if seq_len > opened.model.config.max_seq_len:
        raise TapeError(f"--seq-len {seq_len} exceeds the model's max_seq_len ({opened.model.config.max_seq_len})")
    budgets = data.Budgets.for_task(task, seq_len)
    sample = run.sample and task in data.SUMMARY_TASKS
    rows = data.load_split(task, run.split, run.data)
    examples = data.group_examples(rows)[: run.limit]
    settings = {
        "task": task, "split": run.split, "model": opened.record(),
        "data": data.HUB_REPO if data.is_hub(run.data) else str(Path(run.data).expanduser().resolve()),
        "compat": compat, "seq_len": seq_len, "prompt_tokens": budgets.prompt, "max_new_tokens": budgets.target,
        "decoding": {"sample": True, "temperature": 1.0, "top_k": SAMPLE_TOP_K, "seed": run.seed} if sample
        else {"sample": False}, "protocol": PROTOCOL,
    }  # --limit is not a setting: a limited run's examples count towards the full one
    out_dir = _out_dir(opened, task, run.split, out, label)
    wanted = {e.id for e in examples}
    tok = opened.tokenizer
    with SamplesLog(out_dir, settings, keep=lambda logged: [r for r in logged if r["id"] in wanted]) as log:
        done = {r["id"] for r in log.rows}
        todo = [e for e in examples if e.id not in done]
        with progress_bar("examples", show=show_progress) as progress:
            bar = progress.add_task(f"{opened.name} {task}", total=len(examples), completed=len(done))
            for start in range(0, len(todo), run.batch_size):
                chunk = todo[start : start + run.batch_size]
                prompts = [data.prompt_ids(tok, task, rows[e.row]["input"], budgets, compat) for e in chunk]
                outputs = _generate(opened.model, tok, prompts, budgets.target, run, sample, [e.id for e in chunk])
                log.append([_sample_row(task, e, p, o, tok) for e, p, o in zip(chunk, prompts, outputs, strict=True)])
                progress.advance(bar, len(chunk))
        by_id = {r["id"]: r for r in log.rows}
    predictions = {e.id: by_id[e.id]["prediction"] for e in examples}
    write_json(out_dir / PREDICTIONS_FILE, predictions)
    results: dict[str, Any] = {"task": task, "split": run.split, "model": opened.name, "limit": run.limit}
    if all(e.references for e in examples):
        results.update(metric.score_predictions(task, predictions, data.references_by_id(examples)))
    else:
        results["note"] = f"the {run.split} split has no reference outputs; submit predictions.json to be scored"
    results.update({"settings": settings, "special_tokens": tok.describe_specials([tok.bos_id], []),
                    "out_dir": str(out_dir)})
    write_json(out_dir / RESULTS_FILE, results)
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
    """OUT/[label/]task-split; without --out, next to a tape run (RUN/eval-scrolls/task-split), else
    eval-scrolls/<model name>/task-split."""
    leaf = f"{task}-{split}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in (label or opened.name).replace("{task}", "TASK"))
    if out is not None:
        return Path(out) / safe / leaf if label else Path(out) / leaf
    source = Path(opened.source)
    if opened.kind == "tape" and source.parent.name == "checkpoints":
        return source.parent.parent / "eval-scrolls" / leaf
    return Path("eval-scrolls") / safe / leaf


def score_predictions_file(task: str, predictions: str, split: str = "validation", data_source: str | None = None,
                           ) -> dict[str, Any]:
    """Score an official-format predictions.json ({id: text}) against a split's references, without a model."""
    data.check_task(task, "--task")
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
    return {"task": task, "split": split, **scores}


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
