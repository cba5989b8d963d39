"""The entry point: `generate(task, max_length, count, num_samples, sources, seed)` -> RULER samples.

One call is one run of the official script for one task at one length (`prepare.py` runs each with seed 42): a
fresh random stream, the haystack sized with `count` (the model's tokenizer: text -> number of tokens, no special
tokens), then `num_samples` samples in order. Sample i depends on samples 0..i-1 (one stream), so a prefix of a
longer run is the shorter run.

`Sources` carries what some tasks need: the essay haystack's words and a sentence splitter (NLTK's English Punkt
model, as RULER uses, is the caller's choice), and the QA sets. `resolve_tasks("all" | "a,b,...")` expands and checks
task names (lm-eval's names are accepted too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tapecli.data.ruler.common_words import CommonWords
from tapecli.data.ruler.constants import ALIASES, SEED, TASKS
from tapecli.data.ruler.freq_words import FreqWords
from tapecli.data.ruler.niah import Niah
from tapecli.data.ruler.qa import QA, QaSet
from tapecli.data.ruler.sizing import Counter, RulerSample
from tapecli.data.ruler.variable_tracking import VariableTracking
from tapecli.errors import TapeError


@dataclass
class Sources:
    essay_words: Sequence[str] | None = None
    split_sentences: Callable[[str], list[str]] | None = None
    qa: dict[str, QaSet] = field(default_factory=dict)


def resolve_tasks(spec: str) -> list[str]:
    """`all` -> the 13 tasks in the official order; otherwise the comma-separated names, checked."""
    if spec.strip() == "all":
        return list(TASKS)
    from tapecli import commas

    names = [ALIASES.get(n, n) for n in commas.split(spec, "--tasks")]
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise TapeError(f"--tasks: unknown task {', '.join(unknown) or repr(spec)}; known: all, {', '.join(TASKS)}")
    return list(dict.fromkeys(names))


def generate(task: str, max_length: int, count: Counter, num_samples: int, sources: Sources | None = None,
             seed: int = SEED) -> list[RulerSample]:
    """`num_samples` samples of `task` at `max_length` tokens; see the module docstring."""
    sources = sources or Sources()
    family, args = TASKS[task]
    if family == "niah":
        generator = Niah(task, args, count, seed, sources.essay_words, sources.split_sentences)
    elif family == "variable_tracking":
        generator = VariableTracking(task, args, count, seed)
    elif family == "common_words_extraction":
        generator = CommonWords(task, args, count, seed)
    elif family == "freq_words_extraction":
        generator = FreqWords(task, args, count, seed)
    else:
        generator = QA(task, args, count, seed, sources.qa)
    return generator.samples(max_length, num_samples)
