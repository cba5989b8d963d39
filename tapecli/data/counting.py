"""CoPE's counting task (Golovneva et al., "Contextual Position Encoding: Learning to Count What's Important",
arXiv 2405.18719), generated on the fly like the other synthetic tasks (tapecli.data.synthetic), by the law of the
paper's official generator (facebookresearch/RAM, projects/cope/scripts/count_data_gen.py).

A sample is a program of statements over `variables` variables (a, b, c, ...), then a question and its answer:
- the number of statements is uniform in 3..max_statements (official: 512);
- each statement is drawn with weights set 1 : pass `pass_weight` (official: 50) : increment 7. `x = 0 ;` sets a
  uniformly chosen variable to 0; `pass;` does nothing; `x ++;` adds 1 to a uniformly chosen variable that has been
  set. A statement that cannot be made (an increment before any set, or past the maximum value 10) is drawn again;
- the question `print x` names a uniformly chosen variable that has been set, the answer is its value (0-10); a
  program that set none is drawn again from the start.
The official tokenizer splits words, one token each (`x`, `=`, `0`, `;`, `pass;`, `x`, `++;`, `print`, `x`, the
answer); here each of those words is one character of the `counting` tokenizer, so lengths in tokens are the
official ones: `x=0;` (set), `.` (pass), `x+` (increment), `?x` (question), then the answer (`X` is 10). Like the
official collator, a sample longer than the window (data.seq_len; official block size 512) keeps its last tokens.
Loss and accuracy on the answer only (official `--train-on answer`), so whole-sequence and per-token accuracy agree.

Splits (the official script generates the training law only; the two OOD splits are ours): IID is the training law;
OOD-dense and OOD-sparse change how many pass statements fall between the sets and increments, keeping their
expected number per sample (statements scaled by (8 + pass weight) / (8 + 50)): dense [115, 5, 256] (a pass weight of
5, 115 statements at most, a 256-token window), sparse [1836, 200, 2048]. Counts follow the same law in every split
(increments and sets keep their 7 : 1 ratio); what changes is how far apart in tokens the events are.

Each sample is a pure function of (task, split, seed, index) (tapecli.data.synthetic.example_rng).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from tapecli.data.schema import positive
from tapecli.data.synthetic import Example, Spec, SyntheticData
from tapecli.errors import TapeError

VARIABLES = "abcdefghij"
VALUES = "0123456789X"  # 0..10; the official generator's MAX_VAL is 10
SET_WEIGHT, INCREMENT_WEIGHT = 1, 7  # official OP_WEIGHTS (pass: `pass_weight`, officially 50)
PASS, INCREMENT, QUESTION = ".", "+", "?"
TRIES = 100  # official: a statement is redrawn up to 100 times


@dataclass(frozen=True)
class CountSpec:
    """A counting split: programs of 3..max_statements statements over `variables` variables, pass statements
    drawn with weight `pass_weight` (sets 1, increments 7), cut to their last `length` tokens."""

    tokenizer: ClassVar[str] = "counting"
    counts_objects: ClassVar[bool] = False
    variables: int
    max_statements: int
    pass_weight: float
    length: int

    def _statement(self, rng: random.Random, values: dict[str, int]) -> str:
        names = VARIABLES[: self.variables]
        for _ in range(TRIES):
            op = rng.choices(("set", "pass", "increment"), (SET_WEIGHT, self.pass_weight, INCREMENT_WEIGHT))[0]
            if op == "set":
                name = rng.choice(names)
                values[name] = 0
                return f"{name}=0;"
            if op == "pass":
                return PASS
            if values:
                name = rng.choice(list(values))
                if values[name] < len(VALUES) - 1:
                    values[name] += 1
                    return name + INCREMENT
        raise RuntimeError(f"no statement could be drawn in {TRIES} tries")  # as the official generator

    def example(self, rng: random.Random) -> Example:
        while True:
            values: dict[str, int] = {}
            program = "".join(self._statement(rng, values) for _ in range(rng.randint(3, self.max_statements)))
            if values:  # the question needs a variable that was set; else the whole sample is drawn again
                break
        name = rng.choice(list(values))
        text = (program + QUESTION + name + VALUES[values[name]])[-self.length:]
        answer = [False] * (len(text) - 1) + [True]
        return Example(text, answer, answer)


def _check_split(key: str, triple: list[float]) -> None:
    if (len(triple) != 3 or triple[0] != int(triple[0]) or triple[0] < 3 or triple[1] < 0
            or triple[2] != int(triple[2]) or triple[2] < 3):
        raise TapeError(f"{key}: expected [max_statements, pass_weight, seq_len] with whole max_statements >= 3, "
                        f"pass_weight >= 0 and whole seq_len >= 3, got {triple}")


@dataclass
class CountingEval:
    """`eval:` of kind counting: the splits of `tape eval synthetic` (IID is the training distribution)."""

    samples: int = 100  # samples per split
    dense_counting: list[float] = field(default_factory=lambda: [115, 5, 256])  # OOD-dense: statements, pass w, window
    sparse_counting: list[float] = field(default_factory=lambda: [1836, 200, 2048])  # OOD-sparse: the same three

    def check(self) -> None:
        positive("eval.samples", self.samples)
        _check_split("eval.dense_counting", self.dense_counting)
        _check_split("eval.sparse_counting", self.sparse_counting)


@dataclass
class CountingData(SyntheticData):
    """`data:` of kind counting: set / pass / increment statements, `print x`, the value; the loss on the value."""

    Eval: ClassVar[type] = CountingEval
    TOKENIZER: ClassVar[str] = "counting"

    kind: Literal["counting"] = "counting"  # CoPE's counting task: the value of a variable after a program
    seq_len: int = 512  # the window: a longer sample keeps its last seq_len tokens (official block size 512)
    variables: int = 3  # variables a, b, c, ... (official runs: 1, 3, 5; at most 10)
    max_statements: int = 512  # statements per program: uniform in 3..max_statements (official 512)
    pass_weight: float = 50.0  # weight of a pass statement (sets 1, increments 7; official 50)
    train_size: int | None = None  # a fixed training set of this many samples (official 10,000); null: a stream

    def check(self) -> None:
        super().check()
        if not 1 <= self.variables <= len(VARIABLES):
            raise TapeError(f"data.variables: must be in 1..{len(VARIABLES)}, got {self.variables}")
        if self.max_statements < 3:
            raise TapeError(f"data.max_statements: must be >= 3, got {self.max_statements}")
        if self.pass_weight < 0:
            raise TapeError(f"data.pass_weight: must be >= 0, got {self.pass_weight}")
        if self.seq_len < 3:
            raise TapeError(f"data.seq_len: must be >= 3 (the question and its answer), got {self.seq_len}")

    def iid_spec(self) -> CountSpec:
        return CountSpec(self.variables, self.max_statements, self.pass_weight, self.seq_len)

    def split_specs(self, evaluation: CountingEval) -> dict[str, Spec]:
        """OOD splits change the [max_statements, pass_weight, window] triple (eval.dense_counting,
        eval.sparse_counting)."""
        def spec(triple: list[float]) -> CountSpec:
            return CountSpec(self.variables, int(triple[0]), float(triple[1]), int(triple[2]))

        return {"iid": self.iid_spec(), "ood-dense": spec(evaluation.dense_counting),
                "ood-sparse": spec(evaluation.sparse_counting)}
