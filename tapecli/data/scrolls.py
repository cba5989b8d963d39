"""SCROLLS data: reading the `tau/scrolls` files and turning rows into prompts and fine-tuning examples.

Files. The `tau/scrolls` hub repo stores each task as `{task}.zip` holding `{task}/{train,validation,test}.jsonl`,
rows with `id`, `pid`, `input`, `output` (query tasks put the query, a blank line, then the document in `input`;
test rows have no output). `datasets` >= 4 cannot run the repo's loading script, so the json builder reads the
zip member directly (`zip://{task}/{split}.jsonl::<zip>`), from

- a local `{task}.zip`, a folder holding `{task}.zip` or `{task}/{split}.jsonl` (an unpacked zip), or
- the hub (`source` None or `tau/scrolls`) when online; offline that fails at once with one sentence naming the
  file to download and where to pass it.

Rows are streamed once into an Arrow table in the `datasets` cache (memory-mapped, random access, reused while
the file is unchanged). Rows sharing an `id` are one example whose references are all their outputs
(`group_examples`); for fine-tuning every row is one example.

Examples (method.md 4.3; budgets for `seq_len` = 8,192, scaled by seq_len / 8,192 otherwise):

- QA/NLI (qasper, narrative_qa, quality, contract_nli): prompt = BOS + `input`, cut to its first 7,991 tokens;
  target = `output` cut to 200 tokens, then EOS.
- summaries (gov_report, summ_screen_fd, qmsum): prompt = BOS + "Context:\\n" + `input` + "\\n Please summarize
  this report:"; target up to 1,000 tokens + EOS. The prompt keeps 7,191 tokens: the document is cut so that the
  instruction survives whole (default), or, with compat `official`, the first 7,184 and last 7 tokens are kept.
- the loss is on the target and EOS only; padding goes on the right with labels -100 (causal attention never
  lets a token see the padding after it, so no mask is needed).

`compat="official"` restores the official code's quirks (method.md section 6 item 15): every target starts with
its own BOS (inside the 200/1,000-token budget) and padding uses the last vocabulary id (31,999 for Llama's
tokenizer), a real token. Inputs are cut to their first prompt-budget words before tokenising, which cannot
change the kept tokens (a word never yields fewer than one token); the official 20,000/15,000-word cuts are
likewise no-ops at these budgets.

`ScrollsData` is the recipe's `data:` section of kind `scrolls` (tapecli.data.schema).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tapecli.data.schema import DataSchema, check_tokenized
from tapecli.data.sources import _OFFLINE_MARKERS, quiet_json_reader
from tapecli.errors import TapeError

QA_TASKS = ("qasper", "narrative_qa", "quality", "contract_nli")
SUMMARY_TASKS = ("gov_report", "summ_screen_fd", "qmsum")
TASKS = ("gov_report", "summ_screen_fd", "qmsum", "narrative_qa", "qasper", "quality", "contract_nli")  # paper order
HUB_REPO = "tau/scrolls"
HUB_ZIP_URL = "https://huggingface.co/datasets/tau/scrolls/resolve/main/{task}.zip"
SPLITS = ("train", "validation", "test")
Compat = Literal["clean", "official"]

REFERENCE_LEN = 8192  # the official fine-tuning and generation length
QA_TARGET, SUMMARY_TARGET = 200, 1000  # target tokens (before EOS) at REFERENCE_LEN
OFFICIAL_TAIL = 7  # summaries, compat official: prompt tokens kept from the end
SUMMARY_PREFIX = "Context:\n"
SUMMARY_SUFFIX = "\n Please summarize this report:"



def check_task(task: str | None, key: str = "data.task") -> str:
    if task not in TASKS:
        raise TapeError(f"{key}: unknown SCROLLS task {task!r}; allowed: {', '.join(TASKS)}")
    return task


# ---------------------------------------------------------------------------------------------------------------
# Files


def is_hub(source: str | None) -> bool:
    return source is None or source == HUB_REPO


def split_url(task: str, split: str, source: str | None) -> str:
    """The `datasets` data file of one split: a chained `zip://` URL, or a local `.jsonl` path."""
    check_task(task, "task")
    if is_hub(source):
        return f"zip://{task}/{split}.jsonl::{HUB_ZIP_URL.format(task=task)}"
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".zip":
            raise TapeError(f"SCROLLS data {source}: expected {task}.zip or a folder holding it")
        return f"zip://{task}/{split}.jsonl::{path.resolve()}"
    if path.is_dir():
        for candidate in (path / f"{task}.zip", path / task / f"{split}.jsonl", path / f"{split}.jsonl"):
            if candidate.is_file():
                if candidate.suffix == ".zip":
                    return split_url(task, split, str(candidate))
                return str(candidate.resolve())
        raise TapeError(f"SCROLLS data folder {source} holds neither {task}.zip nor {task}/{split}.jsonl")
    raise TapeError(f"SCROLLS data {source} does not exist; pass {task}.zip or a folder holding it")


def offline_hint(task: str) -> str:
    return (f"SCROLLS task {task!r} cannot be read from the Hugging Face hub (offline or unreachable); download "
            f"{HUB_ZIP_URL.format(task=task)} and pass the file or its folder as data.source (training) or --data "
            "(tape eval scrolls)")


def load_split(task: str, split: str, source: str | None = None) -> Any:
    """The rows of one split as a `datasets.Dataset` (columns id, pid, input, output), cached as Arrow."""
    import datasets

    if split not in SPLITS:
        raise TapeError(f"unknown SCROLLS split {split!r}; allowed: {', '.join(SPLITS)}")
    url = split_url(task, split, source)
    quiet_json_reader()
    local = url.rsplit("::", 1)[-1]
    stamp = "hub" if is_hub(source) else f"{os.path.getsize(local)}:{os.stat(local).st_mtime_ns}"
    quiet = not datasets.utils.are_progress_bars_disabled()
    if quiet:  # no "Generating train split" bar for what is a split of a task here
        datasets.utils.disable_progress_bars()
    try:
        rows = datasets.Dataset.from_generator(_stream_rows, gen_kwargs={"url": url, "stamp": stamp})
    except (OSError, datasets.exceptions.DatasetGenerationError) as e:
        cause = e.__cause__ if isinstance(e, datasets.exceptions.DatasetGenerationError) and e.__cause__ else e
        text = str(cause)
        # huggingface_hub's OfflineModeIsEnabled is a ConnectionError; a failed lookup says so in its text
        if is_hub(source) and (isinstance(cause, ConnectionError) or any(m in text for m in _OFFLINE_MARKERS)):
            raise TapeError(offline_hint(task)) from None
        if "No such file" in text or isinstance(cause, (FileNotFoundError, KeyError)):
            raise TapeError(f"SCROLLS data for {task}: {split}.jsonl not found in {source}") from None
        # the member yielded no row: datasets' reader ran out (StopIteration) and no schema could be inferred
        if _raised_in_chain(e, StopIteration) and _raised_in_chain(e, datasets.arrow_writer.SchemaInferenceError):
            raise TapeError(f"SCROLLS data for {task}: {split}.jsonl in {source or HUB_REPO} is empty (no rows); "
                            "fill it or pass another file") from None
        raise TapeError(f"SCROLLS data for {task} ({split}) could not be read: {text.splitlines()[0]}") from None
    finally:
        if quiet:
            datasets.utils.enable_progress_bars()
    missing = {"id", "input", "output"} - set(rows.column_names)
    if missing:
        raise TapeError(f"SCROLLS data for {task} ({split}): rows lack the field(s) {', '.join(sorted(missing))}")
    if len(rows) == 0:
        raise TapeError(f"SCROLLS data for {task} ({split}) has no rows")
    for name, allowed in (("input", ("string",)), ("output", ("string", "null"))):  # null: test rows, no output
        feature = rows.features[name]
        if getattr(feature, "dtype", None) not in allowed:
            raise TapeError(f"SCROLLS data for {task}: {split}.jsonl in {source or HUB_REPO} has field {name!r} "
                            f"of type {getattr(feature, 'dtype', type(feature).__name__)}, expected text; fix the "
                            "file")
    return rows


def _raised_in_chain(error: BaseException | None, kind: type) -> bool:
    """Whether `error` or an exception it was raised from (or while handling) is a `kind`."""
    todo, seen = [error], set()
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        if isinstance(error, kind):
            return True
        seen.add(id(error))
        todo += [error.__cause__, error.__context__]
    return False


def _stream_rows(url: str, stamp: str) -> Any:  # `stamp` only keys the cache: a changed file is read again
    import datasets

    yield from datasets.load_dataset("json", data_files={"rows": url}, split="rows", streaming=True)


@dataclass
class Example:
    """One evaluation example: the row holding its input, and every reference output of its id."""

    id: str
    row: int
    references: list[str] = field(default_factory=list)


def group_examples(rows: Any) -> list[Example]:
    """Merge rows sharing an `id` into one example (first-appearance order), as the official evaluator does."""
    examples: dict[str, Example] = {}
    for i, (id_, output) in enumerate(zip(rows["id"], rows["output"], strict=True)):
        example = examples.setdefault(str(id_), Example(str(id_), i))
        if output is not None:
            example.references.append(output)
    return list(examples.values())


# ---------------------------------------------------------------------------------------------------------------
# Examples


@dataclass(frozen=True)
class Budgets:
    """Token budgets of one task at one sequence length: prompt (BOS included) + target + EOS = seq_len."""

    prompt: int
    target: int

    @classmethod
    def for_task(cls, task: str, seq_len: int) -> Budgets:
        full = SUMMARY_TARGET if check_task(task, "task") in SUMMARY_TASKS else QA_TARGET
        target = max(1, round(full * seq_len / REFERENCE_LEN))
        prompt = seq_len - target - 1
        if prompt < 2 + OFFICIAL_TAIL:
            raise TapeError(f"data.seq_len: {seq_len} leaves {prompt} prompt tokens for {task}; use a longer seq_len")
        return cls(prompt=prompt, target=target)


def _head_words(text: str, n: int) -> str:
    """`text` up to the end of its n-th whitespace-separated word (all of it when shorter)."""
    for i, match in enumerate(re.finditer(r"\S+", text)):
        if i + 1 == n:
            return text[: match.end()]
    return text


def prompt_ids(tokenizer: Any, task: str, text: str, budgets: Budgets, compat: Compat = "clean") -> list[int]:
    """The prompt tokens of one input (BOS first), cut to `budgets.prompt` as the module docstring says."""
    text = _head_words(text, budgets.prompt)
    if task not in SUMMARY_TASKS:
        return [tokenizer.bos_id, *tokenizer.encode(text)][: budgets.prompt]
    if compat == "official":
        ids = [tokenizer.bos_id, *tokenizer.encode(SUMMARY_PREFIX + text + SUMMARY_SUFFIX)]
        if len(ids) <= budgets.prompt:
            return ids
        return ids[: budgets.prompt - OFFICIAL_TAIL] + ids[-OFFICIAL_TAIL:]
    suffix = tokenizer.encode(SUMMARY_SUFFIX)
    room = budgets.prompt - 1 - len(suffix)
    if room < 1:
        raise TapeError(f"data.seq_len: the {budgets.prompt}-token prompt budget cannot hold the summary "
                        f"instruction ({len(suffix)} tokens); use a longer seq_len")
    return [tokenizer.bos_id, *tokenizer.encode(SUMMARY_PREFIX + text)[:room], *suffix]


def target_ids(tokenizer: Any, text: str, budgets: Budgets, compat: Compat = "clean") -> list[int]:
    """The target tokens, cut to `budgets.target`, then EOS (compat official: BOS first, inside the budget)."""
    ids = tokenizer.encode(_head_words(text, budgets.target))
    if compat == "official":
        ids = [tokenizer.bos_id, *ids]
    return [*ids[: budgets.target], tokenizer.eos_id]


def pad_id(tokenizer: Any, compat: Compat) -> int:
    """Padding id: the tokenizer's pad id, or (official) the last vocabulary id, as the official code's 31,999."""
    return tokenizer.vocab_size - 1 if compat == "official" else tokenizer.pad_id


def encode_example(tokenizer: Any, task: str, text: str, output: str, seq_len: int, compat: Compat = "clean",
                   ) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of length seq_len for one training row: labels[t] is the token after input t, -100 on
    the prompt and the padding."""
    from tapecli.data.text import IGNORE_INDEX

    budgets = Budgets.for_task(task, seq_len)
    prompt = prompt_ids(tokenizer, task, text, budgets, compat)
    seq = prompt + target_ids(tokenizer, output, budgets, compat)
    pad = seq_len - (len(seq) - 1)
    input_ids = seq[:-1] + [pad_id(tokenizer, compat)] * pad
    labels = [IGNORE_INDEX] * (len(prompt) - 1) + seq[len(prompt):] + [IGNORE_INDEX] * pad
    return input_ids, labels


