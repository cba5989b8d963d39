"""Training pairs in RULER's format: prompt/target rows for the `pairs` data kind (loss on the answer only).

`training_pairs(task, lengths, count, n, seed)` runs the official generator (`tapecli.data.ruler.tasks.generate`)
once per length, with seed `seed + k` for the k-th length, and turns each sample into a row

    {"prompt": input + answer_prefix, "target": " " + " ".join(outputs), "task": ..., "length": ..., "index": ...}

The prompt is exactly what `tape eval ruler` feeds the model (after BOS); the target is the answer RULER's string
match looks for, after one space (the `pairs` kind encodes prompt and target separately, so the space belongs to the
target: pass a tokenizer that adds no dummy prefix). The evaluation draws with seed 42: pass another seed, so the
training keys and values are not the evaluation's (with 6.2M word keys and 9M numbers, a chance overlap is
negligible). `write_jsonl(rows, path)` writes them atomically for `data.source`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tapecli.data.ruler.constants import SEED
from tapecli.data.ruler.sizing import Counter
from tapecli.data.ruler.tasks import Sources, generate
from tapecli.errors import TapeError


def training_pairs(task: str, lengths: Sequence[int], count: Counter, n: int, seed: int,
                   sources: Sources | None = None) -> list[dict[str, Any]]:
    """`n` rows per length (see the module docstring), lengths in the order given."""
    if seed == SEED:
        raise TapeError(f"seed {SEED} is the evaluation's: training on it would train on the test samples")
    rows = []
    for k, length in enumerate(lengths):
        for sample in generate(task, length, count, n, sources, seed + k):
            rows.append({"prompt": sample.prompt, "target": " " + " ".join(sample.outputs), "task": task,
                         "length": length, "index": sample.index})
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """The rows as JSON lines, written through a temporary name and a rename."""
    from tapecli.files import write_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
    return path
