"""Michelangelo's Latent List (Vodrahalli et al. 2024, arXiv 2409.12640), generated offline: a Python list `a`
changed by a long program most of whose lines leave it alone; the question is what the program's last line prints,
a view of the final list.

The paper gives the task's idea (a list modified by a sequence of operations, relevant ones among many irrelevant
ones, the answer a view of the latent list, the number of relevant operations the complexity knob); its generator is
not public. tape's program, line by line:

    a = [v1, v2, v3, v4, v5]          five values in 0..99
    b = []                            a second list, only ever touched by distractor lines
    ... R relevant lines, in order, among F distractor lines ...
    print(VIEW)

- relevant lines change `a`: `a.append(v)`, `a.insert(i, v)`, `a.pop()`, `a.pop(i)`, `a.remove(v)` (a value in the
  list), `a.extend([v, w])`, `a[i] = v`, `a.reverse()`, `a.sort()`; drawn uniformly among those valid (pop and remove
  only while the list has two values or more, so it never empties);
- distractor lines leave `a` as it is: reads (`len(a)`, `sum(a)`, `min(a)`, `max(a)`, `sorted(a)`, `a.copy()`,
  `a.count(v)`, `a.index(v)`, `a[i]`, `a[i:j]`) and empty changes (`a.extend([])`, `a += []`), and changes of `b`
  that read like relevant lines (`b.append(v)`, `b.insert(0, v)`, `b.extend([v, w])`, `b.clear()`);
- the view: `a`, `len(a)`, `sum(a)`, `min(a)`, `max(a)`, `a[i]` or `a[i:j]`, drawn uniformly; the answer is what
  Python prints.

Every line is valid Python and the whole program runs (the tests execute it and compare). The initial list, the
relevant lines and the view depend only on (seed, relevant lines R, sample index), so a sample asks the same at every
length; the distractor lines (which line, where among the relevant ones, their values) come from a stream seeded by
the length too. The number of distractor lines is the largest for which the prompt plus the answer's tokens and EOS
fit the length, found with the model's tokenizer. The prompt:

    Below is a Python program that changes the list `a`. Read it, then write what its last line prints.

    ```python
    PROGRAM
    ```
    Output:
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tapecli.errors import TapeError

INSTRUCTION = "Below is a Python program that changes the list `a`. Read it, then write what its last line prints."
TEMPLATE = "{instruction}\n\n```python\n{program}\n```\nOutput:"
INITIAL_VALUES = 5
VIEWS = ("a", "len(a)", "sum(a)", "min(a)", "max(a)", "a[i]", "a[i:j]")


@dataclass
class LatentListSample:
    length: int
    relevant: int
    index: int
    prompt: str  # what the model reads (before the tokenizer's special tokens)
    answer: str  # what the program's last line prints
    value: Any  # the printed value itself (a list or an int)
    prompt_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)  # distractor lines, the program's lines


def _value(rng: random.Random) -> int:
    return rng.randrange(100)


def relevant_line(a: list[int], rng: random.Random) -> str:
    """One line that changes `a` (applied to `a` in place)."""
    kinds = ["append", "insert", "extend", "setitem", "reverse", "sort"]
    if len(a) >= 2:
        kinds += ["pop", "pop_i", "remove"]
    kind = rng.choice(kinds)
    if kind == "append":
        v = _value(rng)
        a.append(v)
        return f"a.append({v})"
    if kind == "insert":
        i, v = rng.randrange(len(a) + 1), _value(rng)
        a.insert(i, v)
        return f"a.insert({i}, {v})"
    if kind == "extend":
        v, w = _value(rng), _value(rng)
        a.extend([v, w])
        return f"a.extend([{v}, {w}])"
    if kind == "setitem":
        i, v = rng.randrange(len(a)), _value(rng)
        a[i] = v
        return f"a[{i}] = {v}"
    if kind == "reverse":
        a.reverse()
        return "a.reverse()"
    if kind == "sort":
        a.sort()
        return "a.sort()"
    if kind == "pop":
        a.pop()
        return "a.pop()"
    if kind == "pop_i":
        i = rng.randrange(len(a))
        a.pop(i)
        return f"a.pop({i})"
    v = rng.choice(a)
    a.remove(v)
    return f"a.remove({v})"


def distractor_line(a: list[int], rng: random.Random) -> str:
    """One line that leaves `a` as it is (`a` is the list at that point of the program)."""
    kind = rng.randrange(16)
    i = rng.randrange(len(a))
    if kind < 4:
        return ("len(a)", "sum(a)", "min(a)", "max(a)")[kind]
    if kind < 6:
        return ("sorted(a)", "a.copy()")[kind - 4]
    if kind == 6:
        return f"a.count({_value(rng)})"
    if kind == 7:
        return f"a.index({a[i]})"
    if kind == 8:
        return f"a[{i}]"
    if kind == 9:
        j = rng.randrange(i + 1, len(a) + 1)
        return f"a[{i}:{j}]"
    if kind == 10:
        return "a.extend([])"
    if kind == 11:
        return "a += []"
    return (f"b.append({_value(rng)})", f"b.insert(0, {_value(rng)})", f"b.extend([{_value(rng)}, {_value(rng)}])",
            "b.clear()")[kind - 12]


def view(a: list[int], rng: random.Random) -> tuple[str, Any]:
    """(the last line's expression, its value)."""
    kind = rng.choice(VIEWS)
    if kind == "a[i]":
        i = rng.randrange(len(a))
        return f"a[{i}]", a[i]
    if kind == "a[i:j]":
        i = rng.randrange(len(a))
        j = rng.randrange(i + 1, len(a) + 1)
        return f"a[{i}:{j}]", a[i:j]
    return kind, {"a": list(a), "len(a)": len(a), "sum(a)": sum(a), "min(a)": min(a), "max(a)": max(a)}[kind]


class Generator:
    """Latent List samples for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any, seed: int = 0) -> None:
        self.tokenizer, self.seed = tokenizer, seed

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=True))

    def sample(self, length: int, relevant: int, index: int) -> LatentListSample:
        if relevant < 0:
            raise TapeError(f"--relevant-ops must be 0 or more, got {relevant}")
        rng = random.Random(f"latent-list:{self.seed}:{relevant}:{index}")
        a = [_value(rng) for _ in range(INITIAL_VALUES)]
        head = [f"a = {a}", "b = []"]
        states, lines = [list(a)], []
        for _ in range(relevant):
            lines.append(relevant_line(a, rng))
            states.append(list(a))
        expression, value = view(a, rng)
        answer = str(value)
        room = length - len(self.tokenizer.encode(answer)) - 1  # the answer and EOS follow the prompt

        def build(distractors: int) -> str:
            stream = random.Random(f"latent-list:{self.seed}:{relevant}:{index}:{length}:distractors")
            gaps: list[list[str]] = [[] for _ in range(relevant + 1)]
            for _ in range(distractors):
                gap = stream.randrange(relevant + 1)
                gaps[gap].append(distractor_line(states[gap], stream))
            program = head + [line for g in range(relevant + 1) for line in (*gaps[g], *lines[g:g + 1])]
            return TEMPLATE.format(instruction=INSTRUCTION, program="\n".join([*program, f"print({expression})"]))

        if self.count(build(0)) > room:
            raise TapeError(f"latent-list at length {length}: the program with {relevant} relevant lines and no "
                            f"distractor needs {self.count(build(0)) + length - room} tokens; choose a longer length")
        low, high = 0, 1  # the largest number of distractor lines that fits: gallop, then bisect
        while self.count(build(high)) <= room:
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.count(build(mid)) <= room else (low, mid)
        prompt = build(low)
        return LatentListSample(length, relevant, index, prompt, answer, value, self.count(prompt),
                                {"distractors": low, "relevant_lines": lines})
