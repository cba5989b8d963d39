"""HELMET's categories whose rows tape prepares whole from Hugging Face datasets, for the `Helmet` protocol: many-shot
ICL (`tapecli.data.helmet_icl`) and long-document QA (`tapecli.data.helmet_longqa`), and their scores
(`tapecli.eval.helmet_answer`).

`Prepared.rows(task, length, samples)` gives (rows, description): each row a filled-in sample ({"context",
"question", "answer", ...}) in the order HELMET evaluates them; a dataset is read once per task, the truncation
tokenizer once (`measurer()`, which summarisation shares). `NOTE` is what the output says about NarrativeQA's metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("icl", "longqa")
ALSO = {"narrativeqa": ("substring_exact_match",)}  # reported beside the task's metric
NOTE = ("narrativeqa: ROUGE-L F1 (SubEM beside it) stands in for HELMET's GPT-4o judge, which is not run (no "
        "model-based judge offline); the longqa category averages it with infbench_qa_eng's ROUGE-L F1 and "
        "infbench_choice_eng's accuracy")


@dataclass
class Prepared:
    """Rows of the ICL and long-QA tasks, from `data` (None: the hub) with `shots` long-QA demonstrations."""

    data: str | None
    shots: int
    truncation_tokenizer: str
    shuffle: Any  # datasets' shuffle(seed) of `size` rows, as indices
    loaded: dict[str, Any] = field(default_factory=dict)
    measure: Any = None

    def rows(self, task: Any, length: int, samples: int) -> tuple[list[dict[str, Any]], str]:
        from tapecli.data import helmet_icl, helmet_longqa

        if task.category == "icl":
            helmet_icl.shots(task.name, length)  # a length HELMET has no count for: one line before any read
            if task.name not in self.loaded:
                self.loaded[task.name] = helmet_icl.splits(self.data, task.name)
            train, test, described = self.loaded[task.name]
            return helmet_icl.rows(train, test, task.name, length, samples, self.shuffle), described
        helmet_longqa.cut([], task.name, length, task.generation_max_length, self.measurer())  # a length too short
        if task.name not in self.loaded:
            self.loaded[task.name] = helmet_longqa.rows(self.data, task.name, samples, self.shots, self.shuffle,
                                                        self.measure)
        rows, described = self.loaded[task.name]
        return helmet_longqa.cut(rows, task.name, length, task.generation_max_length, self.measure), described

    def measurer(self) -> Any:
        """The document cut of long QA and summarisation (`tapecli.data.helmet_cut.Measure`), its tokenizer read
        once."""
        if self.measure is None:
            from tapecli.data.helmet_cut import Measure, load_tokenizer

            self.measure = Measure(load_tokenizer(self.truncation_tokenizer))
        return self.measure
