"""HELMET's long-document QA category (princeton-nlp/HELMET data.py's `load_narrativeqa` and `load_infbench`,
configs/longqa*.yaml, scripts/generate_configs.py): NarrativeQA, InfiniteBench's English QA and multiple choice.

Data: the Hugging Face datasets data.py reads, `narrativeqa` (deepmind/narrativeqa: its test split, demonstrations
from its train split) and `xinrongzhang2022/infinitebench` (the splits `longbook_qa_eng` and `longbook_choice_eng`,
read with data.py's features), from the hub or a local copy (`tapecli.data.helmet_hf`; InfiniteBench's copy is the
folder of its jsonl files).

The documents are measured and cut with the Llama-2 tokenizer, as data.py does (`filter_length`, `truncate_llama2`;
`tokenizer` here: meta-llama/Llama-2-7b-hf or a local copy), so every model reads the same text:

- NarrativeQA: the test split shuffled with datasets' shuffle(seed=42); the rows whose document has more than 131072
  tokens (with the tokenizer's special tokens), in that order; their `samples` first (max_test_samples: 100);
- InfiniteBench: the rows whose context has at least 65536 tokens, then shuffle(seed=42) and the first `samples`;
- each context longer than `length - 200 - generation_max_length` tokens (generate_configs.py's name_postfix) is cut
  after the token at that index less the postfix's token count (`offset_mapping`) and " ... [the rest of the text is
  omitted]" appended.

Demonstrations (`shots`, 2 in the configs): InfiniteBench's, the `shots` first rows of the other rows of the split
(another id) after shuffle(seed=42), as "[story text]\\nQuestion: ...\\nAnswer: ..." blocks; NarrativeQA's, `shots`
train questions with their first answer drawn per row by datasets' unseeded `shuffle()`, which takes its seed from
numpy's global generator (data.py leaves that generator unseeded, so HELMET's draw changes from run to run; tape seeds
it with 42 before the first row, the same draw every run). The rows: {"context", "question", "answer" (a list),
"demo"} (+ "options" for multiple choice), filled into `TEMPLATES` (user template + system template; no chat template).
"""

from __future__ import annotations

from typing import Any

from tapecli.data.helmet_cut import Measure
from tapecli.errors import TapeError

SEED = 42
PROMPT_TOKENS = 200  # generate_configs.py: "we truncate by the length - 200 - the generation length"
NARRATIVEQA_MIN = 131072  # load_narrativeqa keeps documents longer than this (Llama-2 tokens)
INFBENCH_MIN = 65536  # load_infbench keeps contexts at least this long
NARRATIVEQA = ("narrativeqa", "narrativeqa")  # (hub id, local folder)
INFBENCH = ("xinrongzhang2022/infinitebench", "infinitebench")
SPLITS = {"infbench_qa_eng": "longbook_qa_eng", "infbench_choice_eng": "longbook_choice_eng"}
TEMPLATES = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
                   "question as concisely as you can, using a single phrase if possible.\n\n{demo}{context}\n\n"
                   "Question: {question}\nAnswer:",
    "infbench_qa_eng": "You are given a story and a question. Answer the question as concisely as you can, using a "
                       "single phrase if possible.\n\n{demo}{context}\n\nQuestion: {question}\n\nAnswer:",
    "infbench_choice_eng": "You are given a story and a question with multiple choices. Choose the best answer from "
                           "the options provided. Only one of the following options is correct, output the answer "
                           "using one single letter (A, B, C, or D). Don't say anything else.\n\n{demo}{context}\n\n"
                           "Question: {question}\nOptions:\n{options}\n\nAnswer:",
}
_QA_DEMO = "[story text]\nQuestion: {question}\nAnswer: {answer[0]}"
_CHOICE_DEMO = "[story text]\nQuestion: {question}\nOptions:\n{options}\nAnswer: {answer[0]}"


def context_budget(length: int, generation_max_length: int) -> int:
    """generate_configs.py's name_postfix: the context's Llama-2 tokens at `length`."""
    return length - PROMPT_TOKENS - generation_max_length


