"""LongBench v2 (THUDM/LongBench main: pred.py, result.py): multiple-choice questions on long documents; accuracy
overall, by difficulty (easy, hard) and by length (short, medium, long), with or without chain-of-thought.

Data: LongBench v2's data.json (`tapecli.data.longbench_v2`): `--data` a local file or folder, or the hub dataset
`THUDM/LongBench-v2` for users with a network; `--limit N` keeps its first N questions. Per model and question, as
pred.py: the official prompt (`0shot.txt`, or with `--cot` `0shot_cot.txt`) is encoded with the tokenizer's default
special tokens and, when longer than the budget (`--max-length`, default the model's max_seq_len less the tokens to
generate), cut in the middle: its first max_len // 2 and last -(-max_len // 2) tokens are kept. The model decodes
greedily up to 128 tokens (with `--cot`, up to 1,024 for the chain of thought, which then fills `0shot_cot_ans.txt`,
cut the same way, for an answer of up to 128), stopping at EOS; the stripped answer goes through pred.py's
`extract_answer` ("The correct answer is (X)" or "The correct answer is X", asterisks removed; None otherwise), and a
question is right when the letter equals the answer.

results.json, per model: `accuracy` as result.py prints it (overall, easy, hard, short, medium, long: the percentage
right, rounded to one decimal; result.py counts every difficulty but easy as hard and every length but short and
medium as long), `compensated` (result.py's variant: a question without an extracted letter counts 0.25),
`unanswered`, `truncated` (questions whose prompt was cut) and `max_length`. `LongBenchV2` is the protocol (a unit is
one question; the models share one folder, eval-longbench-v2, or eval-longbench-v2-cot with `--cot`); the runner
writes settings.json, samples.jsonl, results.json and longbench-v2.png (the six accuracies as bars, one per model).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.protocol import Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "longbench-v2.png"
COLUMNS = ("overall", "easy", "hard", "short", "medium", "long")
PROTOCOL = ("LongBench v2 (THUDM/LongBench main, pred.py + result.py): the official 0-shot prompt (or with cot the "
            "0-shot chain-of-thought prompt, then 0shot_cot_ans.txt with the chain filled in); default special tokens "
            "+ prompt, cut in the middle to max_length tokens (first max_len // 2, last -(-max_len // 2)); greedy "
            "decoding up to 128 tokens (chain of thought: 1,024), stopping at EOS; stripped; pred.py's "
            "extract_answer; accuracy as result.py (rounded to 0.1; compensated: 0.25 per unanswered question)")


def extract_answer(response: str) -> str | None:
    """pred.py's `extract_answer`."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    if match:
        return match.group(1)
    return None


