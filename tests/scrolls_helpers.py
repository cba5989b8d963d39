"""Tiny SCROLLS files in the official `tau/scrolls` layout: `{task}.zip` holding `{task}/{split}.jsonl`."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path


def qa_rows(split: str, n: int = 6) -> list[dict]:
    """n/2 ids with two rows (two reference answers) each; test rows have no output, as in the real files."""
    rows = []
    for i in range(n):
        q = i // 2
        rows.append({"id": f"{split}-{q}", "pid": f"{split}-{q}_{i % 2}",
                     "input": f"What is {q} plus one?\n\nThe document says that {q} plus one is {q + 1}. "
                              + "Some more words. " * q,  # prompts of different lengths
                     "output": None if split == "test" else (f"{q + 1}" if i % 2 == 0 else f"the number {q + 1}")})
    return rows


def write_scrolls_zip(root: Path, task: str = "qasper", rows: dict[str, list[dict]] | None = None) -> Path:
    """Write root/{task}.zip with train/validation/test members; returns the zip's path."""
    root.mkdir(parents=True, exist_ok=True)
    rows = rows or {split: qa_rows(split, n) for split, n in (("train", 12), ("validation", 6), ("test", 4))}
    path = root / f"{task}.zip"
    with zipfile.ZipFile(path, "w") as z:
        for split, split_rows in rows.items():
            z.writestr(f"{task}/{split}.jsonl", "".join(json.dumps(r) + "\n" for r in split_rows))
    return path
