"""The `babilong` data kind: BABILong prompts generated on the fly for training small models, the loss on the answer.

Item i of the training stream is a pure function of (train.seed, i): task `tasks[i % len(tasks)]`, a length drawn
from `data.lengths`, the facts anywhere in the distractor text (or at a depth drawn from `data.depths`), made by the
evaluation's own generator (`tapecli.data.babilong.samples.Generator`) with the run's tokenizer; it becomes
`[BOS] prompt " answer" [EOS]` laid out as the `pairs` kind lays out a row (`tapecli.data.pairs.encode_pair`: the loss
on the answer's tokens and EOS only). So a trained model reads exactly what `tape eval babilong` shows it. The
stories are seeded in their own namespace ("train-SEED", "val-SEED"), never the evaluation's (an integer seed): the
evaluation's prompts are not trained on (short stories can coincide by chance, as the world is small; with distractor
text the prompts differ). Validation is always 256 fixed items of a separately seeded stream (no `val_fraction`).

`BabilongData` and `BabilongEval` are the recipe's `data:` and `eval:` sections of kind `babilong`
(tapecli.data.schema); the `eval:` keys are what `tape eval babilong --model RUN` and `tape sweep` evaluate by default.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch.utils.data import Dataset

from tapecli.data.babilong.world import resolve_tasks
from tapecli.data.schema import DataSchema, check_text_tokenizer, positive
from tapecli.errors import TapeError

TRAIN_STREAM_LENGTH = 2**31  # indices are seeds: this only bounds what an index may be
VAL_SAMPLES = 256


class BabilongDataset(Dataset):
    """`ds[i] -> (input_ids, labels)` for item i of one split (see the module docstring); read in order."""

    def __init__(self, data: Any, tokenizer: Any, haystack: Any, seed: int, split: str, length: int) -> None:
        from tapecli.data.babilong.samples import Generator

        self.data, self.tokenizer, self.length, self.split = data, tokenizer, length, split
        self.generator = Generator(tokenizer, haystack, data.prompt, f"{split}-{seed}", data.depth_window)
        self.tasks = [t.strip() for t in data.tasks.split(",")]

    def __len__(self) -> int:
        return self.length

    def sample(self, index: int) -> Any:
        """The BABILong sample behind item `index`."""
        if not 0 <= index < self.length:
            raise IndexError(index)
        rng = random.Random(f"babilong-{self.split}:{self.generator.seed}:{index}")
        length = rng.choice(self.data.lengths)
        depth = rng.choice(self.data.depths) if self.data.depths else None
        return self.generator.sample(self.tasks[index % len(self.tasks)], length, depth, index)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from tapecli.data.pairs import encode_pair

        sample = self.sample(index)
        input_ids, labels = encode_pair(self.tokenizer, sample.prompt, " " + sample.target, self.data.seq_len)
        return torch.from_numpy(input_ids), torch.from_numpy(labels)


@dataclass
class BabilongEval:
    """`eval:` of kind babilong: what `tape eval babilong --model RUN` (and `tape sweep`) evaluates by default."""

    tasks: str = "qa1"  # all, or comma-separated qa1..qa5
    lengths: list[int] = field(default_factory=lambda: [0, 256, 512, 1024, 2048])  # tokens; 0: facts only
    depths: list[float] | None = field(default_factory=lambda: [0.0, 0.5, 1.0])  # fact depths; null: anywhere
    samples: int = 20  # samples per task, length and depth
    seed: int = 0  # the evaluation's stories (never the training's)

    def check(self) -> None:
        resolve_tasks(self.tasks, "eval.tasks")
        if not self.lengths or min(self.lengths) < 0:
            raise TapeError(f"eval.lengths: token counts of 0 (facts only) or more, got {self.lengths}")
        _check_depths("eval.depths", self.depths)
        positive("eval.samples", self.samples)


@dataclass
class BabilongData(DataSchema):
    """`data:` of kind babilong: BABILong prompts generated on the fly, the loss on the answer."""

    Eval: ClassVar[type] = BabilongEval
    evaluation: ClassVar[str] = "babilong"

    kind: Literal["babilong"] = "babilong"  # bAbI facts in distractor text, answer after the question
    tokenizer: str = "byte"  # `byte`, a SentencePiece `.model` or a `tokenizer.json`
    seq_len: int = 256  # tokens per example: at least max(lengths)
    tasks: str = "qa1"  # all, or comma-separated qa1..qa5 (item i is task i mod their number)
    lengths: list[int] = field(default_factory=lambda: [128, 192, 256])  # prompt + 15 tokens fit; 0: facts only
    depths: list[float] | None = None  # depths drawn for the facts; null: anywhere (BABILong's placement)
    depth_window: float = 0.2  # width of a depth's window, a fraction of the distractor text
    prompt: Literal["full", "no-examples", "bare"] = "bare"  # BABILong's prompt style
    haystack: str | None = None  # distractor text file or folder; null: RULER's noise sentences

    def ignored_keys(self) -> dict[str, str]:
        return {} if self.depths else {"data.depth_window": "unused with data.depths null (the facts go anywhere)"}

    def check(self) -> None:
        super().check()
        check_text_tokenizer(self)
        resolve_tasks(self.tasks, "data.tasks")
        if not self.lengths or min(self.lengths) < 0:
            raise TapeError(f"data.lengths: token counts of 0 (facts only) or more, got {self.lengths}")
        if max(self.lengths) > self.seq_len:
            raise TapeError(f"data.seq_len: {self.seq_len} is shorter than the longest of data.lengths "
                            f"({max(self.lengths)}); raise it to at least that")
        _check_depths("data.depths", self.depths)
        if not 0 < self.depth_window <= 1:
            raise TapeError(f"data.depth_window: must be in (0, 1], got {self.depth_window}")
        if self.haystack and not Path(self.haystack).expanduser().exists():
            raise TapeError(f"data.haystack: {self.haystack} does not exist (a text file or a folder of them)")

    def build(self, tokenizer: Any, seed: int, cache_dir: Path) -> tuple[BabilongDataset, BabilongDataset]:
        from tapecli.data.babilong.samples import Haystack

        haystack = Haystack()
        if self.haystack:
            from tapecli.data.ruler.sources import read_essay
            from tapecli.data.sentences import sentence_splitter

            haystack = Haystack(read_essay(self.haystack)[0], sentence_splitter()[1])
        return (BabilongDataset(self, tokenizer, haystack, seed, "train", TRAIN_STREAM_LENGTH),
                BabilongDataset(self, tokenizer, haystack, seed, "val", VAL_SAMPLES))


def _check_depths(key: str, depths: list[float] | None) -> None:
    if depths is not None and (not depths or any(not 0 <= d <= 1 for d in depths)):
        raise TapeError(f"{key}: fractions in [0, 1], or null for anywhere; got {depths}")