def middle_cut(ids: list[int], max_len: int) -> list[int]:
    """pred.py's truncation: the first max_len // 2 and the last -(-max_len // 2) tokens of a longer prompt."""
    return ids[: max_len // 2] + ids[-max_len // 2 :] if len(ids) > max_len else ids


@dataclass
class LongBenchV2(Evaluation):
    """LongBench v2 on one model or several, with `tape eval longbench-v2`'s options (see the module docstring)."""

    name = "longbench-v2"
    unit = "questions"
    plot_file = PLOT_FILE
    together = True
    data: str | None = None
    cot: bool = False
    max_length: int | None = None  # None: each model's max_seq_len less the tokens to generate
    limit: int | None = None
    rows: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    described: Any = field(default=None, init=False, repr=False)
    budget: int = field(default=0, init=False, repr=False)  # this model's max_length

    def __post_init__(self) -> None:
        if self.cot:
            self.name = "longbench-v2-cot"  # its own default folder: a run evaluated both ways keeps both

    def check(self, models: list[str]) -> None:
        from tapecli.data import longbench_v2

        if self.limit is not None and self.limit < 1:
            raise TapeError(f"--limit must be a positive integer, got {self.limit}")
        if self.max_length is not None and self.max_length < 2:
            raise TapeError(f"--max-length must be at least 2 tokens, got {self.max_length}")
        rows, self.described = longbench_v2.read(self.data)
        self.rows = rows[: self.limit]

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "longbench-v2", "models": [source_of(m)[1] for m in models], "data": self.described,
                "cot": self.cot, "max_length": self.max_length, "limit": self.limit, "dtype": opening.dtype_name(),
                "pe_args": opening.pe_args}

    def prepare(self, opened: OpenedModel) -> None:
        from tapecli.data.longbench_v2 import COT_TOKENS, ZERO_SHOT_TOKENS

        generated = COT_TOKENS if self.cot else ZERO_SHOT_TOKENS
        self.budget = self.max_length or opened.model.config.max_seq_len - generated
        if self.budget < 2:
            raise TapeError(f"{opened.name}: max_seq_len {opened.model.config.max_seq_len} leaves no room for a "
                            f"prompt beside {generated} generated tokens; pass --max-length")

    def units(self, opened: OpenedModel) -> list[int]:
        return list(range(len(self.rows)))

    def key(self, row: dict[str, Any]) -> int:
        return row["index"]

    def evaluate(self, opened: OpenedModel, units: list[int]) -> list[dict[str, Any]]:
        from tapecli.data import longbench_v2 as lb

        rows = [self.rows[i] for i in units]
        tokenizer = opened.tokenizer
        first = [tokenizer.encode(lb.fill(lb.COT if self.cot else lb.ZERO_SHOT, r), add_special_tokens=True)
                 for r in rows]
        outputs = self._generate(opened, first, lb.COT_TOKENS if self.cot else lb.ZERO_SHOT_TOKENS)
        chains = [None] * len(rows)
        if self.cot:
            chains = [o.strip() for o in outputs]
            second = [tokenizer.encode(lb.fill(lb.COT_ANSWER, r, c), add_special_tokens=True)
                      for r, c in zip(rows, chains, strict=True)]
            outputs = self._generate(opened, second, lb.ZERO_SHOT_TOKENS)
        out = []
        for index, row, ids, chain, output in zip(units, rows, first, chains, outputs, strict=True):
            response = output.strip()
            pred = extract_answer(response)
            out.append({"index": index, "_id": row["_id"], "difficulty": row["difficulty"], "length": row["length"],
                        "prompt_tokens": len(ids), "truncated": len(ids) > self.budget,
                        **({"response_cot": chain} if self.cot else {}), "response": response, "pred": pred,
                        "answer": row["answer"], "judge": pred == row["answer"]})
        return out

    def _generate(self, opened: OpenedModel, prompts: list[list[int]], max_new_tokens: int) -> list[str]:
        """Greedy continuations of the prompts, each cut in the middle to the budget, cut at EOS and decoded."""
        from tapecli.eval.common import generate_batch

        eos = getattr(opened.tokenizer, "eos_id", None)
        stop = [eos] if eos is not None and eos >= 0 else None
        outputs = generate_batch(opened.model, [middle_cut(p, self.budget) for p in prompts], max_new_tokens,
                                 batch_size=len(prompts), stop_tokens=stop, pad_id=eos if stop else None)
        return [opened.tokenizer.decode(o[: o.index(eos)] if stop and eos in o else o) for o in outputs]

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {**opened.record(), "max_length": self.budget, "questions": len(rows),
                "accuracy": accuracy(rows), "compensated": accuracy(rows, compensated=True),
                "unanswered": sum(r["pred"] is None for r in rows), "truncated": sum(r["truncated"] for r in rows)}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "longbench-v2", "protocol": PROTOCOL, "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        plot(results, path)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        lines = ["| model | " + " | ".join(c.capitalize() for c in COLUMNS) + " | unanswered |",
                 "| --- " * (len(COLUMNS) + 2) + "|"]
        for folder in results.values():
            for m in folder["models"]:
                cells = ["-" if m["accuracy"][c] is None else f"{m['accuracy'][c]}" for c in COLUMNS]
                lines.append(f"| {m['name']} | " + " | ".join(cells) + f" | {m['unanswered']} |")
        return "\n".join(lines)


def accuracy(rows: list[dict[str, Any]], compensated: bool = False) -> dict[str, float | None]:
    """result.py's six numbers over rows with judge, pred, difficulty and length (None for an empty group)."""
    groups: dict[str, list[float]] = {c: [] for c in COLUMNS}
    for row in rows:
        acc = 0.25 if compensated and row["pred"] is None else int(row["judge"])
        groups["overall"].append(acc)
        groups["easy" if row["difficulty"] == "easy" else "hard"].append(acc)
        groups[row["length"] if row["length"] in ("short", "medium") else "long"].append(acc)
    return {c: round(100 * sum(v) / len(v), 1) if v else None for c, v in groups.items()}


def plot(results: dict[str, Any], path: Path) -> None:
    from tapecli.eval.plots import BarSeries, save_bars

    series = [BarSeries(m["name"], [None if m["accuracy"][c] is None else m["accuracy"][c] / 100 for c in COLUMNS])
              for m in results["models"]]
    cot = " with chain of thought" if results["settings"]["cot"] else ""
    save_bars([c.capitalize() for c in COLUMNS], series, f"LongBench v2{cot}: accuracy (chance: 0.25)", path)
