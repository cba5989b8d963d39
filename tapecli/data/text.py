"""Packed language-modelling datasets and the step -> example-indices schedule that makes resuming exact.

Every document becomes `[BOS] tokens [EOS]`; the documents are concatenated and cut into disjoint blocks of
`seq_len + 1` tokens (a short tail is dropped). Example `i` is `(block[:-1], block[1:])`, so labels are the inputs
shifted by one and the model needs no shifting of its own. Packed blocks ignore no position, but every dataset here
uses -100 (`IGNORE_INDEX`) for positions the loss must skip (see `tapecli.data.pairs`).

Three kinds of source, one API (`ds[i] -> (input_ids, labels)`, both LongTensor[seq_len]; `ds.num_examples`):

- local files: tokenized once into a uint32 array (in memory, or memmapped files in `cache_dir`), random access,
  `len(ds)` works. The validation split is a seeded choice of whole documents.
- a `.bin` token file: used directly as a memmap; validation is the last `val_fraction` of its blocks.
- a hub stream: blocks are produced in stream order. `num_examples` is None and `len(ds)` raises TypeError;
  indices must grow (`ds[i]` after `ds[j]`, i > j, skips ahead; a smaller index restarts the stream), which is
  how a resumed run skips what it already trained on. Validation documents are chosen by a seeded hash of their
  position in the stream.

`global_indices(step, batch_size, n, seed)` says which examples optimizer step `step` uses, as a pure function of
the step, so a run resumed at step s sees exactly the batches an uninterrupted run would have seen.

`TextData` is the recipe's `data:` section of kind `text` (tapecli.data.schema).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from tapecli.data.schema import DataSchema, check_source_files, check_tokenized
from tapecli.data.sources import (
    is_hub_source,
    is_pretokenized,
    iter_documents,
    local_files,
    open_token_memmap,
)
from tapecli.data.tokenizer import Tokenizer, tokenizer_fingerprint
from tapecli.errors import TapeError

IGNORE_INDEX = -100
CACHE_VERSION = 1  # bump when the cached token layout changes


def global_indices(step: int, batch_size: int, n: int | None, seed: int) -> list[int]:
    """Example indices for optimizer step `step`.

    Finite datasets (n examples): an endless sequence of epochs, epoch e being a permutation drawn with a
    torch.Generator seeded with `seed + e`; step s takes positions [s * batch_size, (s + 1) * batch_size) of that
    sequence, so every example appears exactly once per epoch. Streams (n is None): s * batch_size + k.
    """
    start = step * batch_size
    if n is None:
        return list(range(start, start + batch_size))
    indices = []
    for position in range(start, start + batch_size):
        epoch, offset = divmod(position, n)
        indices.append(int(_permutation(n, seed + epoch)[offset]))
    return indices


@functools.lru_cache(maxsize=4)  # a batch spans at most two epochs; keep them instead of redrawing every step
def _permutation(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def validation_count(n: int, val_fraction: float) -> int:
    """How many of n items (documents, rows or blocks) go to validation: round(n * fraction), at least 1 and at
    most n - 1 when val_fraction > 0 and n >= 2, else 0."""
    if val_fraction <= 0 or n < 2:
        return 0
    return min(n - 1, max(1, round(n * val_fraction)))


def choose_validation(n: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask over n items marking a seeded random choice of `validation_count` of them."""
    is_val = np.zeros(n, dtype=bool)
    chosen = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: validation_count(n, val_fraction)]
    is_val[chosen.numpy()] = True
    return is_val


class PackedDataset(Dataset):
    """Disjoint blocks of seq_len + 1 tokens cut from a flat token array (in memory or memmapped)."""

    def __init__(self, tokens: np.ndarray, seq_len: int, vocab_size: int, first_block: int = 0,
                 num_blocks: int | None = None) -> None:
        self.tokens, self.seq_len, self.vocab_size = tokens, seq_len, vocab_size
        self.first_block = first_block
        self.num_examples = len(tokens) // (seq_len + 1) - first_block if num_blocks is None else num_blocks

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.num_examples:
            raise IndexError(f"block {i} out of range for {self.num_examples} blocks")
        start = (self.first_block + i) * (self.seq_len + 1)
        block = torch.from_numpy(self.tokens[start : start + self.seq_len + 1].astype(np.int64))
        # Only a pre-tokenized file from elsewhere can hold ids the model cannot embed; say so instead of a
        # device-side assert deep inside the embedding.
        if int(block.max()) >= self.vocab_size:
            raise TapeError(f"token id {int(block.max())} in block {i} is >= the tokenizer's vocab size "
                            f"{self.vocab_size}; was the token file made with another tokenizer?")
        return block[:-1], block[1:]


