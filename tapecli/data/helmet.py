"""HELMET (Yen et al. 2025, arXiv 2410.02694; github princeton-nlp/HELMET): its released files, task definitions and
prompts, for the categories tape runs.

The data is HELMET's `data.tar.gz` (the hub dataset `princeton-nlp/HELMET`), extracted: a `data/` folder of jsonl
files, one per task and input length. tape runs the synthetic recall category, whose four tasks and files are those
of HELMET's configs/recall*.yaml and scripts/generate_configs.py:

- `json_kv`: data/json_kv/test_k{50,105,220,440,900,1800}_dep6.jsonl for 4K, 8K, ..., 128K; rows with `context` (a
  JSON object of UUID pairs), `question` (a key), `answer` (its value) and `demos` ([key, value] pairs);
- `ruler_niah_mk_2` (MK needle), `ruler_niah_mk_3` (MK UUID), `ruler_niah_mv` (multi-value):
  data/ruler/niah_multikey_2/validation_{L}.jsonl (niah_multikey_3, niah_multivalue) for L in tokens; rows with
  `context`, `query`, `type_needle_v` and `outputs` (or `answer`): the list of values to recall.

`Task` holds what data.py's loaders and the configs give each task: its file for a length, the tokens to generate
(configs: 100, 50, 100, 50), the prompt template (data.py's `load_json_kv` and `load_ruler`, filled with
`str.format(**row)` as its `tokenize` does) and HELMET's metric (scripts/collect_results.py). `read(data, task,
length)` reads one file from a local folder (the extracted `data/`, or the folder above it), or, for users with a
network, from the hub's data.tar.gz (downloaded once into the Hugging Face cache and extracted beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError

HUB_ID = "princeton-nlp/HELMET"
HINT = ("download data.tar.gz from https://huggingface.co/datasets/princeton-nlp/HELMET, extract it (tar -xzf) and "
        "pass its data/ folder as --data")
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)  # HELMET's 4K-128K; json_kv has one file per length
JSON_KV_KEYS = dict(zip(LENGTHS, ("50", "105", "220", "440", "900", "1800"), strict=True))

# data.py's load_json_kv (from lost-in-the-middle's kv_retrieval.prompt) and load_ruler (RULER's constants.py)
_KV_USER = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
            "{demos}Key: {question}")
_KV_DEMO = "Key: {key}\nCorresponding value:{value}"
_NIAH_USER = ("A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. I will "
              "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat is the special magic {type_needle_v} "
              "for {query} mentioned in the provided text?")
_NIAH_SYSTEM = "The special magic {type_needle_v} for {query} mentioned in the provided text is"
_MV_USER = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I "
            "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
            "{type_needle_v} for {query} mentioned in the provided text?")
_MV_SYSTEM = "The special magic {type_needle_v} for {query} mentioned in the provided text are"


@dataclass(frozen=True)
class Task:
    """One HELMET task: its category, folder, tokens to generate, prompt and metric."""

    name: str
    category: str
    folder: str
    generation_max_length: int
    template: str  # user template + "\n" + system template (data.py's prompt_template)
    metric: str  # the key collect_results.py reports: substring_exact_match | ruler_recall

    def file(self, length: int) -> str:
        """The released file of this task at an input length, relative to data/."""
        if self.name == "json_kv":
            if length not in JSON_KV_KEYS:
                raise TapeError(f"--lengths: json_kv has files for {', '.join(map(str, LENGTHS))} tokens only "
                                f"(HELMET's 4K-128K), got {length}")
            return f"json_kv/test_k{JSON_KV_KEYS[length]}_dep6.jsonl"
        return f"ruler/{self.folder}/validation_{length}.jsonl"


TASKS = {t.name: t for t in (
    Task("json_kv", "recall", "json_kv", 100, _KV_USER + "\nCorresponding value:", "substring_exact_match"),
    Task("ruler_niah_mk_2", "recall", "niah_multikey_2", 50, _NIAH_USER + "\n" + _NIAH_SYSTEM, "ruler_recall"),
    Task("ruler_niah_mk_3", "recall", "niah_multikey_3", 100, _NIAH_USER + "\n" + _NIAH_SYSTEM, "ruler_recall"),
    Task("ruler_niah_mv", "recall", "niah_multivalue", 50, _MV_USER + "\n" + _MV_SYSTEM, "ruler_recall"),
)}
CATEGORIES = {"recall": [n for n, t in TASKS.items() if t.category == "recall"]}
NOT_YET = ("rag", "rerank", "icl", "longqa", "summ", "cite")  # HELMET's other categories: not run by tape


def fields(task: Task, row: dict[str, Any], shots: int) -> dict[str, Any]:
    """The row as data.py's loader maps it: json_kv's demos text (the row's first `shots` [key, value] pairs),
    RULER's question and answer list."""
    if task.name == "json_kv":
        demos = "\n\n".join(_KV_DEMO.format(key=k, value=" " + v) for k, v in row["demos"][:shots])
        return {**row, "demos": demos + ("\n\n" if shots > 0 else "")}
    answer = row["answer"] if "answer" in row else row["outputs"]
    return {**row, "question": row.get("query", row.get("question", "")), "answer": answer}


def prompt(task: Task, sample: dict[str, Any]) -> str:
    """data.py's prompt_template filled as model_utils.tokenize fills it: `str.format(**sample)`."""
    return task.template.format(**sample)


def read(data: str | None, task: Task, length: int) -> tuple[list[dict[str, Any]], str]:
    """(rows, "relative/path sha256:...") of one task's file at `length`; one line when it is missing or malformed."""
    import hashlib

    from tapecli.data.released import check_fields, parse_rows
    from tapecli.faults import reading

    root = _root(data)
    path = root / task.file(length)
    if not path.is_file():
        raise TapeError(f"--data {data or HUB_ID}: no {task.file(length)} for {task.name} at {length} tokens; "
                        f"{HINT} (or choose --lengths it has)")
    with reading(path):
        raw = path.read_bytes()
    rows = parse_rows(path, raw)
    need: dict[str, Any] = ({"context": str, "question": str, "answer": str, "demos": list} if task.name == "json_kv"
                            else {"context": str, "query": str, "type_needle_v": str})
    check_fields(rows, need, str(path))
    for k, row in enumerate(rows):
        answer = row.get("answer", row.get("outputs")) if task.name != "json_kv" else row["answer"]
        if task.name != "json_kv" and (not isinstance(answer, list) or not answer
                                       or not all(isinstance(a, str) for a in answer)):
            raise TapeError(f"{path}: row {k} lacks the field 'outputs' (a non-empty list of str)")
    return rows, f"{task.file(length)} sha256:{hashlib.sha256(raw).hexdigest()}"


def _root(data: str | None) -> Path:
    """The folder holding json_kv/ and ruler/: `data` itself or its data/ subfolder; None: the hub's, extracted."""
    if data is None:
        return _hub_root()
    root = Path(data).expanduser()
    if not root.is_dir():
        raise TapeError(f"--data {data}: no such folder; {HINT}")
    return root / "data" if (root / "data").is_dir() and not (root / "json_kv").is_dir() else root


def _hub_root() -> Path:
    import tarfile

    from huggingface_hub import hf_hub_download

    try:
        archive = Path(hf_hub_download(HUB_ID, "data.tar.gz", repo_type="dataset"))
    except Exception:  # noqa: BLE001 - offline, unreachable or refused: the same sentence
        raise TapeError(f"{HUB_ID} cannot be read from the Hugging Face hub (offline or unreachable); {HINT}"
                        ) from None
    target = archive.parent / "helmet-data"
    if not (target / "data").is_dir():
        partial = archive.parent / "helmet-data.partial"
        with tarfile.open(archive) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(target)
    return target / "data"
