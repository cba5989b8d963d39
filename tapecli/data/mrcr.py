"""OpenAI MRCR (multi-round co-reference resolution; the `openai/mrcr` hub dataset): its released rows, and the
conversation turned into the text a model reads.

The dataset is parquet files, `2needle/2needle_0.parquet`, `2needle/2needle_1.parquet`, `4needle/...`,
`8needle/...` (earlier: `2needle.parquet`, ...), one row per conversation: `prompt` (a JSON list of chat messages
{"role", "content"}: a long synthetic conversation in which the same request, e.g. "write a poem about tapirs",
occurs 2, 4 or 8 times, then the final user turn "Prepend <hash> to the 2nd (1 indexed) poem about tapirs. Do not
include any other text in your response."), `answer` (the hash + that assistant turn), `random_string_to_prepend`
(the hash), `n_needles`, `desired_msg_index`, `total_messages` and `n_chars`. `read(data)` reads them from a local
file or folder (`tapecli.data.released`), or from the hub for users with a network.

The official harness sends the messages to a chat API. tape's models are read as text: `transcript(messages)` is
"User: ...", "Assistant: ..." turns (the roles as the dataset card's example writes them) separated by blank lines,
ending with "Assistant:"; a model's answer ends where it starts the next "User:" turn (`STOP`).

Bins (the dataset card): a row belongs to the bin whose (lower, upper] range holds its number of tokens, prompt +
answer; the official bins are powers of two from 4,096 to 1,048,576 tokens, counted with o200k_base. tape counts them
with the model's own tokenizer (`tokens(...)`), on the transcript it reads.
"""

from __future__ import annotations

import json
from typing import Any

from tapecli.errors import TapeError

HUB_ID = "openai/mrcr"
HINT = ("download the parquet files of https://huggingface.co/datasets/openai/mrcr (its 2needle/, 4needle/ and "
        "8needle/ folders) and pass the folder (or one file) as --data")
NEEDLES = (2, 4, 8)
BINS = tuple(2**k for k in range(12, 21))  # 4096, 8192, ..., 1048576: the edges of the official bins
ROLES = {"user": "User", "assistant": "Assistant", "system": "System"}
STOP = "\nUser:"
FIELDS: dict[str, Any] = {"prompt": str, "answer": str, "random_string_to_prepend": str, "n_needles": int}


def read(data: str | None) -> tuple[list[dict[str, Any]], Any]:
    """(rows, described) of MRCR's released files at `data` (None: the hub); one line when a row is malformed."""
    from tapecli.data.released import check_fields, read_rows

    rows, described = read_rows(data, HUB_ID, HINT)
    check_fields(rows, FIELDS, f"--data {data}" if data else HUB_ID)
    return rows, described


def messages(row: dict[str, Any], index: int = 0) -> list[dict[str, str]]:
    """The chat messages of a row's `prompt`."""
    try:
        parsed = json.loads(row["prompt"])
    except json.JSONDecodeError as e:
        raise TapeError(f"MRCR row {index}: its prompt is not a JSON list of messages ({e.msg})") from None
    if not isinstance(parsed, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                               and m.get("role") in ROLES for m in parsed):
        raise TapeError(f"MRCR row {index}: its prompt must be a JSON list of {{\"role\": user | assistant | "
                        "system, \"content\": text}} messages")
    return parsed


def transcript(chat: list[dict[str, str]]) -> str:
    """The conversation as text: "User: ..." / "Assistant: ..." turns, blank lines between, then "Assistant:"."""
    return "\n\n".join([*(f"{ROLES[m['role']]}: {m['content']}" for m in chat), "Assistant:"])


def bin_of(count: int, edges: list[int]) -> int | None:
    """The upper edge of the (lower, upper] bin holding `count` tokens, or None outside every bin."""
    for lower, upper in zip(edges, edges[1:], strict=False):
        if lower < count <= upper:
            return upper
    return None
