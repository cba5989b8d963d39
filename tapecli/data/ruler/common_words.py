"""Common words extraction (`cwe`): RULER's `common_words_extraction.py` (NVIDIA/RULER at main).

A numbered list "1. word 2. word ..." where 10 words appear `freq_cw` (30) times and every other word `freq_ucw` (3)
times, shuffled; the answer is the 10 common words. One solved example (40 words, 10 and 3 repeats) comes first;
below 4096 tokens the example has 20 words (3 and 1 repeats) and the list 6 and 1 repeats. The words are wonderwords'
nouns, adjectives and verbs, sorted, shuffled once with `Random(seed)`; the number of words comes from the binary
search of `sizing` (estimated from a 4096-word prompt, probing from 10).

Beyond the 8,169 wonderwords words (lengths around 128K tokens) the official script draws from its
`english_words.json` (randleword), which tape does not ship: such a length is refused with one line.

The random stream is the official one: Python's `random` seeded with `seed` (this script does not seed NumPy), each
list shuffled by a fresh `random.Random(seed)`.
"""

from __future__ import annotations

import random

from tapecli.data.ruler.constants import FAMILIES
from tapecli.data.ruler.sizing import Counter, RulerSample, draw_samples, largest_fitting
from tapecli.data.ruler.words import cwe_words
from tapecli.errors import TapeError

FAMILY = FAMILIES["common_words_extraction"]
NUM_FEWSHOT = 1


class CommonWords:
    def __init__(self, task: str, args: dict, count: Counter, seed: int) -> None:
        self.task, self.count, self.seed = task, count, seed
        self.freq_cw, self.freq_ucw, self.num_cw = args["freq_cw"], args["freq_ucw"], args["num_cw"]
        self.words = list(cwe_words())
        random.Random(seed).shuffle(self.words)
        self.rng = random.Random(seed)
        self.max_length = 0  # the target length of the current run (the script's args.max_seq_length)

    def example(self, num_words: int, common_repeats: int, uncommon_repeats: int) -> tuple[str, list[str]]:
        """`get_example`: the numbered list and its common words."""
        if num_words > len(self.words):
            raise TapeError(f"{self.task} at length {self.max_length}: needs more than the {len(self.words)} "
                            "wonderwords words; RULER takes them from its english_words.json, which tape does not "
                            "ship (use a shorter length)")
        chosen = self.rng.sample(self.words, num_words)
        common, uncommon = chosen[: self.num_cw], chosen[self.num_cw :]
        listed = common * int(common_repeats) + uncommon * int(uncommon_repeats)
        random.Random(self.seed).shuffle(listed)
        return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed)), common

    def make(self, num_words: int) -> tuple[str, list[str]]:
        """`generate_input_output`: the solved example(s), a newline, the prompt (template + answer prefix)."""
        if self.max_length < 4096:
            shots = [self.example(20, 3, 1) for _ in range(NUM_FEWSHOT)]
            context, answer = self.example(num_words, 6, 1)
        else:
            shots = [self.example(40, 10, 3) for _ in range(NUM_FEWSHOT)]
            context, answer = self.example(num_words, self.freq_cw, self.freq_ucw)
        template = FAMILY.prompt_template
        solved = [template.format(num_cw=self.num_cw, context=shot, query="") + " "
                  + " ".join(f"{i + 1}. {word}" for i, word in enumerate(words)) for shot, words in shots]
        return "\n".join(solved) + "\n" + template.format(num_cw=self.num_cw, context=context, query=""), answer

    def samples(self, max_length: int, num_samples: int) -> list[RulerSample]:
        self.max_length = budget = max_length
        to_generate, incremental = FAMILY.tokens_to_generate, 10
        per_word = self.count(self.make(4096)[0]) / 4096
        upper = max(int(budget // per_word) * 2, incremental * 2)
        num_words = largest_fitting(lambda n: self.count(self.make(n)[0]) + to_generate, budget, incremental, upper)
        return draw_samples(self.task, max_length, num_samples, FAMILY, self.count, lambda _, n: self.make(n),
                            num_words, incremental, "words")