def narrativeqa(data: str | None, samples: int, shots: int, shuffle: Any, measure: Measure
                ) -> tuple[list[dict[str, Any]], str]:
    """load_narrativeqa's rows before truncation (see the module docstring) and a description of what was read."""
    import datasets
    import numpy as np

    from tapecli.data import helmet_hf

    hub_id, folder = NARRATIVEQA
    where = hub_id if data is None else f"--data {data}: {folder}/"
    whole = helmet_hf.dataset(data, hub_id, folder)
    test = helmet_hf.split(whole, "test", where)
    train = helmet_hf.split(whole, "train", where) if shots > 0 else None
    for part in (test, train):
        if part is not None and not {"document", "question", "answers"} <= set(part.column_names):
            raise TapeError(f"{where}: the rows need 'document', 'question' and 'answers' (NarrativeQA's fields)")
    out = []
    for i in shuffle(len(test), SEED):
        row = test[i]
        if not row["answers"]:
            raise TapeError(f"{where}: test row {i} has no answer")
        if measure.count(row["document"]["text"]) > NARRATIVEQA_MIN:
            out.append({"context": row["document"]["text"], "question": row["question"]["text"],
                        "answer": [a["text"] for a in row["answers"]], "demo": ""})
            if len(out) == samples:
                break
    if shots > 0 and out:
        state = np.random.get_state()
        np.random.seed(SEED)
        try:
            index = datasets.Dataset.from_dict({"i": list(range(len(train)))})
            for row in out:
                chosen = [train[j] for j in index.shuffle()["i"][:shots]]
                row["demo"] = ("For example:\n\n" + "\n\n".join(f"Question: {ex['question']['text']}\nAnswer: "
                                                              f"{ex['answers'][0]['text']}" for ex in chosen)
                               + "\n\nNow, use the following story to answer the question:\n\n")
        finally:
            np.random.set_state(state)
    return out, f"{where} test {len(test)} rows, the first {len(out)} with a document over {NARRATIVEQA_MIN} tokens"


def infbench(data: str | None, task: str, samples: int, shots: int, shuffle: Any, measure: Measure
             ) -> tuple[list[dict[str, Any]], str]:
    """load_infbench's rows before truncation (see the module docstring) and a description of what was read."""
    from datasets import Features, Sequence, Value

    from tapecli.data import helmet_hf

    hub_id, folder = INFBENCH
    split = SPLITS[task]
    where = hub_id if data is None else f"--data {data}: {folder}/{split}.jsonl"
    features = Features({"id": Value("int64"), "context": Value("string"), "input": Value("string"),
                         "answer": Sequence(Value("string")), "options": Sequence(Value("string"))})
    rows = [process(task, r, where) for r in helmet_hf.json_split(data, hub_id, folder, split, features)]
    if shots > 0:
        if len(rows) <= shots:
            raise TapeError(f"--shots {shots}: {where} has {len(rows)} rows; InfiniteBench's demonstrations are "
                            "other rows of the split")
        template = _CHOICE_DEMO if task == "infbench_choice_eng" else _QA_DEMO
        for row in rows:
            others = [x for x in rows if x["id"] != row["id"]]
            demo = "\n\n".join(template.format(**others[j]) for j in shuffle(len(others), SEED)[:shots])
            row["demo"] = f"For example:\n\n{demo}\n\nNow, read the following story:\n\n"
    long = [r for r in rows if measure.count(r["context"]) >= INFBENCH_MIN]
    chosen = [long[i] for i in shuffle(len(long), SEED)[:min(len(long), samples)]] if long else []
    return chosen, f"{where} {len(rows)} rows, {len(long)} with a context of {INFBENCH_MIN} tokens or more"


def process(task: str, example: dict[str, Any], where: str) -> dict[str, Any]:
    """load_infbench's process_example: question = input, multiple choice's options text and [letter, "letter.
    answer"] answers."""
    row = {**example, "question": example["input"], "demo": ""}
    if task == "infbench_choice_eng":
        options = example["options"]
        if len(options) != 4 or not example["answer"] or example["answer"][0] not in options:
            raise TapeError(f"{where}: row id {example['id']} needs 4 options, one of them its answer")
        letter = chr(ord("A") + options.index(example["answer"][0]))
        row["options"] = "A. {}\nB. {}\nC. {}\nD. {}".format(*options)
        row["answer"] = [letter, f"{letter}. {example['answer'][0]}"]
    elif not example["answer"]:
        raise TapeError(f"{where}: row id {example['id']} has no answer")
    return row


def rows(data: str | None, task: str, samples: int, shots: int, shuffle: Any, measure: Measure
         ) -> tuple[list[dict[str, Any]], str]:
    """The task's drawn rows with their demonstrations, before truncation, and a description of what was read."""
    return (narrativeqa(data, samples, shots, shuffle, measure) if task == "narrativeqa"
            else infbench(data, task, samples, shots, shuffle, measure))


def cut(rows: list[dict[str, Any]], task: str, length: int, generation_max_length: int, measure: Measure
        ) -> list[dict[str, Any]]:
    """The rows at `length`: each context cut to context_budget(length) tokens as truncate_llama2 cuts it
    (`document_cut`: whether it was)."""
    budget = context_budget(length, generation_max_length)
    if budget <= measure.separator:
        raise TapeError(f"--lengths: {task} needs more than {PROMPT_TOKENS + generation_max_length + measure.separator}"
                        f" tokens (HELMET cuts its documents to length - {PROMPT_TOKENS} - {generation_max_length}),"
                        f" got {length}")
    out = []
    for row in rows:
        context, was_cut = measure.truncate(row["context"], budget)
        out.append({**row, "context": context, "document_cut": was_cut})
    return out
