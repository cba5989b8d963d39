"""wonderwords' word lists, read as RULER reads them (`wonderwords.random_word._get_words_from_text_file`).

- `adjective_noun_words()`: NIAH's word keys/values, `sorted(set(f"{adj}-{noun}" for adj in adjs for noun in
  nouns))` (6,175,260 strings with wonderwords 2.2.0). Building and sorting that list takes ~10-30 s and ~0.5 GB, so
  it is represented lazily by `AdjectiveNouns`, a sequence with the same length and the same element at every index
  (`random.choice` only needs `len` and indexing); a test checks it against the literal construction.
- `cwe_words()`: CWE's words, `sorted(set(nouns + adjs + verbs))` (before CWE's own seeded shuffle).

The lists come from the installed wonderwords (pinned in constraints.txt; 3.x dropped four nouns, which changes
every drawn word), never from the network.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from importlib import resources


def read_list(name: str) -> list[str]:
    """One of wonderwords' asset files (nounlist.txt, adjectivelist.txt, verblist.txt), one word a line."""
    with resources.files("wonderwords").joinpath("assets", name).open("r") as f:
        return [word.rstrip() for word in f.readlines()]


def wonderwords_version() -> str:
    from importlib.metadata import version

    return version("wonderwords")


class AdjectiveNouns(Sequence):
    """`sorted(set(f"{a}-{n}" for a in adjectives for n in nouns))`, without building it.

    With unique nouns sorted, the strings of one adjective are consecutive and in noun order, unless another
    adjective extends it with a hyphen ("old" and "old-fashioned"): then their strings interleave. Adjectives are
    grouped with every adjective that extends them (transitively); a group of one is a lazy block, a larger group is
    sorted explicitly (a few times 10^4 strings). Blocks are ordered by their shortest member + "-" (a string of one
    group can only compare with one of another through that prefix).
    """

    def __init__(self, adjectives: list[str], nouns: list[str]) -> None:
        self.nouns = sorted(set(nouns))
        adjs = sorted(set(adjectives), key=len)
        root: dict[str, str] = {}
        for adj in adjs:  # shorter first: an adjective's extensions come after it
            parents = [root[p] for p in root if adj.startswith(p + "-")]
            root[adj] = min(parents, key=len) if parents else adj
        groups: dict[str, list[str]] = {}
        for adj in adjs:
            groups.setdefault(root[adj], []).append(adj)
        self.blocks: list[str | list[str]] = []
        for head in sorted(groups, key=lambda a: a + "-"):
            members = groups[head]
            if len(members) == 1:
                self.blocks.append(head)
            else:
                self.blocks.append(sorted({f"{a}-{n}" for a in members for n in self.nouns}))
        self.starts = [0]
        for block in self.blocks:
            self.starts.append(self.starts[-1] + (len(self.nouns) if isinstance(block, str) else len(block)))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        b = bisect.bisect_right(self.starts, index) - 1
        block, offset = self.blocks[b], index - self.starts[b]
        return f"{block}-{self.nouns[offset]}" if isinstance(block, str) else block[offset]


@functools.cache
def adjective_noun_words() -> AdjectiveNouns:
    return AdjectiveNouns(read_list("adjectivelist.txt"), read_list("nounlist.txt"))


@functools.cache
def cwe_words() -> tuple[str, ...]:
    return tuple(sorted(set(read_list("nounlist.txt") + read_list("adjectivelist.txt") + read_list("verblist.txt"))))

