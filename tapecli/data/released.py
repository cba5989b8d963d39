"""A benchmark's released rows: its own files from a local file or folder, or its Hugging Face hub dataset.

`read_rows(data, hub_id, hint, what)` is how `tape eval mrcr` and `tape eval longbench-v2` read their data:

- `data` a file (.parquet, .jsonl, or .json holding a list of rows or {"data": [...]}) or a folder: every such file
  under it, recursively, in path order (a split's shards, or a benchmark's per-set folders such as MRCR's
  2needle/, 4needle/, 8needle/); `described` names each file with its SHA-256, so settings.json ties the results to
  the exact files;
- `data` None: the hub dataset `hub_id` (its `train` split, through `datasets.load_dataset`), for users with a
  network; offline or unreachable, one line: `hint`, the sentence that says what to download and pass instead.

Rows come back as dicts in file order; the caller checks their fields (`check_fields`).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.faults import reading

SUFFIXES = (".parquet", ".jsonl", ".json")


def read_rows(data: str | None, hub_id: str, hint: str, what: str = "--data") -> tuple[list[dict[str, Any]], Any]:
    """(rows, described): described is {"path": ..., "files": ["relative/path sha256:..."]} or {"hub": hub_id}."""
    if data is None:
        return _hub_rows(hub_id, hint), {"hub": hub_id}
    root = Path(data).expanduser()
    if root.is_file():
        paths, base = [root], root.parent
    elif root.is_dir():
        paths = [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix.lower() in SUFFIXES]
        base = root
        if not paths:
            raise TapeError(f"{what} {data}: no .parquet, .jsonl or .json file in that folder; {hint}")
    else:
        raise TapeError(f"{what} {data}: no such file or folder; {hint}")
    rows, files = [], []
    for path in paths:
        with reading(path):
            raw = path.read_bytes()
        rows += parse_rows(path, raw, what)
        files.append(f"{path.relative_to(base)} sha256:{hashlib.sha256(raw).hexdigest()}")
    return rows, {"path": str(root.resolve()), "files": files}


def parse_rows(path: Path, raw: bytes, what: str = "--data") -> list[dict[str, Any]]:
    """The rows (JSON objects) of one file's bytes, by its suffix; one line naming the file when it is unreadable."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            records = pq.read_table(io.BytesIO(raw)).to_pylist()
        elif suffix == ".jsonl":
            records = [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
        else:
            loaded = json.loads(raw)
            records = loaded.get("data") if isinstance(loaded, dict) else loaded
    except Exception as e:  # noqa: BLE001 - any unreadable file is one line naming it
        raise TapeError(f"{what} {path}: cannot read it ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise TapeError(f"{what} {path}: expected a list of rows (JSON objects)")
    return records


def _hub_rows(hub_id: str, hint: str) -> list[dict[str, Any]]:
    import datasets

    from tapecli.data.sources import hub_unreachable

    try:
        return list(datasets.load_dataset(hub_id, split="train"))
    except (OSError, ValueError, datasets.exceptions.DatasetsError) as e:
        if hub_unreachable(e):
            raise TapeError(f"{hub_id} cannot be read from the Hugging Face hub (offline or unreachable); "
                            f"{hint}") from None
        raise TapeError(f"{hub_id} could not be loaded: {str(e).splitlines()[0]}") from None


def check_fields(rows: list[dict[str, Any]], fields: dict[str, type | tuple[type, ...]], source: str) -> None:
    """One line naming the first row that lacks a field or holds it with another type."""
    if not rows:
        raise TapeError(f"{source}: no rows")
    for k, row in enumerate(rows):
        for name, kind in fields.items():
            if not isinstance(row.get(name), kind) or isinstance(row.get(name), bool) and bool not in (
                    kind if isinstance(kind, tuple) else (kind,)):
                raise TapeError(f"{source}: row {k} lacks the field {name!r} "
                                f"({' or '.join(t.__name__ for t in (kind if isinstance(kind, tuple) else (kind,)))})")
