"""Prompt/target datasets for fine-tuning: the loss is taken on the target only.

Each row (`prompt_field`, `target_field`) of a jsonl/json/parquet file (or hub dataset) becomes the sequence
`[BOS] prompt target [EOS]`, laid out like a packed block (`tapecli.data.text`): `input_ids = seq[:-1]`,
`labels = seq[1:]`, right-padded to seq_len with pad_id. Labels are -100 wherever the token to predict is part of
the prompt, and on padding, so only the target tokens and the final EOS are learned. A row longer than
seq_len + 1 tokens loses prompt tokens from the left (the target is never cut); a target longer than seq_len - 2
tokens is an error, since then not even one prompt token would fit.

`PairsData` is the recipe's `data:` section of kind `pairs` (tapecli.data.schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from tapecli.data.schema import DataSchema, check_source_files, check_tokenized
from tapecli.data.sources import is_hub_source, iter_rows
from tapecli.data.text import IGNORE_INDEX, choose_validation
from tapecli.data.tokenizer import Tokenizer
from tapecli.errors import TapeError


def encode_pair(tokenizer: Tokenizer, prompt: str, target: str, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, labels), both int64 arrays of length seq_len, for one prompt/target pair."""
    prompt_ids, target_ids = tokenizer.encode(prompt), tokenizer.encode(target)
    if len(target_ids) > seq_len - 2:
        raise TapeError(f"a target of {len(target_ids)} tokens does not fit seq_len {seq_len} "
                        f"(at most {seq_len - 2}); raise seq_len or shorten the targets")
    prompt_room = seq_len + 1 - 2 - len(target_ids)  # the whole sequence is seq_len + 1 tokens, 2 of them BOS/EOS
    prompt_ids = prompt_ids[max(0, len(prompt_ids) - prompt_room) :]
    seq = [tokenizer.bos_id, *prompt_ids, *target_ids, tokenizer.eos_id]

    input_ids = np.full(seq_len, tokenizer.pad_id, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    input_ids[: len(seq) - 1] = seq[:-1]
    # Position j predicts seq[j + 1]; the target starts at seq index 1 + len(prompt_ids).
    first = len(prompt_ids)
    labels[first : len(seq) - 1] = seq[first + 1 :]
    return input_ids, labels


class PairDataset(Dataset):
    """Pre-encoded prompt/target examples; `ds[i] -> (input_ids, labels)` LongTensors of length seq_len."""

    def __init__(self, input_ids: np.ndarray, labels: np.ndarray) -> None:
        self.input_ids, self.labels = torch.from_numpy(input_ids), torch.from_numpy(labels)
        self.num_examples = len(self.input_ids)

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.input_ids[i], self.labels[i]


def build_pair_datasets(source: str, tokenizer: Tokenizer, seq_len: int, val_fraction: float, seed: int,
                        prompt_field: str = "prompt", target_field: str = "target",
                        ) -> tuple[PairDataset, PairDataset | None]:
    """(train, validation or None); validation is a seeded choice of whole rows (see `choose_validation`)."""
    if seq_len < 3:
        raise TapeError(f"seq_len must be >= 3 for prompt/target data, got {seq_len}")
    if not 0 <= val_fraction < 1:
        raise TapeError(f"val_fraction must be in [0, 1), got {val_fraction}")
    encoded = [encode_pair(tokenizer, prompt, target, seq_len)
               for prompt, target in iter_rows(source, (prompt_field, target_field))]
    if not encoded:
        raise TapeError(f"{source} contains no rows")
    input_ids = np.stack([e[0] for e in encoded])
    labels = np.stack([e[1] for e in encoded])
    is_val = choose_validation(len(encoded), val_fraction, seed)
    train = PairDataset(input_ids[~is_val], labels[~is_val])
    val = PairDataset(input_ids[is_val], labels[is_val]) if is_val.any() else None
    return train, val


@dataclass
class PairsData(DataSchema):
    """`data:` of kind pairs: prompt/target rows, the loss on the target only (fine-tuning)."""

    kind: Literal["pairs"] = "pairs"  # prompt/target rows, the loss on the target
    source: str | None = None  # jsonl, json or parquet file, directory, glob or hub id of the rows
    tokenizer: str = "byte"  # `byte`, a SentencePiece `.model` or a `tokenizer.json`
    seq_len: int = 1024  # tokens per example (prompts are cut from the left to fit)
    val_fraction: float = 0.01  # share of rows held out for validation
    prompt_field: str = "prompt"  # field holding the prompt
    target_field: str = "target"  # field holding the target

    def check(self) -> None:
        super().check()
        check_tokenized(self)

    def check_files(self) -> None:
        check_source_files(self)

    def no_validation(self) -> str | None:
        if self.val_fraction <= 0:
            return "data.val_fraction is 0 (pass data.val_fraction=0.01 to hold out 1% of the rows)"
        if is_hub_source(self.source):  # a seeded choice of rows: a hub set has more than one
            return None
        rows = len(list(islice(iter_rows(self.source, (self.prompt_field, self.target_field)), 2)))
        return None if rows >= 2 else (f"data.source {self.source} holds one row, and the validation split is a "
                                       "choice of whole rows (data.val_fraction of them, never all): give two or more")

    def build(self, tokenizer: Tokenizer, seed: int, cache_dir: Path) -> tuple[PairDataset, PairDataset | None]:
        return build_pair_datasets(self.source, tokenizer, self.seq_len, self.val_fraction, seed,
                                   prompt_field=self.prompt_field, target_field=self.target_field)
