"""LongBench v2 (Bai et al. 2024, arXiv 2412.15204; THUDM/LongBench): its released rows and its prompts.

The dataset is one file, `data.json` of the hub dataset `THUDM/LongBench-v2` (a JSON list of 503 rows), each with
`_id`, `domain`, `sub_domain`, `difficulty` (easy | hard), `length` (short | medium | long), `question`,
`choice_A`..`choice_D`, `answer` (A-D) and `context`. `read(data)` reads it from a local file or folder
(`tapecli.data.released`), or from the hub for users with a network.

Prompts are the official `prompts/0shot.txt`, `0shot_cot.txt` and `0shot_cot_ans.txt` (THUDM/LongBench main), filled
as `pred.py` fills them (`fill`): one `str.replace` after another, in its order ($DOC$, $Q$, $C_A$..$C_D$, then $COT$),
each value stripped.
"""

from __future__ import annotations

from typing import Any

HUB_ID = "THUDM/LongBench-v2"
HINT = ("download data.json from https://huggingface.co/datasets/THUDM/LongBench-v2 and pass the file (or its "
        "folder) as --data")
FIELDS: dict[str, Any] = {name: str for name in ("_id", "difficulty", "length", "question", "choice_A", "choice_B",
                                                 "choice_C", "choice_D", "answer", "context")}

_ASK = ("What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n")
_FORMAT = 'Format your response as follows: "The correct answer is (insert answer here)".'
ZERO_SHOT = ("Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n" + _ASK
             + _FORMAT)
COT = ("Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\n" + _ASK
       + "Let\u2019s think step by step:")
COT_ANSWER = ("Please read the following text and answer the questions below.\n\nThe text is too long and omitted "
              "here.\n\n" + _ASK + "Let\u2019s think step by step: $COT$\n\nBased on the above, what is the single, "
              "most likely answer choice? " + _FORMAT)
ZERO_SHOT_TOKENS, COT_TOKENS = 128, 1024  # pred.py's max_new_tokens: the answer, the chain of thought


def read(data: str | None) -> tuple[list[dict[str, Any]], Any]:
    """(rows, described) of LongBench v2's data.json at `data` (None: the hub); one line when a row is malformed."""
    from tapecli.data.released import check_fields, read_rows

    rows, described = read_rows(data, HUB_ID, HINT)
    check_fields(rows, FIELDS, f"--data {data}" if data else HUB_ID)
    return rows, described


def fill(template: str, row: dict[str, Any], cot: str | None = None) -> str:
    """`template` filled with a row's fields (and the chain of thought) exactly as pred.py fills it."""
    text = template.replace("$DOC$", row["context"].strip()).replace("$Q$", row["question"].strip())
    for letter in "ABCD":
        text = text.replace(f"$C_{letter}$", row[f"choice_{letter}"].strip())
    return text if cot is None else text.replace("$COT$", cot)
