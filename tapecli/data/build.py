"""The data kinds, in one static table (`KINDS`), and the one call that builds a recipe's datasets.

Each kind owns, in its module, its `data:` and `eval:` schemas, their checks and how its datasets are built
(tapecli.data.schema says what a kind provides):

    text                        tapecli.data.text       TextData         packed causal-LM pre-training
    pairs                       tapecli.data.pairs      PairsData        prompt/target fine-tuning
    addition                    tapecli.data.arithmetic AdditionData     generated addition problems
    scrolls                     tapecli.data.scrolls    ScrollsData      SCROLLS fine-tuning
    selective-copy, grid-1d/2d  tapecli.data.synthetic  SelectiveCopyData, GridData   MapFormer's synthetic tasks
    flip-flop                   tapecli.data.flipflop   FlipFlopData     flip-flop language modelling (Liu et al.)
    counting                    tapecli.data.counting   CountingData     CoPE's counting task
    babilong                    tapecli.data.babilong.training  BabilongData   bAbI facts in distractor text (BABILong)

Every dataset yields `(input_ids, labels)` LongTensors of `data.seq_len`, labels already shifted for next-token
prediction and -100 where no loss is taken.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapecli.data.arithmetic import AdditionData
from tapecli.data.babilong.training import BabilongData
from tapecli.data.counting import CountingData
from tapecli.data.flipflop import FlipFlopData
from tapecli.data.pairs import PairsData
from tapecli.data.schema import DataSchema
from tapecli.data.scrolls import ScrollsData
from tapecli.data.synthetic import GridData, SelectiveCopyData
from tapecli.data.text import TextData

KINDS: dict[str, type[DataSchema]] = {
    "text": TextData,
    "pairs": PairsData,
    "addition": AdditionData,
    "scrolls": ScrollsData,
    "selective-copy": SelectiveCopyData,
    "grid-1d": GridData,
    "grid-2d": GridData,
    "flip-flop": FlipFlopData,
    "counting": CountingData,
    "babilong": BabilongData,
}


def build_datasets(recipe: Any, tokenizer: Any, cache_dir: Path) -> tuple[Any, Any | None]:
    """(train, validation or None) for a `tapecli.recipe.Recipe`'s data kind, seeded by `train.seed` (the recipe
    package imports this table, so the type is not imported here)."""
    return recipe.data.build(tokenizer, recipe.train.seed, cache_dir)
