"""MapFormer's synthetic length-generalisation tasks (Rambaud et al., arXiv 2511.19279): selective copy and forced
navigation on a 1D or 2D grid, generated on the fly like the addition data.

The paper's code is not public; every choice below that its text leaves open is ours and is stated here.

Tokens (one tokenizer for all three tasks, `synthetic`): PAD=0, BOS=1, EOS=2, then the characters
`abcdefghijklmnop` (16 content symbols / grid objects), `_` (a blank), `|` (selective copy's separator) and the
actions `L R U D`. A sequence is a string of those characters; the model reads BOS + the sequence without its last
token and predicts every next token (`labels[t]` follows `input_ids[: t + 1]`).

Selective copy (`selective-copy`): `n_tokens` symbols drawn uniformly from 16, mixed with `blanks` blanks at
uniformly random positions, then `|`, then the symbols again in order. Loss and accuracy on the copied symbols
only. A sequence is 2 * n_tokens + blanks + 1 tokens. Splits change only the number of blanks.

Grid navigation (`grid-1d`, `grid-2d`): a torus of `width` cells (1D) or width x width cells (2D); each cell holds
one of the 16 objects, or a blank with probability `p_empty`, drawn per sequence. The agent starts at a uniformly
random cell; the sequence is its first observation, then (action, observation) pairs: the walk repeats "pick a
direction uniformly, walk k steps" with k uniform in 1..10 (1D) or 1..3 (2D), wrapping around at the edges. The
sequence is cut at exactly `length` tokens. Loss on every token; accuracy on the observations of cells that the
agent has seen before in the same sequence (blank or not), the only ones that can be predicted.

Every sequence is a pure function of (task, split name, seed, index): random access, reproducible, nothing on disk.
Everything here is plain Python; torch is imported only where tensors are built.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError

TASKS = ("selective-copy", "grid-1d", "grid-2d")
SPLITS = ("iid", "ood-dense", "ood-sparse")
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
    positions the accuracy counts); position t is the t-th character, predicted from BOS + text[:t]."""

    text: str
    targets: list[bool]
    scored: list[bool]


@dataclass(frozen=True)
class CopySpec:
    """A selective-copy split: `n_tokens` symbols among `blanks` blanks."""

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
    """A grid-navigation split: `length` tokens on a torus `width` cells wide, blank cells with prob. `p_empty`."""

    task: str
    length: int
    width: int
    p_empty: float

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
                position = tuple((p + m) % self.width for p, m in zip(position, actions[action], strict=True))
                observation, seen = observe(position)
                text += [action, observation]
                scored += [False, seen]
        text, scored = text[: self.length], scored[: self.length]
        return Example("".join(text), [True] * self.length, scored)


Spec = CopySpec | GridSpec


def split_specs(task: str, data: Any, evaluation: Any) -> dict[str, Spec]:
    """The three splits of `task` from a recipe's `data` and `eval` sections (see their YAML comments).

    IID is the training distribution; selective copy's OOD splits change the number of blanks
    (`eval.dense_blanks`, `eval.sparse_blanks`), grid navigation's the [length, width, p_empty] triple
    (`eval.dense_grid`, `eval.sparse_grid`); a grid's IID length is `data.seq_len`.
    """
    if task == "selective-copy":
        return {"iid": CopySpec(data.copy_tokens, data.blanks),
                "ood-dense": CopySpec(data.copy_tokens, evaluation.dense_blanks),
                "ood-sparse": CopySpec(data.copy_tokens, evaluation.sparse_blanks)}
    if task in MAX_RUN:
        dense, sparse = evaluation.dense_grid, evaluation.sparse_grid
        return {"iid": GridSpec(task, data.seq_len, data.grid_width, data.p_empty),
                "ood-dense": GridSpec(task, int(dense[0]), int(dense[1]), float(dense[2])),
                "ood-sparse": GridSpec(task, int(sparse[0]), int(sparse[1]), float(sparse[2]))}
    raise TapeError(f"data.kind: '{task}' is not a synthetic task; one of {', '.join(TASKS)}")


