"""Where text comes from: local files, directories, globs, Hugging Face hub datasets, and pre-tokenized memmaps.

A *source* is one string:

- a local `.txt` file (one document per file), `.jsonl`/`.json` or `.parquet` file (one document per row, in the
  column `text_field`), a directory (every supported file inside, recursively, in sorted order) or a glob;
- a Hugging Face dataset id `name[:config][@split]`, e.g. `allenai/c4:en` or `wikitext:wikitext-103-raw-v1@test`
  (streamed; default split `train`);
- a pre-tokenized `.bin` file: a flat array of token ids (uint16, or uint32 when the name ends with `.u32.bin`
  or a sidecar `<file>.json` says `{"dtype": "uint32"}`). It holds tokens, not documents: see `open_token_memmap`.

json and parquet files are read with `datasets.load_dataset(..., streaming=True)`, which reads row groups lazily
and writes no cache, so large files cost no extra disk or memory.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from tapecli.errors import TapeError, how_to_set

DOC_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
SOURCE_KINDS = "a text file, a folder of .txt/.jsonl/.json/.parquet files, a glob, or a Hugging Face dataset id"
ROW_SUFFIXES = (".jsonl", ".json", ".parquet")
TOKEN_DTYPES = ("uint16", "uint32")

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?(:[\w.-]+)?(@[\w.-]+)?$")
_OFFLINE_MARKERS = ("Couldn't reach", "couldn't connect", "OfflineModeIsEnabled", "Name or service not known")


def hub_unreachable(e: BaseException) -> bool:
    """Whether a hub download failed for being offline or unreachable (huggingface_hub's OfflineModeIsEnabled is a
    ConnectionError; a failed lookup, or a file not in the local cache offline, says so in its text)."""
    text = f"{type(e).__name__}: {e}"
    return isinstance(e, ConnectionError) or any(m in text for m in (*_OFFLINE_MARKERS, "offline", "LocalEntry"))


def is_pretokenized(source: str) -> bool:
    """True for a `.bin` token file (a token stream, not documents)."""
    return source.endswith(".bin")


def is_hub_source(source: str) -> bool:
    """True when `source` names a hub dataset rather than a local path (which wins when both could apply)."""
    if os.path.exists(os.path.expanduser(source)) or glob.has_magic(source):
        return False
    if source.endswith((*DOC_SUFFIXES, ".bin")):
        return False
    return bool(_HUB_ID.match(source))


def parse_hub_source(source: str) -> tuple[str, str | None, str]:
    """`name[:config][@split]` -> (name, config or None, split, default `train`)."""
    rest, _, split = source.partition("@")
    name, _, config = rest.partition(":")
    return name, config or None, split or "train"


def local_files(source: str, what: str = "data.source") -> list[Path]:
    """The document files a local source stands for, in the order they are read. `what` is the recipe key or option
    that gave `source`: a source naming no documents is one line naming it and how to fix it."""
    fix = f"{how_to_set(what)} ({SOURCE_KINDS})"
    if glob.has_magic(source):
        matches = sorted(glob.glob(os.path.expanduser(source), recursive=True))
        files = [f for m in matches for f in _expand(Path(m))]
        if not files:
            raise TapeError(f"{what}: no {', '.join(DOC_SUFFIXES)} files match {source}; {fix}")
        return files
    path = Path(source).expanduser()
    if not path.exists():
        raise TapeError(f"{what}: {source} does not exist; {fix}")
    if path.is_dir():
        files = _expand(path)
        if not files:
            raise TapeError(f"{what}: directory {source} contains no {', '.join(DOC_SUFFIXES)} files; {fix}")
        return files
    if path.suffix not in DOC_SUFFIXES:
        raise TapeError(f"{what}: {source} is not a {', '.join(DOC_SUFFIXES)} or .bin file; {fix}")
    return [path]


def check_source(source: str, what: str = "data.source") -> None:
    """Fail now, in one line naming `what`, if a local source (documents or a `.bin` token file) is missing or
    names no documents; a hub id is checked when it is read."""
    if is_pretokenized(source):
        open_token_memmap(source, what)
    elif not is_hub_source(source):
        local_files(source, what)


def _expand(path: Path) -> list[Path]:
    """A file -> itself if supported; a directory -> its supported files, recursively and sorted."""
    candidates = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    # `x.bin.json` is the dtype sidecar of a token file, not a document file.
    return [p for p in candidates if p.suffix in DOC_SUFFIXES and not p.name.endswith(".bin.json")]


def iter_documents(source: str, text_field: str = "text", what: str = "data.source") -> Iterator[str]:
    """Yield the documents of `source` as strings, in a fixed order (hub streams: the stream's order); `what` names
    where `source` came from in errors."""
    if is_pretokenized(source):
        raise TapeError(f"{source} holds token ids, not text; use it as training data directly")
    if is_hub_source(source):
        for (text,) in _iter_hub_rows(source, (text_field,), what):
            yield text
        return
    for path in local_files(source, what):
        if path.suffix == ".txt":
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise TapeError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
        else:
            for (text,) in _iter_file_rows(path, (text_field,)):
                yield text


def iter_rows(source: str, fields: Sequence[str], what: str = "data.source") -> Iterator[tuple[str, ...]]:
    """Yield the string values of `fields` for every row of a json/parquet/hub source (e.g. prompt and target)."""
    if is_hub_source(source):
        yield from _iter_hub_rows(source, fields, what)
        return
    for path in local_files(source, what):
        if path.suffix not in ROW_SUFFIXES:
            raise TapeError(f"{path}: need a .jsonl, .json or .parquet file with fields {', '.join(fields)}")
        yield from _iter_file_rows(path, fields)


def _pick(row: dict, fields: Sequence[str], where: str) -> tuple[str, ...]:
    values = []
    for field in fields:
        if field not in row:
            raise TapeError(f"{where} has no field {field!r} (fields: {', '.join(row)})")
        value = row[field]
        if not isinstance(value, str):  # the json reader fills keys missing from some rows with None
            raise TapeError(f"{where}: field {field!r} is {type(value).__name__}, not a string")
        values.append(value)
    return tuple(values)


class _RaisedAnyway(logging.Filter):
    """Drops the lines datasets' json reader logs ("Failed to load JSON from file ...") right before it raises the
    same error: tape reports the raised error as its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and record.getMessage().startswith("Failed to "))


