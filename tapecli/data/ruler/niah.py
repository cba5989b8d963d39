"""Needle in a haystack: RULER's `niah.py` (NVIDIA/RULER at main), eight of the 13 tasks.

A needle is "One of the special magic {type_needle_v} for {key} is: {value}."; keys and values are 7-digit numbers,
adjective-noun words or UUIDs. The haystack is the noise sentence group repeated (one per line), other needles
(one per line), or the words of an essay, split into sentences, with the needles put between sentences at depths
drawn from 40 evenly spaced percentages. With one query and one value the template is turned singular ("A special
magic number ... is"). The haystack size is found by the binary search of `sizing`, probing from `incremental`
(500 essay words, 25 lines; 5 lines below 4096 tokens).

The random stream is the official one: Python's `random` seeded with `seed`, the needles shuffled by a fresh
`random.Random(seed)` each time.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Sequence

import numpy as np

from tapecli.data.ruler.constants import FAMILIES, NOISE
from tapecli.data.ruler.sizing import Counter, RulerSample, draw_samples, largest_fitting
from tapecli.data.ruler.words import adjective_noun_words
from tapecli.errors import TapeError

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int)]
FAMILY = FAMILIES["niah"]


class Niah:
    """The generator of one NIAH task at one length (a fresh random stream, as one run of the official script)."""

    def __init__(self, task: str, args: dict, count: Counter, seed: int, essay_words: Sequence[str] | None = None,
                 split_sentences: Callable[[str], list[str]] | None = None) -> None:
        self.task, self.count, self.seed = task, count, seed
        self.haystack_type = args["type_haystack"]
        self.type_k, self.type_v = args["type_needle_k"], args["type_needle_v"]
        self.num_v, self.num_q = args["num_needle_v"], args["num_needle_q"]
        self.num_k = max(args["num_needle_k"], self.num_q)
        if self.haystack_type == "essay" and (essay_words is None or split_sentences is None):
            raise TapeError(f"{task} needs an essay haystack (--haystack)")
        self.essay, self.split_sentences = essay_words, split_sentences
        self.rng = random.Random(seed)  # the script's `random.seed(seed)`; it seeds NumPy too but draws nothing from it
        self.words = adjective_noun_words() if "words" in (self.type_k, self.type_v) else None

    def draw(self, kind: str) -> str:
        if kind == "numbers":
            return str(self.rng.randint(10**6, 10**7 - 1))
        if kind == "words":
            return self.rng.choice(self.words)
        if kind == "uuids":
            return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        raise TapeError(f"unknown needle type {kind!r}")

    def make(self, num_haystack: int) -> tuple[str, list[str]]:
        """`generate_input_output`: the whole prompt (template + answer prefix) and the answers."""
        keys, values, needles = [], [], []
        for _ in range(self.num_k):
            keys.append(self.draw(self.type_k))
            value = []
            for _ in range(self.num_v):
                value.append(self.draw(self.type_v))
                needles.append(NEEDLE.format(type_needle_v=self.type_v, key=keys[-1], value=value[-1]))
            values.append(value)
        random.Random(self.seed).shuffle(needles)
        context = self._essay_context(num_haystack, needles) if self.haystack_type == "essay" else \
            self._line_context(num_haystack, needles)
        indices = self.rng.sample(range(self.num_k), self.num_q)
        queries = [keys[i] for i in indices]
        answers = [a for i in indices for a in values[i]]
        query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
        template, type_v = FAMILY.prompt_template, self.type_v
        if self.num_q * self.num_v == 1:
            for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
                template = template.replace(old, new)
            type_v = type_v[:-1]
        return template.format(type_needle_v=type_v, context=context, query=query), answers

    def _essay_context(self, num_haystack: int, needles: list[str]) -> str:
        words = self.essay
        if num_haystack <= len(words):
            text = " ".join(words[:num_haystack])
        else:  # repeat the essay as often as needed
            repeats = (num_haystack + len(words) - 1) // len(words)
            text = " ".join((list(words) * repeats)[:num_haystack])
        sentences = self.split_sentences(text.strip())
        depths = self.rng.sample(DEPTHS, len(needles))
        positions = [0] + sorted(int(len(sentences) * (depth / 100)) for depth in depths) + [len(sentences)]
        parts = []
        for i in range(1, len(positions)):
            parts.append(" ".join(sentences[positions[i - 1] : positions[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        return " ".join(parts)

    def _line_context(self, num_haystack: int, needles: list[str]) -> str:
        if self.haystack_type == "noise":
            lines = [NOISE] * num_haystack
        else:  # "needle": distractor needles with keys and values of the task's types
            lines = [NEEDLE.format(type_needle_v=self.type_v, key=self.draw(self.type_k), value=self.draw(self.type_v))
                     for _ in range(num_haystack)]
        for index, needle in zip(sorted(self.rng.sample(range(num_haystack), len(needles)), reverse=True), needles,
                                 strict=False):
            lines.insert(index, needle)
        return "\n".join(lines)

    def samples(self, max_length: int, num_samples: int) -> list[RulerSample]:
        """`generate_samples`: size the haystack, then draw `num_samples` samples that fit."""
        budget, to_generate = max_length, FAMILY.tokens_to_generate
        incremental = 500 if self.haystack_type == "essay" else 25
        if self.haystack_type != "essay" and max_length < 4096:
            incremental = 5
        per_unit = self.count(self.make(incremental)[0]) / incremental
        upper = max(int((budget / per_unit) * 3), incremental * 2)
        num_haystack = largest_fitting(lambda n: self.count(self.make(n)[0]) + to_generate, budget, incremental,
                                       upper)
        return draw_samples(self.task, max_length, num_samples, FAMILY, self.count, lambda _, n: self.make(n),
                            num_haystack, incremental, "haystack")
