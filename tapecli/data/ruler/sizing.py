"""What every RULER family shares: the sample record, the haystack-size binary search, the per-sample fitting loop
and the answer-prefix split, each as the official scripts do it (the draws they make are part of the random
stream, so the order of calls matters as much as the arithmetic).

- `largest_fitting(measure, budget, lower, upper)`: the official binary search (niah.py, variable_tracking.py,
  common_words_extraction.py, qa.py at main): probe `mid = (lower + upper) // 2`, keep the largest size whose
  `measure(size) <= budget`; `lower` (the scripts' `incremental`) when no probed size fits, as the scripts fall back.
- `fit_sample(attempt, size, incremental, ...)`: the official per-sample loop: draw a sample at `size`; when it is too
  long or the draw fails (a `ValueError`/`IndexError` from the generator, e.g. more needles than haystack slots),
  shrink `size` by `incremental` while it is larger than `incremental`, and draw again. At the floor the official
  loop redraws forever; here it redraws at most `FLOOR_TRIES` times, then raises a TapeError naming the task and
  length (the length is too short for the task).
- `split_answer_prefix(text, answer_prefix)`: cut at the last occurrence of the answer prefix's first 10 characters.
- `draw_samples(...)`: the common tail of the families' `generate_samples`: per sample, `fit_sample` from the searched
  size with "prompt tokens + tokens to generate <= length", then the answer-prefix split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tapecli.errors import TapeError

FLOOR_TRIES = 1000
T = TypeVar("T")


@dataclass
class RulerSample:
    """One sample, as RULER's validation.jsonl holds it (`input`, `outputs`, `length`, `answer_prefix`)."""

    task: str
    max_length: int  # the target sequence length (RULER's --max_seq_length)
    index: int
    input: str  # the prompt up to the answer prefix
    answer_prefix: str  # the model reads input + answer_prefix and continues it
    outputs: list[str]  # the references
    length: int  # prompt tokens + tokens to generate, as RULER counts them (no special tokens)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the haystack size used

    @property
    def prompt(self) -> str:
        return self.input + self.answer_prefix

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "max_length": self.max_length, "index": self.index, "input": self.input,
                "answer_prefix": self.answer_prefix, "outputs": self.outputs, "length": self.length, **self.extra}


Counter = Callable[[str], int]  # text -> number of tokens (the model's tokenizer, no special tokens)


def largest_fitting(measure: Callable[[int], int], budget: int, lower: int, upper: int) -> int:
    """The largest size in [lower, upper] with measure(size) <= budget, found by the official binary search."""
    best = fallback = lower
    found = False
    while lower <= upper:
        mid = (lower + upper) // 2
        if measure(mid) <= budget:
            best, lower, found = mid, mid + 1, True
        else:
            upper = mid - 1
    return best if found else fallback


def fit_sample(attempt: Callable[[int], T | None], size: int, incremental: int, what: str) -> T:
    """`attempt(size)` -> the sample, or None when it is longer than the budget; see the module docstring."""
    floor_tries = 0
    while True:
        try:
            result = attempt(size)
        except (ValueError, IndexError):
            result = None
        if result is not None:
            return result
        if size > incremental:
            size -= incremental
            continue
        floor_tries += 1
        if floor_tries >= FLOOR_TRIES:
            raise TapeError(f"{what}: even the smallest haystack ({size}) does not fit; the length is too short for "
                            "this task (choose a longer length or leave the task out)")


def split_answer_prefix(text: str, answer_prefix: str) -> tuple[str, str]:
    """(input, answer prefix): `text` cut where the answer prefix's first 10 characters last occur."""
    at = text.rfind(answer_prefix[:10])
    return text[:at], text[at:]


def draw_samples(task: str, max_length: int, num_samples: int, family: Any, count: Counter,
                 make: Callable[[int, int], tuple[str, list[str]]], size: int, incremental: int,
                 size_name: str) -> list[RulerSample]:
    """`make(sample index, size)` -> (whole prompt, references); see the module docstring."""
    budget, to_generate = max_length, family.tokens_to_generate
    out = []
    for index in range(num_samples):
        def attempt(n: int, index: int = index) -> tuple[str, list[str], int, int] | None:
            text, references = make(index, n)
            length = count(text) + to_generate
            return (text, references, length, n) if length <= budget else None

        text, references, length, used = fit_sample(attempt, size, incremental, f"{task} at length {max_length}")
        prompt, prefix = split_answer_prefix(text, family.answer_prefix)
        out.append(RulerSample(task, max_length, index, prompt, prefix, references, length, {size_name: used}))
    return out