class ScrollsDataset:
    """Training examples of one split, one per row, encoded on access: `ds[i] -> (input_ids, labels)` LongTensors."""

    def __init__(self, rows: Any, tokenizer: Any, task: str, seq_len: int, compat: Compat) -> None:
        self.rows, self.tokenizer, self.task, self.seq_len, self.compat = rows, tokenizer, task, seq_len, compat
        self.num_examples = len(rows)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, i: int) -> Any:
        import torch

        row = self.rows[i]
        if row["output"] is None:
            raise TapeError(f"SCROLLS {self.task} row {i} (id {row['id']}) has no output to train on")
        input_ids, labels = encode_example(self.tokenizer, self.task, row["input"], row["output"], self.seq_len,
                                           self.compat)
        return torch.tensor(input_ids), torch.tensor(labels)


def build_scrolls_datasets(task: str, source: str | None, tokenizer: Any, seq_len: int, val_fraction: float,
                           compat: Compat = "clean") -> tuple[ScrollsDataset, ScrollsDataset | None]:
    """(train split, validation split or None when val_fraction is 0) for fine-tuning on one task."""
    Budgets.for_task(task, seq_len)  # fail on a too-short seq_len before reading anything
    train = ScrollsDataset(load_split(task, "train", source), tokenizer, task, seq_len, compat)
    val = ScrollsDataset(load_split(task, "validation", source), tokenizer, task, seq_len, compat) \
        if val_fraction > 0 else None
    return train, val


