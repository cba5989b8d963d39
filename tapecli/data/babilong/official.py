"""BABILong's own data files, read from a local folder (`tape eval babilong --data DIR`), never downloaded.

The Hugging Face datasets RMT-team/babilong (100 samples per task and length) and RMT-team/babilong-1k-samples (1000)
have been published in several layouts: `<length>/<task>-00000-of-00001.parquet`, `<task>/<length>-00000-of-00001
.parquet`, `<length>/<task>/0000.parquet` (the parquet conversion), and the JSON files BABILong's `data/create_tasks.py`
writes (`<task>/<length>.json`, a list of rows). `files(root, task, length_name)` finds the files of one (task, length)
in any of them: every file under `root` ending in .parquet, .json or .jsonl whose relative path, cut at `/ - _ .`,
holds both the task (`qa1`) and the length name (`0k`, `1k`, ..., `128k`) as pieces, in name order (a split's
shards). `rows(...)` reads them: each row has the string fields `input` (facts in PG-19 text), `question` and
`target`.

Lengths: BABILong names them 0k, 1k, 2k, 4k, ... (1k = about 1000 GPT-2 tokens of facts and text, 300 fewer than the
name for the prompt); tape's `--lengths` names them in tokens, so 1024 reads the "1k" files and 0 the "0k" files.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tapecli.errors import TapeError
from tapecli.faults import reading

SUFFIXES = (".parquet", ".json", ".jsonl")
FIELDS = ("input", "question", "target")


def length_name(length: int) -> str:
    """BABILong's name of a length in tokens: 0 -> 0k, 1024 -> 1k, 16384 -> 16k."""
    if length < 0 or length % 1024:
        raise TapeError(f"--lengths {length}: BABILong's files come in 0k, 1k, 2k, 4k, ... (1k = 1024 here); pass "
                        "0 or a multiple of 1024 with --data")
    return f"{length // 1024}k"


def files(root: str | Path, task: str, name: str) -> list[Path]:
    """The data files of (task, length name) under `root`, in name order."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise TapeError(f"--data {root}: no such directory (pass the folder holding BABILong's files)")
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix.lower() in SUFFIXES:
            pieces = set(re.split(r"[-_./\\]", str(path.relative_to(root)).lower()))
            if task in pieces and name in pieces:
                found.append(path)
    return found


def rows(root: str | Path, task: str, length: int) -> tuple[list[dict[str, str]], list[str]]:
    """(rows, ["relative/path sha256:..."]) of one (task, length); one TapeError line when missing or malformed."""
    name = length_name(length)
    paths = files(root, task, name)
    if not paths:
        raise TapeError(f"--data {root}: no file for {task} at {name} (looked for .parquet/.json/.jsonl files whose "
                        f"path names both {task} and {name})")
    out, described = [], []
    for path in paths:
        with reading(path):
            raw = path.read_bytes()
        out += _read(path, raw)
        described.append(f"{path.relative_to(Path(root).expanduser())} sha256:{hashlib.sha256(raw).hexdigest()}")
    return out, described


def _read(path: Path, raw: bytes) -> list[dict[str, str]]:
    from tapecli.data.released import parse_rows

    records = parse_rows(path, raw)
    for k, record in enumerate(records):
        if any(not isinstance(record.get(f), str) for f in FIELDS):
            raise TapeError(f"--data {path}: row {k} lacks one of the string fields {', '.join(FIELDS)}")
    return [{f: r[f] for f in FIELDS} for r in records]
