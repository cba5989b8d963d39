"""The local sources RULER's essay and QA tasks read, from paths the user gives (never the network).

- `read_essay(path)`: the essay haystack. A file or a directory; a directory's files (`.txt`, `.md`, `.json`,
  sorted by name) are concatenated as RULER's download script concatenates the essays (no separator). A `.json`
  file holding {"text": ...} (RULER's `PaulGrahamEssays.json`) gives its text. Returns the haystack words exactly as
  `niah.py` makes them: `re.sub(r"\\s+", " ", text).split(" ")`, and the text's SHA-256 (for settings.json).
- `read_qa(paths)`: SQuAD and HotpotQA files (or directories of `.json` files), recognised by their content (a SQuAD
  file is {"data": [...]}, a HotpotQA file a list of {"question", "answer", "context", ...}): {"squad" | "hotpotqa":
  (questions, documents)} plus each file's SHA-256.

Bad input is one TapeError naming the path.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from tapecli.data.ruler.qa import QaSet, read_hotpotqa, read_squad
from tapecli.errors import TapeError
from tapecli.faults import reading

ESSAY_SUFFIXES = (".txt", ".md", ".json")


def _files(path: Path, suffixes: tuple[str, ...], option: str) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in suffixes)
        if not files:
            raise TapeError(f"{option} {path}: the directory holds no {', '.join(suffixes)} file")
        return files
    raise TapeError(f"{option} {path}: no such file or directory")


def _essay_text(file: Path) -> str:
    with reading(file):
        text = file.read_text(encoding="utf-8")
    if file.suffix.lower() != ".json":
        return text
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TapeError(f"--haystack {file}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise TapeError(f"--haystack {file}: a JSON haystack must be {{\"text\": ...}} (RULER's PaulGrahamEssays.json)")
    return data["text"]


def read_essay(path: str | Path) -> tuple[list[str], str]:
    """(haystack words, SHA-256 of the text); see the module docstring."""
    text = "".join(_essay_text(f) for f in _files(Path(path).expanduser(), ESSAY_SUFFIXES, "--haystack"))
    words = re.sub(r"\s+", " ", text).split(" ")
    if not text.strip():
        raise TapeError(f"--haystack {path}: the haystack text is empty")
    return words, hashlib.sha256(text.encode("utf-8")).hexdigest()


def _qa_kind(data: Any) -> str | None:
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return "squad"
    hotpot_keys = {"question", "answer", "context"}
    if isinstance(data, list) and data and isinstance(data[0], dict) and hotpot_keys <= data[0].keys():
        return "hotpotqa"
    return None


def read_qa(paths: list[str]) -> tuple[dict[str, QaSet], dict[str, str]]:
    """({dataset: (questions, documents)}, {dataset: "path sha256"}); see the module docstring."""
    sets: dict[str, QaSet] = {}
    described: dict[str, str] = {}
    for given in paths:
        for file in _files(Path(given).expanduser(), (".json",), "--qa-data"):
            with reading(file):
                raw = file.read_bytes()
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as e:
                raise TapeError(f"--qa-data {file}: not valid JSON ({e.msg}, line {e.lineno})") from None
            except UnicodeDecodeError as e:  # binary bytes: json.loads says nothing of the file
                raise TapeError(f"--qa-data {file}: not UTF-8 text ({e.reason} at byte {e.start}); give RULER's SQuAD "
                                "or HotpotQA .json file") from None
            kind = _qa_kind(data)
            if kind is None:
                raise TapeError(f"--qa-data {file}: neither a SQuAD file ({{\"data\": [...]}}) nor a HotpotQA file "
                                "(a list of {question, answer, context})")
            if kind in sets:
                raise TapeError(f"--qa-data {file}: a second {kind} file ({described[kind].split()[0]} is the first)")
            try:
                sets[kind] = read_squad(data) if kind == "squad" else read_hotpotqa(data)
            except (KeyError, TypeError, ValueError) as e:
                raise TapeError(f"--qa-data {file}: malformed {kind} file ({type(e).__name__}: {e})") from None
            described[kind] = f"{file.resolve()} sha256:{hashlib.sha256(raw).hexdigest()}"
    return sets, described