def references_by_id(examples: Sequence[Example]) -> dict[str, list[str]]:
    return {e.id: e.references for e in examples}


@dataclass
class ScrollsData(DataSchema):
    """`data:` of kind scrolls: one SCROLLS task's rows as prompt/target examples, the loss on the target only."""

    kind: Literal["scrolls"] = "scrolls"  # one SCROLLS task, the loss on the target
    source: str | None = None  # null = the `tau/scrolls` hub repo (online); offline: {task}.zip or its folder
    tokenizer: str = "byte"  # training from scratch only: fine-tuning keeps the checkpoint's tokenizer
    seq_len: int = 1024  # tokens per example; the prompt and target budgets scale with it (from 8192)
    val_fraction: float = 0.01  # > 0: validation loss on the task's validation split; 0: none
    task: str | None = None  # the SCROLLS task (one of TASKS)
    compat: Compat = "clean"  # clean, or official: the official code's quirks (BOS-led targets, its padding id)

    def check(self) -> None:
        super().check()
        check_tokenized(self, needs_source=False)  # no source: the hub
        check_task(self.task)

    def build(self, tokenizer: Any, seed: int, cache_dir: Path) -> tuple[ScrollsDataset, ScrollsDataset | None]:
        return build_scrolls_datasets(self.task, self.source, tokenizer, self.seq_len, self.val_fraction,
                                      self.compat)
