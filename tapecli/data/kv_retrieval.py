"""Lost in the middle's key-value retrieval (Liu et al. 2023, arXiv 2307.03172; nelson-liu/lost-in-the-middle),
generated offline.

As `scripts/make_kv_retrieval_data.py` makes an example: a dict of `k` random UUID4 keys, each with a random UUID4
value, in insertion order, and a gold pair chosen uniformly among them; as `scripts/get_kv_responses_from_*.py` use
it: the gold pair is taken out and put back at the gold position being evaluated (the other pairs keep their order),
and the prompt is `prompts/kv_retrieval.prompt` filled by `get_kv_retrieval_prompt`:

    Extract the value corresponding to the specified key in the JSON object below.

    JSON data:
    {"KEY1": "VALUE1",
     "KEY2": "VALUE2",
     ...
     "KEYk": "VALUEk"}

    Key: "GOLD KEY"
    Corresponding value:

The official example files draw with Python's global `random` and `uuid.uuid4()` (the OS's randomness); here example
i of size k draws from `random.Random("kv-retrieval:SEED:k:i")` (UUID4s from 128 random bits), so every model sees the
same examples, and an example's pairs are the same at every gold position. `gold_positions(k, n)` spreads n gold
positions evenly over the k pairs as the paper does when n - 1 divides k: 0, k/(n-1) - 1, 2k/(n-1) - 1, ..., k - 1
(75 pairs and 4 positions: 0, 24, 49, 74; 140 and 5: 0, 34, 69, 104, 139; 300 and 7: 0, 49, ..., 299); otherwise
round(j (k-1) / (n-1)) for j = 0 .. n-1.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from tapecli.errors import TapeError

PROMPT = ("Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n"
          "{formatted_kv_records}\n\nKey: \"{key}\"\nCorresponding value:")
PAPER_POSITIONS = {75: 4, 140: 5, 300: 7}  # the paper's gold positions per number of pairs
MAX_NEW_TOKENS = 100  # the official scripts' --max-new-tokens default


@dataclass(frozen=True)
class KvExample:
    records: list[tuple[str, str]]  # in the official file's order
    key: str
    value: str


def gold_positions(k: int, n: int) -> list[int]:
    """n evenly spaced gold positions (0-based) among k pairs (see the module docstring)."""
    if k < 2:
        raise TapeError(f"--keys: at least 2 pairs (the official generator's minimum), got {k}")
    if n < 1 or n > k:
        raise TapeError(f"--positions: between 1 and the number of pairs ({k}), got {n}")
    if n == 1:
        return [0]
    if k % (n - 1) == 0:  # the paper's spacing: the last pair of each k/(n-1) block
        return [0] + [j * k // (n - 1) - 1 for j in range(1, n)]
    return [round(j * (k - 1) / (n - 1)) for j in range(n)]


def example(k: int, index: int, seed: int) -> KvExample:
    """Example `index` with `k` pairs: `make_kv_retrieval_data.py`'s draws from a seeded stream."""
    rng = random.Random(f"kv-retrieval:{seed}:{k}:{index}")
    records: dict[str, str] = {}
    while len(records) != k:
        key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        records[key] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    ordered = list(records.items())
    key, value = rng.choice(ordered)
    return KvExample(ordered, key, value)


def at_position(ex: KvExample, position: int) -> list[tuple[str, str]]:
    """The pairs with the gold pair moved to `position` (the official pop-then-insert)."""
    records = list(ex.records)
    gold = records.pop(records.index((ex.key, ex.value)))
    records.insert(position, gold)
    return records


def format_records(records: list[tuple[str, str]]) -> str:
    """`get_kv_retrieval_prompt`'s formatting of the pairs."""
    out = ""
    for index, (key, value) in enumerate(records):
        start = "{" if index == 0 else " "
        end = ",\n" if index != len(records) - 1 else "}"
        out += start + f'"{key}": "{value}"' + end
    return out


def prompt(records: list[tuple[str, str]], key: str) -> str:
    return PROMPT.format(formatted_kv_records=format_records(records), key=key)


def prompt_tokens(encode, k: int, seed: int = 0) -> int:
    """About how many tokens `encode` (text -> ids) makes of a prompt with `k` pairs, without building it: exact up to
    8 pairs, beyond that the 8-pair prompt plus the mean tokens of a pair (from the 4th to the 8th) per further pair
    (UUID4s are random text: every pair costs about the same)."""
    def tokens(n: int) -> int:
        ex = example(n, 0, seed)
        return len(encode(prompt(ex.records, ex.key)))

    if k <= 8:
        return tokens(k)
    per_pair = (tokens(8) - tokens(4)) / 4
    return tokens(8) + int(per_pair * (k - 8) + 0.5)


def correct(value: str, answer: str) -> bool:
    """`evaluate_kv_responses.py`: the value occurs in the answer, ignoring case."""
    return value.lower() in answer.lower()