class StreamPackedDataset(Dataset):
    """Blocks packed on the fly from a document stream; indices must grow (see the module docstring)."""

    num_examples = None

    def __init__(self, documents: Callable[[], Iterator[str]], tokenizer: Tokenizer, seq_len: int,
                 keep: Callable[[int], bool]) -> None:
        self.documents, self.tokenizer, self.seq_len, self.keep = documents, tokenizer, seq_len, keep
        self._blocks: Iterator[list[int]] | None = None
        self._position = 0  # index of the block `next(self._blocks)` returns

    def _generate(self) -> Iterator[list[int]]:
        size = self.seq_len + 1
        buffer: list[int] = []
        for i, doc in enumerate(self.documents()):
            if not self.keep(i):
                continue
            buffer += [self.tokenizer.bos_id, *self.tokenizer.encode(doc), self.tokenizer.eos_id]
            while len(buffer) >= size:
                yield buffer[:size]
                del buffer[:size]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._blocks is None or i < self._position:
            self._blocks, self._position = self._generate(), 0
        try:
            for _ in range(i - self._position):
                next(self._blocks)
            block = torch.tensor(next(self._blocks), dtype=torch.long)
        except StopIteration:
            self._blocks = None
            raise IndexError(f"the stream ended before block {i}") from None
        self._position = i + 1
        return block[:-1], block[1:]


def _in_stream_validation(index: int, val_fraction: float, seed: int) -> bool:
    """Seeded, stateless coin flip per stream document: it needs no document count, unlike `choose_validation`."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < val_fraction


def build_text_datasets(source: str, tokenizer: Tokenizer, seq_len: int, val_fraction: float, seed: int,
                        text_field: str = "text", cache_dir: str | Path | None = None,
                        ) -> tuple[Dataset, Dataset | None]:
    """(train, validation or None) packed datasets for `source` (see the module docstring)."""
    if seq_len < 1:
        raise TapeError(f"seq_len must be >= 1, got {seq_len}")
    if not 0 <= val_fraction < 1:
        raise TapeError(f"val_fraction must be in [0, 1), got {val_fraction}")

    if is_pretokenized(source):
        tokens = open_token_memmap(source)
        n_blocks = len(tokens) // (seq_len + 1)
        n_val = validation_count(n_blocks, val_fraction)
        train = PackedDataset(tokens, seq_len, tokenizer.vocab_size, num_blocks=n_blocks - n_val)
        val = PackedDataset(tokens, seq_len, tokenizer.vocab_size, first_block=n_blocks - n_val) if n_val else None
        _check_not_empty(train, source, "training")
        return train, val

    if is_hub_source(source):
        documents = functools.partial(iter_documents, source, text_field)
        train = StreamPackedDataset(documents, tokenizer, seq_len,
                                    keep=lambda i: not _in_stream_validation(i, val_fraction, seed))
        val = StreamPackedDataset(documents, tokenizer, seq_len,
                                  keep=lambda i: _in_stream_validation(i, val_fraction, seed))
        return train, val if val_fraction > 0 else None

    if cache_dir is None:
        train_tokens, val_tokens = _tokenize_local(source, tokenizer, val_fraction, seed, text_field)
    else:
        train_tokens, val_tokens = _cached_tokens(source, tokenizer, val_fraction, seed, text_field, Path(cache_dir))
    train = PackedDataset(train_tokens, seq_len, tokenizer.vocab_size)
    _check_not_empty(train, source, "training")
    if val_tokens is None:
        return train, None
    val = PackedDataset(val_tokens, seq_len, tokenizer.vocab_size)
    _check_not_empty(val, source, "validation")
    return train, val


def missing_validation(source: str, val_fraction: float, seq_len: int, text_field: str = "text") -> str | None:
    """Why `build_text_datasets(source, ...)` gives no validation split (module docstring), None when it gives one;
    reads at most two documents (a `.bin`: its length)."""
    if val_fraction <= 0:
        return "data.val_fraction is 0 (pass data.val_fraction=0.01 to hold out 1% of the documents)"
    if is_hub_source(source):
        return None
    if is_pretokenized(source):
        blocks = len(open_token_memmap(source)) // (seq_len + 1)
        return None if validation_count(blocks, val_fraction) else (
            f"data.source {source} holds {blocks} block(s) of seq_len + 1 = {seq_len + 1} tokens, and validation "
            "takes data.val_fraction of at least 2 blocks; use more tokens or a shorter data.seq_len")
    documents = len(list(islice(iter_documents(source, text_field), 2)))
    if documents >= 2:
        return None
    return (f"data.source {source} holds one document, and the validation split is a choice of whole documents "
            "(data.val_fraction of them, never all): give two or more (several .txt files, or a .jsonl or .json "
            "with one document per row)")


def _check_not_empty(ds: PackedDataset, source: str, split: str) -> None:
    if ds.num_examples <= 0:
        raise TapeError(f"{source}: the {split} split has fewer than seq_len + 1 = {ds.seq_len + 1} tokens; "
                        "use more data, a shorter seq_len or a different val_fraction")


def _tokenize_local(source: str, tokenizer: Tokenizer, val_fraction: float, seed: int, text_field: str,
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Flat uint32 token arrays of the training and validation documents, each in source order."""
    docs = [np.array([tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id], dtype=np.uint32)
            for text in iter_documents(source, text_field)]
    if not docs:
        raise TapeError(f"{source} contains no documents")
    is_val = choose_validation(len(docs), val_fraction, seed)
    train = np.concatenate([d for d, v in zip(docs, is_val, strict=True) if not v])
    val = np.concatenate([d for d, v in zip(docs, is_val, strict=True) if v]) if is_val.any() else None
    return train, val


