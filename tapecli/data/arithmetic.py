"""Addition data in the format of McLeish et al. (Abacus embeddings, 2024): `a+b=c`, every number reversed.

An example with a = 123, b = 45 (sum 168) is the character string `321+54=861` followed by EOS: every number is
written least-significant digit first, so the model can produce the sum in the order a carry propagates.
The prompt is `321+54=`, the target is `861` + EOS, and the loss is taken on the target only.

Operand lengths follow the "bucket" method: each operand's number of digits is drawn uniformly from
[min_digits, max_digits], independently, then the number uniformly among those with exactly that many digits
(no leading zero, except the one-digit number 0). Every problem is a pure function of (seed, index), so the
training stream is random-access, reproducible and effectively infinite, and nothing is written to disk.

`AdditionData` and `AdditionEval` are the recipe's `data:` and `eval:` sections of kind `addition`
(tapecli.data.schema).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch.utils.data import Dataset

from tapecli.data.schema import DataSchema, positive
from tapecli.data.text import IGNORE_INDEX
from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError

# Length of the training stream: indices are seeds, not rows, so this only bounds what an index may be.
TRAIN_STREAM_LENGTH = 2**31
# A fixed-size validation set is enough to track in-distribution loss; its size does not scale with anything.
VAL_SAMPLES = 2048


def reverse_digits(n: int) -> str:
    """The decimal digits of n, least significant first: 120 -> '021'."""
    return str(n)[::-1]


def prompt_text(a: int, b: int) -> str:
    """What the model is shown: `a_rev+b_rev=`."""
    return f"{reverse_digits(a)}+{reverse_digits(b)}="


def random_number(rng: random.Random, digits: int) -> int:
    """A uniform number with exactly `digits` digits (0-9 when digits == 1)."""
    return rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def eval_problems(first_digits: int, second_digits: int, samples: int, seed: int) -> list[tuple[int, int]]:
    """The fixed problems of one evaluation cell: `samples` pairs with exactly the given digit counts.

    Seeded by (seed, first_digits, second_digits) only, and drawn in sequence, so a cell's problems do not
    depend on which other cells are evaluated, and its first k problems are the same for every samples >= k.
    """
    rng = random.Random(f"addition-eval:{seed}:{first_digits}:{second_digits}")
    return [(random_number(rng, first_digits), random_number(rng, second_digits)) for _ in range(samples)]


def max_example_tokens(max_digits: int) -> int:
    """Tokens in the longest example: two operands, `+`, `=`, a (max_digits + 1)-digit sum and EOS."""
    return 2 * max_digits + 2 + max_digits + 1 + 1


class AdditionDataset(Dataset):
    """Bucket-method addition problems; item i is a pure function of (seed, split, i).

    `ds[i]` returns `(input_ids, labels)`, both `LongTensor[seq_len]` and already shifted for next-token
    prediction: `labels[t]` is the token that should follow `input_ids[: t + 1]`. Labels are -100 except where
    the next token belongs to the answer (its digits and the EOS), and the tail is padded with PAD.
    """

    def __init__(
        self, seed: int, min_digits: int, max_digits: int, seq_len: int, length: int, split: str = "train"
    ) -> None:
        if not 1 <= min_digits <= max_digits:
            raise TapeError(f"data.min_digits ({min_digits}) must be between 1 and data.max_digits ({max_digits})")
        # +1: the inputs drop the last token of the example, the labels drop the first.
        if seq_len + 1 < max_example_tokens(max_digits):
            raise TapeError(
                f"data.seq_len: {seq_len} is too short for {max_digits}-digit operands; "
                f"use at least {max_example_tokens(max_digits) - 1}"
            )
        self.seed, self.split, self.length = seed, split, length
        self.min_digits, self.max_digits, self.seq_len = min_digits, max_digits, seq_len
        self.tokenizer = CharTokenizer("addition")

    def __len__(self) -> int:
        return self.length

    def problem(self, index: int) -> tuple[int, int]:
        """The operands (a, b) of example `index`."""
        if not 0 <= index < self.length:
            raise IndexError(index)
        # Seeding with a string hashes it (SHA-512), which is stable across runs and Python versions.
        rng = random.Random(f"addition-{self.split}:{self.seed}:{index}")
        first = rng.randint(self.min_digits, self.max_digits)
        second = rng.randint(self.min_digits, self.max_digits)
        return random_number(rng, first), random_number(rng, second)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = self.problem(index)
        tok = self.tokenizer
        prompt = tok.encode(prompt_text(a, b))
        answer = tok.encode(reverse_digits(a + b)) + [tok.eos_id]
        tokens = prompt + answer
        pad = self.seq_len + 1 - len(tokens)
        input_ids = torch.tensor(tokens[:-1] + [tok.pad_id] * pad)
        labels = torch.tensor([IGNORE_INDEX] * (len(prompt) - 1) + answer + [IGNORE_INDEX] * pad)
        return input_ids, labels


def build_addition_datasets(data: Any, seed: int) -> tuple[AdditionDataset, AdditionDataset, CharTokenizer]:
    """The training stream, a fixed validation set and the tokenizer for a recipe's `data` section.

    Reads `data.min_digits`, `data.max_digits` and `data.seq_len`. The training stream has 2**31 items (use
    as many as the step budget needs); validation is 2,048 problems from the same distribution drawn
    from a separately seeded stream (short problems can coincide with training ones by chance: with one-digit
    operands there are only 100 problems in all).
    """
    common = dict(seed=seed, min_digits=data.min_digits, max_digits=data.max_digits, seq_len=data.seq_len)
    train = AdditionDataset(**common, length=TRAIN_STREAM_LENGTH, split="train")
    val = AdditionDataset(**common, length=VAL_SAMPLES, split="val")
    return train, val, train.tokenizer


@dataclass
class AdditionEval:
    """`eval:` of kind addition: the grid of `tape eval addition`."""

    max_len: int | None = None  # largest operand length evaluated; null = 2 x data.max_digits
    samples: int = 100  # problems per (length, length) cell

    def check(self) -> None:
        positive("eval.max_len", self.max_len)
        positive("eval.samples", self.samples)


@dataclass
class AdditionData(DataSchema):
    """`data:` of kind addition: generated problems, operands and answer reversed, the loss after `=` only.
    Validation is a fixed, separately seeded set of 2,048 problems; the tokenizer is always `addition`."""

    Eval: ClassVar[type] = AdditionEval
    evaluation: ClassVar[str] = "addition"

    kind: Literal["addition"] = "addition"  # generated addition problems
    seq_len: int = 1024  # tokens per example; n-digit operands need 3n + 4
    max_digits: int = 40  # longest operand in training
    min_digits: int = 1  # shortest operand in training

    @property
    def tokenizer(self) -> str:
        """Always `addition` (digits, +, =): not a recipe key."""
        return "addition"

    def check(self) -> None:
        super().check()
        positive("data.max_digits", self.max_digits)
        positive("data.min_digits", self.min_digits)
        if self.min_digits > self.max_digits:
            raise TapeError(f"data.min_digits: {self.min_digits} exceeds data.max_digits ({self.max_digits})")
        needed = max_example_tokens(self.max_digits)  # a + b = c <eos>
        if self.seq_len < needed:
            raise TapeError(f"data.seq_len: {self.seq_len} is too short for {self.max_digits}-digit addition "
                            f"(needs {needed} tokens)")

    def build(self, tokenizer: Any, seed: int, cache_dir: Path) -> tuple[AdditionDataset, AdditionDataset]:
        train, val, _ = build_addition_datasets(self, seed)
        return train, val
