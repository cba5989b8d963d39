"""HELMET's citation category, ALCE's ASQA and QAMPARI (princeton-nlp/HELMET data.py's `load_alce`, eval.py,
configs/cite.yaml, scripts/generate_configs.py): the released files, the prompt and its demonstrations, the draw.

- Files: HELMET's data.tar.gz holds `alce/asqa_eval_gtr_top2000.json` and `alce/qampari_eval_gtr_top2000.json` (a JSON
  list of questions, each with its 2,000 retrieved passages `docs`, `title` and `text`; ASQA's with `qa_pairs`, each
  with its `short_answers`, QAMPARI's with `answers`, a list of lists of aliases). The input length sets how many
  passages the prompt holds (generate_configs.py's name_postfix): 8, 30, 75, 165, 345 and 700 for 4K ... 128K.
- Demonstrations: HELMET's prompts/asqa_revised.json and qampari_revised.json (shipped with tape in
  `tapecli/data/helmet_prompts/`, HELMET's MIT license beside them): the instruction, the demonstration template, the
  passage template "Document [{ID}](Title: {title}): {text}" and four worked examples with five passages each. Each
  row gets `shots` of them (2 as in the configs) by `random.sample`, in file order after `random.seed(42)` (eval.py
  seeds before load_alce maps the rows), joined by three new lines.
- Prompt: "{demo_text}{instruction}\\n\\nQuestion: {question}\\n\\n{context}" + "\\n\\nAnswer:", the context the
  first N passages, numbered from 1.
- Draw: `Dataset.shuffle(seed=42)` and the first `--samples` (eval.py, after the demonstrations were drawn).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError

FILES = {"alce_asqa": "alce/asqa_eval_gtr_top2000.json", "alce_qampari": "alce/qampari_eval_gtr_top2000.json"}
PROMPTS = {"alce_asqa": "asqa_revised.json", "alce_qampari": "qampari_revised.json"}
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)
PASSAGES = dict(zip(LENGTHS, (8, 30, 75, 165, 345, 700), strict=True))
SYSTEM = "Answer:"  # the system template: eval.py puts it before a completion (no chat template)
SEED = 42


def demo_file(task: str) -> dict[str, Any]:
    """HELMET's prompt file of an ALCE task (the shipped copy)."""
    return json.loads((Path(__file__).parent / "helmet_prompts" / PROMPTS[task]).read_text(encoding="utf-8"))


def samples(task: str, rows: list[dict[str, Any]], length: int, shots: int,
            chosen: list[int]) -> dict[int, dict[str, Any]]:
    """load_alce's preprocess_example, its demonstrations drawn for every row in file order after random.seed(42):
    {index: the row with its `context` (the first N passages), `demo_text`, `instruction` and `answer` (ASQA's long
    answer, QAMPARI's answer lists)} for the `chosen` rows."""
    if length not in PASSAGES:
        raise TapeError(f"--lengths: {task} has passage counts for {', '.join(map(str, LENGTHS))} tokens only "
                        f"(HELMET's 4K-128K), got {length}")
    prompts = demo_file(task)
    doc = prompts["doc_prompt"]
    instruction = prompts["instruction"]
    rng = random.Random(SEED)
    drawn = [rng.sample(prompts["demos"], shots) for _ in rows]
    out = {}
    for i in chosen:
        row = rows[i]
        context = "\n\n".join(doc.format(**d, ID=k + 1) for k, d in enumerate(row["docs"][:PASSAGES[length]]))
        demo_text = "\n\n\n".join(
            prompts["demo_prompt"].format(**demo, instruction=instruction,
                                          context="\n\n".join(doc.format(**d, ID=k + 1)
                                                              for k, d in enumerate(demo["docs"])))
            for demo in drawn[i])
        if shots > 0:
            demo_text += "\n\n\n"
        out[i] = {**row, "context": context, "demo_text": demo_text, "instruction": instruction,
                  "answer": row.get("answer", "") if task == "alce_asqa" else row["answers"]}
    return out


def read(data: str | None, task: str) -> tuple[list[dict[str, Any]], str]:
    """(rows, "alce/... sha256:...") of an ALCE task's file; one line when it is missing or malformed."""
    import hashlib

    from tapecli.data.helmet import HINT, HUB_ID, _root
    from tapecli.data.released import check_fields, parse_rows
    from tapecli.faults import reading

    name = FILES[task]
    path = _root(data) / name
    if not path.is_file():
        raise TapeError(f"--data {data or HUB_ID}: no {name} for {task}; {HINT}")
    with reading(path):
        raw = path.read_bytes()
    rows = parse_rows(path, raw)
    check_fields(rows, {"question": str, "docs": list, **({"qa_pairs": list} if task == "alce_asqa"
                                                          else {"answers": list})}, str(path))
    for k, row in enumerate(rows):
        if not all(isinstance(d, dict) and isinstance(d.get("title"), str) and isinstance(d.get("text"), str)
                   for d in row["docs"]):
            raise TapeError(f"{path}: row {k} needs 'docs' with 'title' and 'text'")
        groups = ([p.get("short_answers") for p in row["qa_pairs"] if isinstance(p, dict)] if task == "alce_asqa"
                  else row["answers"])
        if not groups or len(groups) != len(row["qa_pairs" if task == "alce_asqa" else "answers"]) or not all(
                isinstance(g, list) and all(isinstance(a, str) for a in g) for g in groups):
            what = "'qa_pairs' with 'short_answers'" if task == "alce_asqa" else "'answers'"
            raise TapeError(f"{path}: row {k} needs non-empty {what} (lists of str)")
    return rows, f"{name} sha256:{hashlib.sha256(raw).hexdigest()}"
