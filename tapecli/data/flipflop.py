"""Flip-flop language modelling (Liu et al., "Exposing Attention Glitches with Flip-Flop Language Modeling", arXiv
2306.00946), generated on the fly like the other synthetic tasks (tapecli.data.synthetic).

A sequence is `length` / 2 (instruction, bit) pairs over the alphabet `w r i 0 1` (tokenizer `flip-flop`):
instruction `w` (write) and `i` (ignore) carry a uniformly random bit; `r` (read) carries the bit of the most recent
`w`. The first instruction is always `w` and the last always `r`; the others are `i` with probability `p_ignore`
and `w` or `r` with probability (1 - p_ignore) / 2 each: the paper's FFL(p_i). Training is FFL(0.8) at 512 tokens;
the test splits are the same law at p_i = 0.98 (sparse: long gaps between a write and its read) and p_i = 0.1
(dense), as in the paper. The model is trained with next-token loss on every token (the random bits are
unpredictable, so a perfect model's loss is not zero) and scored on the read bits only, the deterministic tokens:
the paper's error is 1 - the per-token accuracy over them; whole-sequence accuracy counts sequences with every read
bit right.

Each sequence is a pure function of (task, split, seed, index) (tapecli.data.synthetic.example_rng).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar, Literal

from tapecli.data.schema import positive
from tapecli.data.synthetic import Example, Spec, SyntheticData
from tapecli.errors import TapeError

WRITE, READ, IGNORE = "w", "r", "i"
BITS = "01"


@dataclass(frozen=True)
class FlipFlopSpec:
    """A flip-flop split: `length` tokens ((instruction, bit) pairs), `p_ignore` the probability of `i`."""

    tokenizer: ClassVar[str] = "flip-flop"
    counts_objects: ClassVar[bool] = False
    length: int
    p_ignore: float

    def example(self, rng: random.Random) -> Example:
        pairs = self.length // 2
        text, scored, memory = [], [], ""
        for k in range(pairs):
            if k == 0:
                instruction = WRITE
            elif k == pairs - 1:
                instruction = READ
            else:
                u = rng.random()
                instruction = IGNORE if u < self.p_ignore else WRITE if u < (1 + self.p_ignore) / 2 else READ
            bit = memory if instruction == READ else rng.choice(BITS)
            if instruction == WRITE:
                memory = bit
            text += [instruction, bit]
            scored += [False, instruction == READ]
        return Example("".join(text), [True] * len(text), scored)


def _check_length(key: str, length: int) -> None:
    if length < 4 or length % 2:
        raise TapeError(f"{key}: a flip-flop sequence is (instruction, bit) pairs, a write first and a read last: "
                        f"an even number of tokens >= 4, got {length}")


def _check_probability(key: str, p: float) -> None:
    if not 0 <= p < 1:
        raise TapeError(f"{key}: must be in [0, 1) (the probability of an ignore instruction), got {p}")


@dataclass
class FlipFlopEval:
    """`eval:` of kind flip-flop: the splits of `tape eval synthetic` (IID is the training distribution)."""

    samples: int = 100  # sequences per split
    dense_ignore: float = 0.1  # OOD-dense split: probability of an ignore instruction (paper: FFL(0.1))
    sparse_ignore: float = 0.98  # OOD-sparse split: probability of an ignore instruction (paper: FFL(0.98))

    def check(self) -> None:
        positive("eval.samples", self.samples)
        _check_probability("eval.dense_ignore", self.dense_ignore)
        _check_probability("eval.sparse_ignore", self.sparse_ignore)


@dataclass
class FlipFlopData(SyntheticData):
    """`data:` of kind flip-flop: write / ignore / read instructions with bits; the loss on every token, the
    accuracy on the read bits."""

    Eval: ClassVar[type] = FlipFlopEval
    TOKENIZER: ClassVar[str] = "flip-flop"

    kind: Literal["flip-flop"] = "flip-flop"  # flip-flop language: remember the last written bit
    seq_len: int = 512  # tokens per sequence ((instruction, bit) pairs; the paper's T = 512), every split
    p_ignore: float = 0.8  # probability of an ignore instruction in training (paper: FFL(0.8))
    train_size: int | None = None  # a fixed training set of this many sequences; null: an endless stream

    def check(self) -> None:
        super().check()
        _check_length("data.seq_len", self.seq_len)
        _check_probability("data.p_ignore", self.p_ignore)

    def iid_spec(self) -> FlipFlopSpec:
        return FlipFlopSpec(self.seq_len, self.p_ignore)

    def split_specs(self, evaluation: FlipFlopEval) -> dict[str, Spec]:
        """OOD splits change the probability of an ignore instruction (eval.dense_ignore, eval.sparse_ignore)."""
        return {"iid": self.iid_spec(), "ood-dense": FlipFlopSpec(self.seq_len, evaluation.dense_ignore),
                "ood-sparse": FlipFlopSpec(self.seq_len, evaluation.sparse_ignore)}
