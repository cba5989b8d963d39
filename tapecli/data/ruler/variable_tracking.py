"""Variable tracking (`vt`): RULER's `variable_tracking.py` (NVIDIA/RULER at main), noise haystack.

A chain "VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE ", ... (num_hops + 1 five-letter names, a 5-digit value) is
spread over the noise sentence groups (one per line, chain lines in order at sorted random positions); the answer
is every name of the chain. Every prompt starts with a one-shot example, made as the official `main()` makes it: one
sample of at most 500 tokens with three-letter names and the value 12345, whose names and value are redrawn for each
sample; its tokens count against the budget. Haystack sizes come from the binary search of `sizing` (probing from 5
lines for the example; from 10 lines, 5 below 4096 tokens, for the samples).

The random stream is the official one: Python's `random` (names, positions) and NumPy's legacy RNG (values), both
seeded with `seed`.
"""

from __future__ import annotations

import random
import string

import numpy as np

from tapecli.data.ruler.constants import FAMILIES, NOISE
from tapecli.data.ruler.sizing import Counter, RulerSample, fit_sample, largest_fitting, split_answer_prefix
from tapecli.errors import TapeError

FAMILY = FAMILIES["variable_tracking"]
ICL_BUDGET = 500


class VariableTracking:
    def __init__(self, task: str, args: dict, count: Counter, seed: int) -> None:
        if args["type_haystack"] != "noise":
            raise TapeError(f"{task}: only the noise haystack of the official task table is implemented")
        self.task, self.count = task, count
        self.num_chains, self.num_hops = args["num_chains"], args["num_hops"]
        self.rng, self.np_rng = random.Random(seed), np.random.RandomState(seed)

    def _name(self, k: int) -> str:
        return "".join(self.rng.choices(string.ascii_uppercase, k=k)).upper()

    def chains(self, is_icl: bool) -> tuple[list[list[str]], list[list[str]]]:
        """`generate_chains`: the names of each chain and its assignment lines."""
        k = 3 if is_icl else 5
        hops = min(10, self.num_hops) if is_icl else self.num_hops
        names = [self._name(k) for _ in range((hops + 1) * self.num_chains)]
        while len(set(names)) < self.num_chains * (hops + 1):
            names.append(self._name(k))
        all_vars, all_chains = [], []
        for i in range(0, len(names), hops + 1):
            these = names[i : i + hops + 1]
            all_vars.append(these)
            value = "12345" if is_icl else str(self.np_rng.randint(10000, 99999))
            chain = [f"VAR {these[0]} = {value}"]
            for j in range(hops):
                chain.append(f"VAR {these[j + 1]} = VAR {these[j]} ")
            all_chains.append(chain)
        return all_vars, all_chains

    def make(self, num_noises: int, is_icl: bool) -> tuple[str, list[str]]:
        """`generate_input_output`: the whole prompt (template + answer prefix) and the chain's names."""
        names, chains = self.chains(is_icl)
        value = chains[0][0].split("=")[-1].strip()
        lines = [NOISE] * num_noises
        for chain in chains:
            positions = sorted(self.rng.sample(range(len(lines)), len(chain)))
            for position, j in zip(positions, range(len(chain)), strict=True):
                lines.insert(position + j, chain[j])
        context = "\n".join(lines).replace(". \n", ".\n")
        return FAMILY.prompt_template.format(context=context, query=value, num_v=self.num_hops + 1), names[0]

    def randomize_example(self, example: str) -> str:
        """`randomize_icl`: new letters for the example's names, a new value for 12345."""
        for item in example.strip().split()[-self.num_hops - 1 :]:
            example = example.replace(item, "".join(self.rng.choices(string.ascii_uppercase, k=len(item))).upper())
        return example.replace("12345", str(self.np_rng.randint(10000, 99999)))

    def _run(self, num_samples: int, budget: int, target_length: int,
             example: tuple[str, list[str]] | None) -> list[tuple[str, list[str], int, int]]:
        """`sys_vartrack_w_noise_random`: (prompt, names, length, noise lines) for each sample."""
        to_generate = FAMILY.tokens_to_generate if example is not None else 0
        if example is not None:
            incremental = 5 if target_length < 4096 else 10
            example_text = example[0] + " " + " ".join(example[1]) + "\n"
            example_tokens = self.count(example_text)
        else:
            incremental, example_tokens = 5, 0
        is_icl = example is None
        per_unit = self.count(self.make(incremental, is_icl)[0]) / incremental
        upper = max(int((budget / per_unit) * 3), incremental * 2)
        num_noises = largest_fitting(lambda n: self.count(self.make(n, is_icl)[0]) + example_tokens + to_generate,
                                     budget, incremental, upper)

        def attempt(size: int) -> tuple[str, list[str], int, int] | None:
            text, names = self.make(size, is_icl)
            if example is not None:
                cut = text.index(FAMILY.template[:20])
                text = text[:cut] + self.randomize_example(example_text) + "\n" + text[cut:]
            length = self.count(text) + to_generate
            return (text, names, length, size) if length <= budget else None

        what = f"{self.task} at length {target_length}" + (" (its one-shot example)" if example is None else "")
        return [fit_sample(attempt, num_noises, incremental, what) for _ in range(num_samples)]

    def samples(self, max_length: int, num_samples: int) -> list[RulerSample]:
        try:
            example_text, example_names, _, _ = self._run(1, ICL_BUDGET, max_length, None)[0]
        except TapeError:
            raise TapeError(f"{self.task}: RULER's one-shot example must fit in {ICL_BUDGET} tokens, and with this "
                            "tokenizer even its smallest haystack does not (a byte-level tokenizer cannot run vt)") \
                from None
        out = []
        for index, (text, names, length, size) in enumerate(
                self._run(num_samples, max_length, max_length, (example_text, example_names))):
            prompt, prefix = split_answer_prefix(text, FAMILY.answer_prefix)
            out.append(RulerSample(self.task, max_length, index, prompt, prefix, names, length, {"haystack": size}))
        return out
