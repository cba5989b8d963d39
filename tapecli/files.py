"""Writing files so that nothing is ever half-written, and the JSON-lines logs every run and evaluation keeps.

    with atomic_path(path) as tmp: ...      # write tmp; it replaces `path` only if the block succeeds
    write_atomic(path, text); write_json(path, data)
    rows = read_jsonl(path)                 # a last line cut off mid-write is dropped; a broken line elsewhere is
                                            #   a TapeError ("the log is damaged")
    log = JsonlLog(path, keep=lambda rows: rows)   # rewrites the kept rows, then appends (one write + flush a row)

A leaf module: it imports only `tapecli.errors` and `tapecli.faults`, so every layer may use it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.faults import reading, writing


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of `path` to write; it replaces `path` only when the block succeeds, so readers (and a
    resumed command) never see a half-written file. If the block fails (e.g. the disk is full), the temporary file
    is removed, `path` is left as it was, and a write fault becomes one line naming `path` (`faults.writing`)."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        with writing(path):
            yield tmp
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: Path, data: Any, indent: int = 1) -> None:
    """results.json, settings.json and friends: indented JSON, written atomically."""
    write_atomic(Path(path), json.dumps(data, indent=indent) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines log. Its last line may be cut off by a kill mid-write: it is dropped. A broken line
    anywhere else means the log is damaged: a TapeError naming the file and the line."""
    with reading(path):
        lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):  # the interrupted write
                break
            raise TapeError(f"{path} line {number} is not JSON; the log is damaged") from None
    return rows


class JsonlLog:
    """An append-only JSON-lines log that survives kills: on opening, the rows already there are read back
    (`read_jsonl`), filtered by `keep` and rewritten atomically; `append` then writes and flushes each batch of rows
    at once, so a row is either whole in the log or absent. `self.rows` is everything in the log."""

    def __init__(self, path: Path, keep: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None) -> None:
        self.path = Path(path)
        rows = read_jsonl(self.path) if self.path.is_file() else []
        self.rows = keep(rows) if keep else rows
        write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in self.rows))
        self._file = self.path.open("a")

    def append(self, rows: list[dict[str, Any]]) -> None:
        with writing(self.path):
            self._file.write("".join(json.dumps(row) + "\n" for row in rows))
            self._file.flush()
        self.rows.extend(rows)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