def example_rng(task: str, split: str, seed: int, index: int) -> random.Random:
    """The generator of one sequence; seeding with a string hashes it (SHA-512): stable across Python versions."""
    return random.Random(f"{task}-{split}:{seed}:{index}")


class SyntheticDataset:
    """Sequences of one split; item i is a pure function of (task, split, seed, i).

    `ds[i]` is `(input_ids, labels)`, `LongTensor[seq_len]` each: BOS + the sequence without its last token, and
    the sequence itself where it carries a loss (-100 elsewhere and on the PAD tail). `ds.example(i)` is the
    `Example` behind it (what the evaluation scores).
    """

    def __init__(self, task: str, spec: Spec, seed: int, split: str, length: int, seq_len: int) -> None:
        if spec.length > seq_len:
            raise TapeError(f"data.seq_len: {seq_len} is shorter than a {task} sequence of this split "
                            f"({spec.length} tokens)")
        self.task, self.spec, self.seed, self.split = task, spec, seed, split
        self.length, self.seq_len = length, seq_len
        self.tokenizer = CharTokenizer("synthetic")

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


def build_synthetic_datasets(recipe: Any) -> tuple[SyntheticDataset, SyntheticDataset]:
    """The endless training stream and a fixed validation set (2,048 sequences) of the IID split of
    `data.kind`, seeded by `train.seed` (validation from a separately seeded stream)."""
    d, seed = recipe.data, recipe.train.seed
    iid = split_specs(d.kind, d, recipe.eval)["iid"]
    train = SyntheticDataset(d.kind, iid, seed, "train", TRAIN_STREAM_LENGTH, d.seq_len)
    val = SyntheticDataset(d.kind, iid, seed, "val", VAL_SAMPLES, d.seq_len)
    return train, val


def validate_synthetic(data: Any, evaluation: Any) -> None:
    """Recipe checks of the synthetic keys (run for every recipe: the keys exist in all of them)."""
    if (data.kind in TASKS) != (data.tokenizer == "synthetic"):
        raise TapeError(f"data.tokenizer: '{data.tokenizer}' does not fit data.kind '{data.kind}'; the synthetic "
                        f"tasks ({', '.join(TASKS)}) and the `synthetic` tokenizer go together")
    for key, value, low in [("data.copy_tokens", data.copy_tokens, 1), ("data.blanks", data.blanks, 0),
                            ("eval.dense_blanks", evaluation.dense_blanks, 0),
                            ("eval.sparse_blanks", evaluation.sparse_blanks, 0),
                            ("data.grid_width", data.grid_width, 2)]:
        if value < low:
            raise TapeError(f"{key}: must be >= {low}, got {value}")
    if not 0 <= data.p_empty <= 1:
        raise TapeError(f"data.p_empty: must be in [0, 1], got {data.p_empty}")
    for key, triple in [("eval.dense_grid", evaluation.dense_grid), ("eval.sparse_grid", evaluation.sparse_grid)]:
        if (len(triple) != 3 or any(v != int(v) or v < 2 for v in triple[:2]) or not 0 <= triple[2] <= 1):
            raise TapeError(f"{key}: expected [length, width, p_empty] with whole length and width >= 2 and "
                            f"p_empty in [0, 1], got {triple}")
    if data.kind == "selective-copy" and data.seq_len < CopySpec(data.copy_tokens, data.blanks).length:
        needed = CopySpec(data.copy_tokens, data.blanks).length
        raise TapeError(f"data.seq_len: {data.seq_len} is too short for selective copy with {data.copy_tokens} "
                        f"tokens and {data.blanks} blanks (needs 2 x {data.copy_tokens} + {data.blanks} + 1 = "
                        f"{needed})")