def quiet_json_reader() -> None:
    """Install `_RaisedAnyway` on datasets' json reader (once; call before reading json with `datasets`)."""
    logger = logging.getLogger("datasets.packaged_modules.json.json")
    if not any(isinstance(f, _RaisedAnyway) for f in logger.filters):
        logger.addFilter(_RaisedAnyway())


def _iter_file_rows(path: Path, fields: Sequence[str]) -> Iterator[tuple[str, ...]]:
    import datasets

    quiet_json_reader()
    builder = "parquet" if path.suffix == ".parquet" else "json"
    try:
        rows = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True)
        for i, row in enumerate(rows):
            yield _pick(row, fields, f"{path} row {i}")
    except (datasets.exceptions.DatasetsError, ValueError) as e:  # malformed file (ArrowInvalid is a ValueError)
        raise TapeError(f"{path} could not be read: {str(e).splitlines()[0]}") from None


def _iter_hub_rows(source: str, fields: Sequence[str], what: str) -> Iterator[tuple[str, ...]]:
    import datasets

    name, config, split = parse_hub_source(source)
    try:
        rows = datasets.load_dataset(name, config, split=split, streaming=True)
        for i, row in enumerate(rows):
            yield _pick(row, fields, f"dataset {name!r} row {i}")
    except OSError as e:  # datasets raises the builtin ConnectionError, a subclass of OSError
        local = "" if "/" in source else f"{source} is no file here, and "  # `name` alone: a mistyped path?
        fix = f"{how_to_set(what)} ({SOURCE_KINDS.replace(', or a Hugging Face dataset id', '')})"
        if any(marker in str(e) for marker in _OFFLINE_MARKERS):
            raise TapeError(f"{what}: {local}dataset {name!r} could not be loaded (the Hugging Face hub is unreachable "
                            f"or offline); {fix}") from None
        raise TapeError(f"{what}: {local}dataset {name!r} could not be loaded: {str(e).splitlines()[0]}") from None


def token_dtype(path: Path) -> np.dtype:
    """uint16 unless the name ends with `.u32.bin`; a sidecar `<file>.json` with a "dtype" key overrides both."""
    dtype = "uint32" if path.name.endswith(".u32.bin") else "uint16"
    sidecar = path.with_name(path.name + ".json")
    if sidecar.is_file():
        dtype = json.loads(sidecar.read_text()).get("dtype", dtype)
    if dtype not in TOKEN_DTYPES:
        raise TapeError(f"{sidecar}: dtype {dtype!r} is not supported; use one of {', '.join(TOKEN_DTYPES)}")
    return np.dtype(dtype)


def open_token_memmap(source: str, what: str = "data.source") -> np.memmap:
    """Map a `.bin` token file read-only as a 1-D array of token ids; `what` names where `source` came from."""
    path = Path(source).expanduser()
    if not path.is_file():
        raise TapeError(f"{what}: token file {source} does not exist; {how_to_set(what)} ({SOURCE_KINDS})")
    dtype = token_dtype(path)
    size = path.stat().st_size
    if size == 0 or size % dtype.itemsize:
        raise TapeError(f"{source} has {size} bytes, not a whole non-zero number of {dtype} tokens")
    return np.memmap(path, dtype=dtype, mode="r")