def _cached_tokens(source: str, tokenizer: Tokenizer, val_fraction: float, seed: int, text_field: str,
                   cache_dir: Path) -> tuple[np.ndarray, np.ndarray | None]:
    """Like `_tokenize_local`, but stored as `.u32.bin` files under `cache_dir` and memmapped.

    The cache key covers everything the tokens depend on: the files (path, size, mtime), the tokenizer (the bytes
    it saves), the text field and the split settings; seq_len is not part of it because blocks are cut on load.
    """
    entry = cache_dir / _cache_key(source, tokenizer, val_fraction, seed, text_field)
    if not (entry / "train.u32.bin").is_file():
        train, val = _tokenize_local(source, tokenizer, val_fraction, seed, text_field)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".tmp-"))
        train.tofile(tmp / "train.u32.bin")
        if val is not None:
            val.tofile(tmp / "val.u32.bin")
        try:
            os.replace(tmp, entry)  # atomic: readers never see a half-written entry
        except OSError:  # another process filled the same entry first; its files are identical
            shutil.rmtree(tmp)
    val_path = entry / "val.u32.bin"
    return (open_token_memmap(str(entry / "train.u32.bin")),
            open_token_memmap(str(val_path)) if val_path.is_file() else None)


def _cache_key(source: str, tokenizer: Tokenizer, val_fraction: float, seed: int, text_field: str) -> str:
    h = hashlib.sha256()
    files = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in local_files(source)]
    h.update(json.dumps([CACHE_VERSION, files, text_field, val_fraction, seed]).encode())
    h.update(tokenizer_fingerprint(tokenizer).encode())
    return h.hexdigest()[:20]


@dataclass
class TextData(DataSchema):
    """`data:` of kind text: documents packed into blocks of seq_len tokens (causal-LM pre-training)."""

    kind: Literal["text"] = "text"  # documents packed into seq_len blocks
    source: str | None = None  # hub id (`allenai/c4:en`), file, directory, glob or `.bin` token file
    tokenizer: str = "byte"  # `byte`, a SentencePiece `.model` or a `tokenizer.json`
    seq_len: int = 1024  # tokens per training sequence
    val_fraction: float = 0.01  # share of documents held out for validation (of blocks, for a `.bin`)
    text_field: str = "text"  # field holding a document's text (jsonl, json, parquet, hub)

    def check(self) -> None:
        super().check()
        check_tokenized(self)

    def check_files(self) -> None:
        check_source_files(self)

    def no_validation(self) -> str | None:
        return missing_validation(self.source, self.val_fraction, self.seq_len, self.text_field)

    def build(self, tokenizer: Tokenizer, seed: int, cache_dir: Path) -> tuple[Dataset, Dataset | None]:
        return build_text_datasets(self.source, tokenizer, self.seq_len, self.val_fraction, seed,
                                   text_field=self.text_field, cache_dir=cache_dir)
