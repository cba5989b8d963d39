"""The official RULER strings and task table, verbatim (NVIDIA/RULER at main).

- `FAMILIES`: per task family, `scripts/data/synthetic/constants.py`: tokens to generate, template, answer prefix.
  The prompt the official "base" template builds is `template + answer_prefix` (`scripts/data/prepare.py`); after
  generation the answer prefix is cut off again at the last occurrence of its first 10 characters, and the model
  reads `input + answer_prefix`.
- `TASKS`: the 13 tasks of `scripts/synthetic.yaml` (family and arguments).
- `METRICS`: the metric of each family, `scripts/eval/synthetic/constants.py`: "all" (share of the references found
  in the prediction) or "part" (1 if any reference is found).
- `NOISE`: the noise haystack sentence group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
SEED = 42  # prepare.py's --random_seed default (chunk 0)


@dataclass(frozen=True)
class Family:
    tokens_to_generate: int
    template: str
    answer_prefix: str

    @property
    def prompt_template(self) -> str:
        """What prepare.py hands the generator with the "base" model template: template + answer prefix."""
        return self.template + self.answer_prefix


FAMILIES: dict[str, Family] = {
    "niah": Family(
        128,
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
        "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} "
        "for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are"),
    "variable_tracking": Family(
        30,
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: "),
    "common_words_extraction": Family(
        120,
        "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
        "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:"),
    "freq_words_extraction": Family(
        50,
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:"),
    "qa": Family(
        32,
        "Answer the question based on the given documents. Only give me the answer and do not output any other "
        "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
        "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        " Answer:"),
}

METRICS = {"niah": "all", "variable_tracking": "all", "common_words_extraction": "all",
           "freq_words_extraction": "all", "qa": "part"}


def _niah(haystack: str, key: str, value: str, k: int = 1, v: int = 1, q: int = 1) -> tuple[str, dict[str, Any]]:
    return "niah", {"type_haystack": haystack, "type_needle_k": key, "type_needle_v": value, "num_needle_k": k,
                    "num_needle_v": v, "num_needle_q": q}


# scripts/synthetic.yaml: task name -> (family, arguments), in the official order.
TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "niah_single_1": _niah("noise", "words", "numbers"),
    "niah_single_2": _niah("essay", "words", "numbers"),
    "niah_single_3": _niah("essay", "words", "uuids"),
    "niah_multikey_1": _niah("essay", "words", "numbers", k=4),
    "niah_multikey_2": _niah("needle", "words", "numbers"),
    "niah_multikey_3": _niah("needle", "uuids", "uuids"),
    "niah_multivalue": _niah("essay", "words", "numbers", v=4),
    "niah_multiquery": _niah("essay", "words", "numbers", q=4),
    "vt": ("variable_tracking", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    "cwe": ("common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    "fwe": ("freq_words_extraction", {"alpha": 2.0}),
    "qa_1": ("qa", {"dataset": "squad"}),
    "qa_2": ("qa", {"dataset": "hotpotqa"}),
}

# lm-eval's names for the same tasks (lm_eval/tasks/ruler), accepted by --tasks too.
ALIASES = {"ruler_vt": "vt", "ruler_cwe": "cwe", "ruler_fwe": "fwe", "ruler_qa_squad": "qa_1",
           "ruler_qa_hotpot": "qa_2"}


def needs(task: str) -> str | None:
    """The local source a task needs: "essay" (--haystack), "squad" or "hotpotqa" (--qa-data), or None."""
    family, args = TASKS[task]
    if family == "qa":
        return args["dataset"]
    return "essay" if args.get("type_haystack") == "essay" else None
