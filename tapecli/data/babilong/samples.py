"""BABILong samples generated offline: a bAbI story (`world.story`) hidden in distractor text, sized to a length with
the model's own tokenizer, its facts at a chosen depth, in BABILong's prompt (`prompts.format_prompt`).

`Generator(tokenizer, haystack, style, seed, window).sample(task, length, depth, story)` makes one sample:

1. The story: `world.story(task, Random("babilong:SEED:TASK:STORY:0"))`: the same facts and question at every length
   and depth (BABILong also hides the same bAbI samples at every length). When even the facts alone do not fit the
   length, the story is redrawn (attempt 1, 2, ...; BABILong instead drops stories with more than (L - 300) / 8
   facts).
2. The distractor text (`Haystack`): RULER's noise sentences ("The grass is green." ... "There and back again.",
   repeated from the start), or the sentences of an essay text (`--haystack`, read by RULER's `read_essay` and split by
   its sentence splitter) from a random sentence on, wrapping around; essay sentences of fewer than 10 tokens are
   skipped, as BABILong's `SentenceSampler` skips PG-19 sentences under 10 tokens. Length 0 has none: the facts only
   (BABILong's "0k").
3. The size: whole sentences are added while the prompt (with the tokenizer's default special tokens) plus the 15
   tokens the model may generate fit the length, then removed from the end until the real count fits (BABILong fills
   L - 300 GPT-2 tokens of facts and text, cutting the last sentence to fit, whatever the prompt's length).
4. The facts go between sentences, in story order, at slots drawn with replacement and sorted (BABILong's
   `NoiseInjectionDataset`): anywhere (`depth` None, BABILong's default), or, for a depth d in [0, 1], among the slots
   whose token offset lies in the window [d (1 - w), d (1 - w) + w] of the distractor text, less the facts' own
   tokens at its end (BABILong's `task_start_pct` / `task_end_pct`; w = `window`, 0.2 by default, the narrowest
   BABILong recommends). When no slot lies in the window (a short text), the slot nearest its start is used.
   Sentences and facts are joined by single spaces (BABILong concatenates token ids, which glues sentences together
   without a space for GPT-2's tokenizer: "bedroom.Mary").

Everything is drawn from `random.Random` seeded with strings (stable across processes), so a sample depends only on
(seed, task, story, length, depth, window, haystack, prompt style) and the tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tapecli.data.babilong.prompts import format_prompt
from tapecli.data.babilong.world import story as draw_story
from tapecli.data.ruler.constants import NOISE
from tapecli.errors import TapeError

TOKENS_TO_GENERATE = 15  # scripts/run_model_on_babilong.py: max_new_tokens=15
MIN_SENTENCE_TOKENS = 10  # babilong_utils.SentenceSampler(min_sentence_len=10), for essay text
WINDOW = 0.2
STORY_TRIES = 100


@dataclass
class BabilongSample:
    """One prompt and its answer."""

    task: str
    length: int  # the target length (0: facts only)
    depth: float | None  # the depth window's position, None: anywhere
    story: int  # the story's index (what makes it the same at every length)
    input: str  # the context: facts among distractor sentences
    question: str
    target: str
    prompt: str  # what the model reads (BABILong's template), before the tokenizer's special tokens
    prompt_tokens: int  # with the default special tokens
    extra: dict[str, Any] = field(default_factory=dict)  # facts, support, sentences, fact depths


class Haystack:
    """The distractor sentences: RULER's noise (`essay_words` None) or an essay's sentences."""

    def __init__(self, essay_words: Sequence[str] | None = None,
                 split_sentences: Callable[[str], list[str]] | None = None) -> None:
        if essay_words is None:
            self.kind, self.min_tokens = "noise", 0
            self.sentences = [s if s.endswith(".") else s + "." for s in NOISE.split(". ")]
        else:
            self.kind, self.min_tokens = "essay", MIN_SENTENCE_TOKENS
            self.sentences = [s.strip() for s in split_sentences(" ".join(essay_words).strip()) if s.strip()]
            if not self.sentences:
                raise TapeError("--haystack: the text holds no sentence")

    def start(self, rng: random.Random) -> int:
        return 0 if self.kind == "noise" else rng.randrange(len(self.sentences))


class Generator:
    """BABILong samples for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any, haystack: Haystack | None = None, style: str = "bare", seed: int = 0,
                 window: float = WINDOW) -> None:
        if not 0 < window <= 1:
            raise TapeError(f"--depth-window must be in (0, 1], got {window}")
        self.tokenizer, self.haystack, self.style = tokenizer, haystack or Haystack(), style
        self.seed, self.window = seed, window
        self._cost: dict[str, int] = {}

    def count(self, prompt: str) -> int:
        """Tokens the model reads for `prompt`: with its tokenizer's default special tokens."""
        return len(self.tokenizer.encode(prompt, add_special_tokens=True))

    def cost(self, sentence: str) -> int:
        """Tokens of a sentence after the space that joins it (cached)."""
        if sentence not in self._cost:
            self._cost[sentence] = len(self.tokenizer.encode(" " + sentence))
        return self._cost[sentence]

    def story(self, task: str, index: int, attempt: int = 0):
        return draw_story(task, random.Random(f"babilong:{self.seed}:{task}:{index}:{attempt}"))

    def sample(self, task: str, length: int, depth: float | None, index: int) -> BabilongSample:
        if depth is not None and not 0 <= depth <= 1:
            raise TapeError(f"--depths: a depth is a fraction in [0, 1], got {depth}")
        for attempt in range(STORY_TRIES):
            story = self.story(task, index, attempt)
            facts_only = format_prompt(task, self.style, " ".join(story.facts), story.question)
            fixed = self.count(facts_only) + TOKENS_TO_GENERATE
            if length == 0 or fixed <= length:
                break
        else:
            raise TapeError(f"babilong {task} at length {length}: even the facts of {STORY_TRIES} stories do not fit "
                            f"(the last needs {fixed} tokens with the prompt and the answer); choose a longer length")
        extra = {"facts": story.facts, "support": story.support, "attempt": attempt}
        if length == 0:
            return BabilongSample(task, 0, None, index, " ".join(story.facts), story.question, story.answer,
                                  facts_only, fixed - TOKENS_TO_GENERATE, {**extra, "sentences": 0})
        sentences = self._take(length - fixed, random.Random(f"babilong:{self.seed}:{task}:{index}:{length}:text"))
        while True:
            rng = random.Random(f"babilong:{self.seed}:{task}:{index}:{length}:{depth}:{self.window}:place")
            context, depths = self._place(story.facts, sentences, depth, rng)
            prompt = format_prompt(task, self.style, context, story.question)
            tokens = self.count(prompt)
            over = tokens + TOKENS_TO_GENERATE - length
            if over <= 0 or not sentences:
                break
            while sentences and over > 0:
                over -= self.cost(sentences.pop())
        return BabilongSample(task, length, depth, index, context, story.question, story.answer, prompt, tokens,
                              {**extra, "sentences": len(sentences), "fact_depths": depths})

    def _take(self, budget: int, rng: random.Random) -> list[str]:
        """Whole distractor sentences from a start on whose joined tokens fit `budget`."""
        pool, chosen, used = self.haystack.sentences, [], 0
        at, skipped = self.haystack.start(rng), 0
        while skipped < len(pool):
            sentence = pool[at % len(pool)]
            at += 1
            if self.haystack.min_tokens and len(self.tokenizer.encode(sentence)) < self.haystack.min_tokens:
                skipped += 1
                continue
            skipped = 0
            if used + self.cost(sentence) > budget:
                return chosen
            chosen.append(sentence)
            used += self.cost(sentence)
        raise TapeError(f"--haystack: no sentence of the text has {self.haystack.min_tokens} tokens or more with "
                        "this tokenizer (BABILong's shortest distractor sentence)")

    def _place(self, facts: list[str], sentences: list[str], depth: float | None,
               rng: random.Random) -> tuple[str, list[float]]:
        """The facts among the sentences (see the module docstring); returns the text and each fact's depth (its
        token offset in the distractor text over the text's tokens)."""
        offsets = [0]
        for sentence in sentences:
            offsets.append(offsets[-1] + self.cost(sentence))
        total = offsets[-1]
        slots = list(range(len(sentences) + 1))
        if depth is not None:
            low = depth * (1 - self.window) * total
            high = max(low, low + self.window * total - sum(self.cost(f) for f in facts))
            slots = [i for i in slots if low <= offsets[i] <= high] or [min(slots, key=lambda i: abs(offsets[i] - low))]
        chosen = sorted(rng.choices(slots, k=len(facts)))
        parts, f = [], 0
        for i in range(len(sentences) + 1):
            while f < len(facts) and chosen[f] == i:
                parts.append(facts[f])
                f += 1
            if i < len(sentences):
                parts.append(sentences[i])
        return " ".join(parts), [round(offsets[i] / total, 4) if total else 0.0 for i in chosen]
