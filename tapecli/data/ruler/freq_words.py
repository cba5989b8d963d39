"""Frequent words extraction (`fwe`): RULER's `freq_words_extraction.py` (NVIDIA/RULER at main).

A "coded text" of random 6-letter words whose counts follow a Zipf law (`alpha` = 2): the word of rank k appears
int(n k^-alpha / zeta(alpha)) times, the top-ranked word replaced by "..." (noise); the answer is the words ranked
2-4. The vocabulary (budget // 50 words) is redrawn for every sample. The number of words n is found as the official
script finds it: start at budget // 6 and grow by budget // 32 while the prompt is shorter than the budget (budget =
length - tokens to generate), step back once, then for each sample shrink by the same step while it is too long.

The random stream is the official one: Python's `random` seeded with `seed` (NumPy is seeded but unused), the
vocabulary and the text shuffled by fresh `random.Random(seed)`s; zeta is scipy's, as in the script.
"""

from __future__ import annotations

import random
import string

import numpy as np

from tapecli.data.ruler.constants import FAMILIES
from tapecli.data.ruler.sizing import Counter, RulerSample, split_answer_prefix
from tapecli.errors import TapeError

FAMILY = FAMILIES["freq_words_extraction"]
CODED_WORDLEN = 6


class FreqWords:
    def __init__(self, task: str, args: dict, count: Counter, seed: int) -> None:
        self.task, self.count, self.seed, self.alpha = task, count, seed, args["alpha"]
        self.rng = random.Random(seed)

    def make(self, max_len: int, vocab_size: int, incremental: int, num_words: int = -1) -> tuple[str, list[str], int]:
        """`generate_input_output`: (prompt, the three answers, the number of words used)."""
        from scipy.special import zeta

        vocab = ["".join(self.rng.choices(string.ascii_lowercase, k=CODED_WORDLEN)) for _ in range(vocab_size)]
        while len(set(vocab)) < vocab_size:
            vocab.append("".join(self.rng.choices(string.ascii_lowercase, k=CODED_WORDLEN)))
        vocab = sorted(set(vocab))
        random.Random(self.seed).shuffle(vocab)
        vocab[0] = "..."  # the top-ranked word is noise

        def text_of(n: int) -> tuple[str, list[str]]:
            ranks = np.arange(1, len(vocab) + 1)
            counts = n * (ranks**-self.alpha) / zeta(self.alpha)
            words = [word for word, c in zip(vocab, counts.astype(int), strict=True) for _ in range(c)]
            random.Random(self.seed).shuffle(words)
            return FAMILY.prompt_template.format(context=" ".join(words), query=""), vocab[1:4]

        if num_words > 0:
            text, _ = text_of(num_words)
            while self.count(text) > max_len:
                num_words -= incremental
                if num_words <= 0:  # the official loop never ends here
                    raise TapeError(f"{self.task}: even an empty coded text does not fit in {max_len} tokens; "
                                    "the length is too short for this task")
                text, _ = text_of(num_words)
        else:
            num_words = max_len // CODED_WORDLEN
            text, _ = text_of(num_words)
            while self.count(text) < max_len:
                num_words += incremental
                text, _ = text_of(num_words)
            num_words -= incremental
        text, answer = text_of(num_words)
        return text, answer, num_words

    def samples(self, max_length: int, num_samples: int) -> list[RulerSample]:
        to_generate = FAMILY.tokens_to_generate
        budget = max_length - to_generate
        vocab_size, incremental = budget // 50, budget // 32
        if incremental < 1 or vocab_size < 4:
            raise TapeError(f"{self.task} at length {max_length}: too short for this task (choose a longer length "
                            "or leave the task out)")
        num_words = self.make(budget, vocab_size, incremental)[2]
        out = []
        for index in range(num_samples):
            text, answer, used = self.make(budget, vocab_size, incremental, num_words=num_words)
            length = self.count(text) + to_generate
            prompt, prefix = split_answer_prefix(text, FAMILY.answer_prefix)
            out.append(RulerSample(self.task, max_length, index, prompt, prefix, answer, length, {"words": used}))
        return out
