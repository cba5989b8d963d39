"""MapFormer's synthetic length-generalisation tasks (Rambaud et al., arXiv 2511.19279): selective copy and forced
navigation on a 1D or 2D grid, generated on the fly like the addition data; and what every generated task shares
(`Example`, `SyntheticDataset`, `SyntheticData`), which the flip-flop (tapecli.data.flipflop) and counting
(tapecli.data.counting) tasks build on.

The paper's code is not public; every choice below that its text leaves open is ours and is stated here.

Tokens (one tokenizer for the MapFormer tasks, `synthetic`): PAD=0, BOS=1, EOS=2, then the characters
`abcdefghijklmnop` (16 content symbols / grid objects), `_` (a blank), `|` (selective copy's separator) and the
actions `L R U D`. A sequence is a string of those characters; the model reads BOS + the sequence without its last
token and predicts every next token (`labels[t]` follows `input_ids[: t + 1]`).

Selective copy (`selective-copy`): `n_tokens` symbols drawn uniformly from 16, mixed with `blanks` blanks at
uniformly random positions, then `|`, then the symbols again in order. Loss and accuracy on the copied symbols
only. A sequence is 2 * n_tokens + blanks + 1 tokens. Splits change only the number of blanks.

Grid navigation (`grid-1d`, `grid-2d`): a torus of `width` cells (1D) or width x width cells (2D); each cell holds
one of the 16 objects, or a blank with probability `p_empty`, drawn per sequence. The agent starts at a uniformly
random cell; the sequence is its first observation, then (action, observation) pairs: the walk repeats "pick a
direction uniformly, walk k steps" with k uniform in 1..10 (1D) or 1..3 (2D), wrapping around at the edges (or,
with `edges: clamped`, staying put against them: the move is still written, the same cell observed again). The
sequence is cut at exactly `length` tokens. Loss on every token; accuracy on the observations of cells that the
agent has seen before in the same sequence (blank or not), the only ones that can be predicted; the evaluation also
reports the accuracy on those of them that hold an object (`counts_objects`).

Every sequence is a pure function of (task, split name, seed, index): random access, reproducible, nothing on disk.
Everything here is plain Python; torch is imported only where tensors are built.

`SelectiveCopyData`/`SelectiveCopyEval` and `GridData`/`GridEval` are the recipe's `data:` and `eval:` sections of
these kinds (tapecli.data.schema). Training is the endless IID stream seeded by `train.seed`, or, with
`data.train_size`, its first train_size sequences as a fixed set that the engine reshuffles every epoch
(`train.epochs`); validation is a fixed set of 2,048 IID sequences from a separately seeded stream (`val_fraction`
does not apply).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from tapecli.data.schema import DataSchema, positive
from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError

TASKS = ("selective-copy", "grid-1d", "grid-2d")  # this module's kinds (flip-flop and counting own theirs)
SPLITS = ("iid", "ood-dense", "ood-sparse")  # every generated task's splits; each kind says what they mean
SYMBOLS = "abcdefghijklmnop"
BLANK, SEPARATOR = "_", "|"
ACTIONS = {"grid-1d": {"L": (-1,), "R": (1,)},
           "grid-2d": {"U": (0, 1), "D": (0, -1), "L": (-1, 0), "R": (1, 0)}}
MAX_RUN = {"grid-1d": 10, "grid-2d": 3}  # k in 1..MAX_RUN steps per direction (the paper's values)
TRAIN_STREAM_LENGTH = 2**31  # indices are seeds: this only bounds what an index may be
VAL_SAMPLES = 2048


@dataclass(frozen=True)
class Example:
    """One sequence: `text` (its characters), `targets` (which positions carry a loss) and `scored` (which
    positions the accuracy counts, always among the targets); position t is the t-th character, predicted from
    BOS + text[:t]."""

    text: str
    targets: list[bool]
    scored: list[bool]


class Spec(Protocol):
    """One split of a generated task: how its sequences are drawn (a frozen dataclass of the split's parameters)."""

    tokenizer: ClassVar[str]  # the CharTokenizer its characters belong to
    counts_objects: ClassVar[bool]  # the evaluation also reports the accuracy on scored tokens that are not blank

    @property
    def length(self) -> int:
        """The longest sequence of the split, in tokens (what its tensors are padded to)."""

    def example(self, rng: random.Random) -> Example:
        """A sequence drawn with `rng`."""


@dataclass(frozen=True)
class CopySpec:
    """A selective-copy split: `n_tokens` symbols among `blanks` blanks."""

    tokenizer: ClassVar[str] = "synthetic"
    counts_objects: ClassVar[bool] = False
    n_tokens: int
    blanks: int

    @property
    def length(self) -> int:
        return 2 * self.n_tokens + self.blanks + 1

    def example(self, rng: random.Random) -> Example:
        content = [rng.choice(SYMBOLS) for _ in range(self.n_tokens)]
        slots = [BLANK] * (self.n_tokens + self.blanks)
        for position, symbol in zip(sorted(rng.sample(range(len(slots)), self.n_tokens)), content, strict=True):
            slots[position] = symbol
        prompt = "".join(slots) + SEPARATOR
        copied = [False] * len(prompt) + [True] * self.n_tokens
        return Example(prompt + "".join(content), copied, copied)


@dataclass(frozen=True)
class GridSpec:
    """A grid-navigation split: `length` tokens on a grid `width` cells wide, blank cells with prob. `p_empty`, whose
    edges wrap around (`torus`) or stop the walker (`clamped`)."""

    tokenizer: ClassVar[str] = "synthetic"
    counts_objects: ClassVar[bool] = True
    task: str
    length: int
    width: int
    p_empty: float
    edges: str = "torus"

    def example(self, rng: random.Random) -> Example:
        actions, max_run = ACTIONS[self.task], MAX_RUN[self.task]
        cells: dict[tuple[int, ...], str] = {}  # drawn when first seen: the same law as drawing the grid up front

        def observe(cell: tuple[int, ...]) -> tuple[str, bool]:
            seen = cell in cells
            if not seen:
                cells[cell] = BLANK if rng.random() < self.p_empty else rng.choice(SYMBOLS)
            return cells[cell], seen

        position = tuple(rng.randrange(self.width) for _ in next(iter(actions.values())))
        first, _ = observe(position)
        text, scored = [first], [False]
        while len(text) < self.length:
            action = rng.choice(list(actions))
            for _ in range(rng.randint(1, max_run)):
                moved = (p + m for p, m in zip(position, actions[action], strict=True))
                position = tuple(p % self.width if self.edges == "torus" else min(max(p, 0), self.width - 1)
                                 for p in moved)
                observation, seen = observe(position)
                text += [action, observation]
                scored += [False, seen]
        text, scored = text[: self.length], scored[: self.length]
        return Example("".join(text), [True] * self.length, scored)


def split_specs(task: str, data: Any, evaluation: Any) -> dict[str, Spec]:
    """The three splits of a generated task from a recipe's `data` and `eval` sections (`data.split_specs`)."""
    if not isinstance(data, SyntheticData) or data.kind != task:
        raise TapeError(f"data.kind: '{task}' is not the generated task of this data section")
    return data.split_specs(evaluation)


def example_rng(task: str, split: str, seed: int, index: int) -> random.Random:
    """The generator of one sequence; seeding with a string hashes it (SHA-512): stable across Python versions."""
    return random.Random(f"{task}-{split}:{seed}:{index}")


class SyntheticDataset:
    """Sequences of one split; item i is a pure function of (task, split, seed, i).

    `ds[i]` is `(input_ids, labels)`, `LongTensor[seq_len]` each: BOS + the sequence without its last token, and
    the sequence itself where it carries a loss (-100 elsewhere and on the PAD tail). `ds.example(i)` is the
    `Example` behind it (what the evaluation scores), `ds.scored_mask(indices)` its scored positions as a
    BoolTensor[len(indices), seq_len] aligned with the labels. `num_examples` is `length` for a fixed set (the
    engine reshuffles it every epoch) and None for a stream (`stream=True`: read in order, each index once).
    """

    def __init__(self, task: str, spec: Spec, seed: int, split: str, length: int, seq_len: int,
                 stream: bool = False) -> None:
        if spec.length > seq_len:
            raise TapeError(f"data.seq_len: {seq_len} is shorter than a {task} sequence of this split "
                            f"({spec.length} tokens)")
        self.task, self.spec, self.seed, self.split = task, spec, seed, split
        self.length, self.seq_len = length, seq_len
        self.num_examples = None if stream else length
        self.tokenizer = CharTokenizer(spec.tokenizer)

    def __len__(self) -> int:
        return self.length

    def example(self, index: int) -> Example:
        if not 0 <= index < self.length:
            raise IndexError(index)
        return self.spec.example(example_rng(self.task, self.split, self.seed, index))

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        import torch

        from tapecli.data.text import IGNORE_INDEX

        example, tok = self.example(index), self.tokenizer
        ids = tok.encode(example.text)
        pad = self.seq_len - len(ids)
        input_ids = [tok.bos_id] + ids[:-1] + [tok.pad_id] * pad
        labels = [i if target else IGNORE_INDEX for i, target in zip(ids, example.targets, strict=True)]
        return torch.tensor(input_ids), torch.tensor(labels + [IGNORE_INDEX] * pad)

    def scored_mask(self, indices: list[int]) -> Any:
        """BoolTensor[len(indices), seq_len]: the positions the task's accuracy counts (their labels are the true
        tokens), False on the PAD tail."""
        import torch

        rows = [self.example(i).scored for i in indices]
        return torch.tensor([row + [False] * (self.seq_len - len(row)) for row in rows], dtype=torch.bool)


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise TapeError(f"{key}: must be >= {low}, got {value}")


def _check_grid(key: str, triple: list[float]) -> None:
    if len(triple) != 3 or any(v != int(v) or v < 2 for v in triple[:2]) or not 0 <= triple[2] <= 1:
        raise TapeError(f"{key}: expected [length, width, p_empty] with whole length and width >= 2 and "
                        f"p_empty in [0, 1], got {triple}")


class SyntheticData(DataSchema):
    """Base of the generated tasks' `data:` schemas (dataclasses with a `train_size` field): their tokenizer, their
    splits (`iid_spec`, `split_specs`), the shared checks and how the datasets are built."""

    evaluation: ClassVar[str] = "synthetic"
    TOKENIZER: ClassVar[str] = "synthetic"  # the CharTokenizer the task's characters belong to
    train_size: int | None

    @property
    def tokenizer(self) -> str:
        """The task's own character tokenizer (CharTokenizer): not a recipe key."""
        return self.TOKENIZER

    def iid_spec(self) -> Spec:
        """The training distribution."""
        raise NotImplementedError

    def split_specs(self, evaluation: Any) -> dict[str, Spec]:
        """{split: spec} of SPLITS, from this section and the recipe's `eval` section; IID is the training
        distribution."""
        raise NotImplementedError

    def check(self) -> None:
        super().check()
        positive("data.train_size", self.train_size)
        if self.train_size is not None and self.train_size > TRAIN_STREAM_LENGTH:
            raise TapeError(f"data.train_size: at most {TRAIN_STREAM_LENGTH:,} sequences (2**31: a sequence's index "
                            f"seeds it), got {self.train_size:,}; use train.max_steps with data.train_size=null "
                            "for an endless stream")

    def build(self, tokenizer: Any, seed: int, cache_dir: Path) -> tuple[SyntheticDataset, SyntheticDataset]:
        """The training sequences (the first data.train_size of the stream seeded by `seed`, or the endless stream)
        and the fixed validation set of the IID split."""
        iid = self.iid_spec()
        fixed = self.train_size is not None
        train = SyntheticDataset(self.kind, iid, seed, "train", self.train_size if fixed else TRAIN_STREAM_LENGTH,
                                 self.seq_len, stream=not fixed)
        return train, SyntheticDataset(self.kind, iid, seed, "val", VAL_SAMPLES, self.seq_len)


@dataclass
class SelectiveCopyEval:
    """`eval:` of kind selective-copy: the splits of `tape eval synthetic` (IID is the training distribution)."""

    samples: int = 100  # sequences per split
    dense_blanks: int = 64  # OOD-dense split: blanks among the copied symbols
    sparse_blanks: int = 256  # OOD-sparse split: blanks among the copied symbols

    def check(self) -> None:
        positive("eval.samples", self.samples)
        _at_least("eval.dense_blanks", self.dense_blanks, 0)
        _at_least("eval.sparse_blanks", self.sparse_blanks, 0)


@dataclass
class SelectiveCopyData(SyntheticData):
    """`data:` of kind selective-copy: symbols among blanks, `|`, then the symbols again; the loss on the copy."""

    Eval: ClassVar[type] = SelectiveCopyEval

    kind: Literal["selective-copy"] = "selective-copy"  # copy the symbols found among blanks
    seq_len: int = 1024  # tokens per sequence: at least 2 x copy_tokens + blanks + 1
    copy_tokens: int = 128  # symbols to copy (from 16)
    blanks: int = 128  # blanks among them in training (the IID split)
    train_size: int | None = None  # a fixed training set of this many sequences; null: an endless stream

    def check(self) -> None:
        super().check()
        _at_least("data.copy_tokens", self.copy_tokens, 1)
        _at_least("data.blanks", self.blanks, 0)
        needed = CopySpec(self.copy_tokens, self.blanks).length
        if self.seq_len < needed:
            raise TapeError(f"data.seq_len: {self.seq_len} is too short for selective copy with {self.copy_tokens} "
                            f"tokens and {self.blanks} blanks (needs 2 x {self.copy_tokens} + {self.blanks} + 1 = "
                            f"{needed})")

    def iid_spec(self) -> CopySpec:
        return CopySpec(self.copy_tokens, self.blanks)

    def split_specs(self, evaluation: SelectiveCopyEval) -> dict[str, Spec]:
        """OOD splits change the number of blanks (eval.dense_blanks, eval.sparse_blanks)."""
        return {"iid": self.iid_spec(), "ood-dense": CopySpec(self.copy_tokens, evaluation.dense_blanks),
                "ood-sparse": CopySpec(self.copy_tokens, evaluation.sparse_blanks)}


@dataclass
class GridEval:
    """`eval:` of kinds grid-1d and grid-2d: the splits of `tape eval synthetic` (IID is the training distribution)."""

    samples: int = 100  # sequences per split
    dense_grid: list[float] = field(default_factory=lambda: [64, 32, 0.2])  # OOD-dense: length, width, p_empty
    sparse_grid: list[float] = field(default_factory=lambda: [256, 128, 0.8])  # OOD-sparse: length, width, p_empty

    def check(self) -> None:
        positive("eval.samples", self.samples)
        _check_grid("eval.dense_grid", self.dense_grid)
        _check_grid("eval.sparse_grid", self.sparse_grid)


@dataclass
class GridData(SyntheticData):
    """`data:` of kinds grid-1d and grid-2d: a walk on a torus (or a bounded grid) of objects, cut at seq_len tokens;
    the loss on every token."""

    Eval: ClassVar[type] = GridEval
    evaluation: ClassVar[str] = "synthetic-grid"  # `tape eval synthetic`, with the accuracy on revisited objects

    kind: Literal["grid-1d", "grid-2d"] = "grid-1d"  # a walk on a 1D or 2D torus
    seq_len: int = 1024  # tokens per sequence (the IID length)
    grid_width: int = 64  # cells per side of the torus in training
    p_empty: float = 0.5  # probability that a cell is blank in training
    edges: Literal["torus", "clamped"] = "torus"  # at an edge, every split: wrap around, or stay put (clamped)
    train_size: int | None = None  # a fixed training set of this many sequences; null: an endless stream

    def check(self) -> None:
        super().check()
        _at_least("data.grid_width", self.grid_width, 2)
        if not 0 <= self.p_empty <= 1:
            raise TapeError(f"data.p_empty: must be in [0, 1], got {self.p_empty}")

    def iid_spec(self) -> GridSpec:
        return GridSpec(self.kind, self.seq_len, self.grid_width, self.p_empty, self.edges)

    def split_specs(self, evaluation: GridEval) -> dict[str, Spec]:
        """OOD splits change the [length, width, p_empty] triple (eval.dense_grid, eval.sparse_grid)."""
        dense, sparse = evaluation.dense_grid, evaluation.sparse_grid
        return {"iid": self.iid_spec(),
                "ood-dense": GridSpec(self.kind, int(dense[0]), int(dense[1]), float(dense[2]), self.edges),
                "ood-sparse": GridSpec(self.kind, int(sparse[0]), int(sparse[1]), float(sparse[2]), self.edges)}
