"""HELMET (Yen et al. 2025, arXiv 2410.02694; github princeton-nlp/HELMET): its released files, task definitions and
prompts, for the categories tape runs.

The data is HELMET's `data.tar.gz` (the hub dataset `princeton-nlp/HELMET`), extracted: a `data/` folder of jsonl files,
one per task and input length. tape runs the synthetic recall, RAG and re-ranking categories, whose tasks and files are
those of HELMET's configs/recall*.yaml, rag*.yaml, rerank*.yaml and scripts/generate_configs.py:

- `json_kv`: data/json_kv/test_k{50,105,220,440,900,1800}_dep6.jsonl for 4K, 8K, ..., 128K; rows with `context` (a
  JSON object of UUID pairs), `question` (a key), `answer` (its value) and `demos` ([key, value] pairs);
- `ruler_niah_mk_2` (MK needle), `ruler_niah_mk_3` (MK UUID), `ruler_niah_mv` (multi-value):
  data/ruler/niah_multikey_2/validation_{L}.jsonl (niah_multikey_3, niah_multivalue) for L in tokens; rows with
  `context`, `query`, `type_needle_v` and `outputs` (or `answer`): the list of values to recall;
- RAG, `kilt_nq`, `kilt_triviaqa`, `kilt_hotpotqa`, `kilt_popqa` (KILT questions among retrieved passages):
  data/kilt/nq-dev-multikilt_1000_k{20,50,105,220,440,1000}_dep6.jsonl (triviaqa-dev-..., hotpotqa-dev-..._dep3,
  popqa_test_1000_k..._dep6) for 4K ... 128K, and their demonstration files (nq-train-multikilt_1000_k3_dep6.jsonl,
  ...; PopQA's own test file with 3 passages); rows with `question`, `answers` (a list) and `ctxs` (passages with
  `title` and `text`), PopQA's with `s_pop` (HELMET's kilt_popqa_3 keeps the questions with log10(s_pop) < 3);
- re-ranking, `msmarco_rerank_psg`: data/msmarco/test_reranking_data_k{14,50,130,285,600,1000}_dep3.jsonl for 4K ...
  128K and the demonstrations' test_reranking_data_k10_dep3.jsonl; rows with `qid`, `query` and `ctxs` (passages
  with `id`, `text`, an optional `title` and a relevance `label`).

The summarisation (`infbench_sum_eng`, `multi_lexsum`) and citation (`alce_asqa`, `alce_qampari`) tasks have their rows
in the table below; their files, demonstrations, cuts and draws are `tapecli.data.helmet_summ` and `helmet_cite`.

`Task` holds what data.py's loaders and the configs give each task: its file for a length, the tokens to generate
(configs: 100, 50, 100, 50; RAG 20 and re-ranking 200, stopping at a new line), the prompt template (data.py's
`load_json_kv`, `load_ruler`, `load_qa` and `load_msmarco_rerank`, filled with `str.format(**row)` as its `tokenize`
does) and HELMET's metric (scripts/collect_results.py); RAG and re-ranking prompts carry `shots` demonstrations
(`demonstrations`: the loaders' per-question shuffle). `read(data, task, length)` reads one file from a local folder
(the extracted `data/`, or the folder above it), or, for users with a network, from the hub's data.tar.gz (downloaded
once into the Hugging Face cache and extracted beside it).

HELMET's many-shot ICL and long-document QA categories read Hugging Face datasets instead of data/ files: their tasks
are in `TASKS` too (their rows made by `tapecli.data.helmet_icl` and `tapecli.data.helmet_longqa`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapecli.data import helmet_icl, helmet_longqa
from tapecli.errors import TapeError

HUB_ID = "princeton-nlp/HELMET"
HINT = ("download data.tar.gz from https://huggingface.co/datasets/princeton-nlp/HELMET, extract it (tar -xzf) and "
        "pass its data/ folder as --data")
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)  # HELMET's 4K-128K; json_kv has one file per length
JSON_KV_KEYS = dict(zip(LENGTHS, ("50", "105", "220", "440", "900", "1800"), strict=True))
KILT_PASSAGES = dict(zip(LENGTHS, ("20", "50", "105", "220", "440", "1000"), strict=True))
RERANK_PASSAGES = dict(zip(LENGTHS, ("14", "50", "130", "285", "600", "1000"), strict=True))
POPQA_THRESHOLD = 3.0  # kilt_popqa_3: log10(s_pop) < 3

# data.py's load_json_kv (from lost-in-the-middle's kv_retrieval.prompt) and load_ruler (RULER's constants.py)
_KV_USER = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
            "{demos}Key: {question}")
_KV_DEMO = "Key: {key}\nCorresponding value:{value}"
_NIAH_USER = ("A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. I will "
              "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat is the special magic {type_needle_v} "
              "for {query} mentioned in the provided text?")
_NIAH_SYSTEM = "The special magic {type_needle_v} for {query} mentioned in the provided text is"
_MV_USER = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I "
            "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
            "{type_needle_v} for {query} mentioned in the provided text?")
_MV_SYSTEM = "The special magic {type_needle_v} for {query} mentioned in the provided text are"
_QA_USER = ("Use the given documents to write a concise and short answer to the question. Write your answer in the "
            "following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}")
_QA_DEMO = "{documents}\n\nQuestion: {question}\nAnswer: {answer}"
_PASSAGE = "Document (Title: {title}): {text}"
_RERANK_USER = ("You are provided with a list of documents, each indicated by their ID. Rank each document based on "
                "their relevance to the question in descending order from most relelvant to least relevant texts. "
                "Include all documents in the rankings. Write your answer using the unique IDs, with the following "
                "format:\nRanking: ID3 > ID1 > ID2\n\n{demos}{context}\n\nQuery: {question}")

# summarisation (load_infbench's sum_eng, load_multi_lexsum; tapecli.data.helmet_summ) and citations (load_alce;
# tapecli.data.helmet_cite): user template + "\n\n" + system template
_INFBENCH_SUM = ("You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200 "
                 "words. Only write about the plot and characters of the story. Do not discuss the themes or "
                 "background of the book. Do not provide any analysis or commentary.\n\n{demo}{context}\n\nNow "
                 "summarize the book.")
_MULTI_LEXSUM = ("You are given the legal documents in a civil rights lawsuit, and you are tasked to summarize the "
                 "case. Write a concise summary of one paragraph (200 to 250 words). The summary should contain a "
                 "short description of the background, the parties involved, and the outcomes of the case.\n\n{demo}"
                 "Legal documents:\n{context}\n\nNow please summarize the case.")
_ALCE = "{demo_text}{instruction}\n\nQuestion: {question}\n\n{context}"


@dataclass(frozen=True)
class Task:
    """One HELMET task: its category, folder, tokens to generate, prompt and metric."""

    name: str
    category: str
    folder: str
    generation_max_length: int
    template: str  # user template + "\n" + system template (data.py's prompt_template)
    metric: str  # the key collect_results.py reports: substring_exact_match | ruler_recall | NDCG@10 | ... (summ:
    # rougeLsum_f1, HELMET's GPT-4o judge not run; cite: the answer metric, citation recall/precision beside it)
    demo_file: str | None = None  # RAG: the demonstrations' file, relative to data/
    stop_new_line: bool = False
    samples: int = 100  # max_test_samples in its config

    def file(self, length: int) -> str:
        """The released file of this task at an input length, relative to data/."""
        if self.category == "recall" and self.name != "json_kv":
            return f"ruler/{self.folder}/validation_{length}.jsonl"
        if length not in JSON_KV_KEYS:
            raise TapeError(f"--lengths: {self.name} has files for {', '.join(map(str, LENGTHS))} tokens only "
                            f"(HELMET's 4K-128K), got {length}")
        sizes = {"json_kv": JSON_KV_KEYS, "rag": KILT_PASSAGES, "rerank": RERANK_PASSAGES}
        return self.folder.format(k=sizes[self.name if self.name == "json_kv" else self.category][length])


TASKS = {t.name: t for t in (
    Task("json_kv", "recall", "json_kv/test_k{k}_dep6.jsonl", 100, _KV_USER + "\nCorresponding value:",
         "substring_exact_match"),
    Task("ruler_niah_mk_2", "recall", "niah_multikey_2", 50, _NIAH_USER + "\n" + _NIAH_SYSTEM, "ruler_recall"),
    Task("ruler_niah_mk_3", "recall", "niah_multikey_3", 100, _NIAH_USER + "\n" + _NIAH_SYSTEM, "ruler_recall"),
    Task("ruler_niah_mv", "recall", "niah_multivalue", 50, _MV_USER + "\n" + _MV_SYSTEM, "ruler_recall"),
    *(Task(f"kilt_{name}", "rag", f"kilt/{stem}-dev-multikilt_1000_k{{k}}_{dep}.jsonl", 20, _QA_USER + "\nAnswer:",
           "substring_exact_match", f"kilt/{stem}-train-multikilt_1000_k3_{dep}.jsonl", True)
      for name, stem, dep in [("nq", "nq", "dep6"), ("triviaqa", "triviaqa", "dep6"),
                              ("hotpotqa", "hotpotqa", "dep3")]),
    Task("kilt_popqa", "rag", "kilt/popqa_test_1000_k{k}_dep6.jsonl", 20, _QA_USER + "\nAnswer:",
         "substring_exact_match", "kilt/popqa_test_1000_k3_dep6.jsonl", True),
    Task("msmarco_rerank_psg", "rerank", "msmarco/test_reranking_data_k{k}_dep3.jsonl", 200,
         _RERANK_USER + "\nRanking:", "NDCG@10", "msmarco/test_reranking_data_k10_dep3.jsonl", True),
    # ICL and long-document QA: rows from Hugging Face datasets (helmet_icl, helmet_longqa), no file of data/
    *(Task(name, "icl", "", 20, helmet_icl.TEMPLATE, "exact_match", None, True, 500) for name in helmet_icl.SOURCES),
    Task("narrativeqa", "longqa", "", 100, helmet_longqa.TEMPLATES["narrativeqa"], "rougeL_f1"),
    Task("infbench_qa_eng", "longqa", "", 10, helmet_longqa.TEMPLATES["infbench_qa_eng"], "rougeL_f1"),
    Task("infbench_choice_eng", "longqa", "", 10, helmet_longqa.TEMPLATES["infbench_choice_eng"], "exact_match"),
    Task("infbench_sum_eng", "summ", "infinitebench/longbook_sum_eng.jsonl", 1200, _INFBENCH_SUM + "\n\nSummary:",
         "rougeLsum_f1"),
    Task("multi_lexsum", "summ", "multi_lexsum/validation.jsonl", 400, _MULTI_LEXSUM + "\n\nSummary:", "rougeLsum_f1"),
    Task("alce_asqa", "cite", "alce/asqa_eval_gtr_top2000.json", 300, _ALCE + "\n\nAnswer:", "str_em"),
    Task("alce_qampari", "cite", "alce/qampari_eval_gtr_top2000.json", 300, _ALCE + "\n\nAnswer:",
         "qampari_rec_top5"),
)}
CATEGORIES = {c: [n for n, t in TASKS.items() if t.category == c]
              for c in ("recall", "rag", "rerank", "icl", "longqa", "summ", "cite")}


def qa_key(rows: list[dict[str, Any]], task: Task) -> str:
    """The key load_qa (and load_msmarco_rerank) draws and dedupes by: "id" ("qid") when the rows have one, else
    "question" ("query")."""
    if task.category == "rerank":
        return "qid" if rows and "qid" in rows[0] else "query"
    return "id" if rows and "id" in rows[0] else "question"


def fields(task: Task, row: dict[str, Any], shots: int, demos: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """The row as data.py's loader maps it: json_kv's demos text (the row's first `shots` [key, value] pairs),
    RULER's question and answer list, RAG's passages and `demos` (the rows `demonstrations` chose)."""
    if task.category == "rerank":
        template = _RANKED_PASSAGE if "title" in row["ctxs"][0] else _RANKED_TEXT
        demo = "".join("\n\n".join(template.format(**c) for c in d["ctxs"])
                       + f"\n\nQuery: {d['query']}\nRanking: {gold_ranking(d)}" + "\n\n" for d in demos)
        return {**row, "context": "\n\n".join(template.format(**c) for c in row["ctxs"]), "question": row["query"],
                "demos": demo, "answer": gold_ranking(row)}
    if task.category == "rag":
        demo = "\n\n".join(_QA_DEMO.format(**d, documents=passages(d), answer=d["answers"][0]) for d in demos)
        return {**row, "demos": demo + "\n\n" if shots > 0 else "", "context": passages(row),
                "answer": row["answers"]}
    if task.name == "json_kv":
        demos = "\n\n".join(_KV_DEMO.format(key=k, value=" " + v) for k, v in row["demos"][:shots])
        return {**row, "demos": demos + ("\n\n" if shots > 0 else "")}
    answer = row["answer"] if "answer" in row else row["outputs"]
    return {**row, "question": row.get("query", row.get("question", "")), "answer": answer}


_RANKED_PASSAGE = "[ID: {id}] Document (Title: {title}): {text}"
_RANKED_TEXT = "[ID: {id}] Document: {text}"


def gold_ranking(row: dict[str, Any]) -> str:
    """load_msmarco_rerank's answer: the passage ids by label, highest first (a stable sort: ties in file order)."""
    return " > ".join(c["id"] for c in sorted(row["ctxs"], key=lambda c: c["label"], reverse=True))


def passages(row: dict[str, Any]) -> str:
    """load_qa's passage text: "Document (Title: ...): ..." blocks, a blank line apart."""
    return "\n\n".join(_PASSAGE.format(**c) for c in row["ctxs"])


def demonstrations(task: Task, sample: dict[str, Any], demos: list[dict[str, Any]], key: str, shots: int,
                   shuffle: Any) -> list[dict[str, Any]]:
    """load_qa's `update` (load_msmarco_rerank's the same way): the demonstration rows (PopQA and re-ranking: without
    the sample's own key; re-ranking's `demos` come already without every drawn question's when the file holds more
    than twice as many rows as were drawn, see `rerank_pool`) shuffled with the seed sha256(str(sample[key])) % 2**31
    (`shuffle(size, seed)`: datasets' shuffle, as indices), duplicates of a key dropped (the first kept), the first
    `shots`."""
    import hashlib

    if shots == 0:
        return []
    own = task.name == "kilt_popqa" or task.category == "rerank"
    pool = [d for d in demos if d[key] != sample[key]] if own else list(demos)
    seed = int(hashlib.sha256(str(sample[key]).encode("utf-8")).hexdigest(), 16) % 2**31
    chosen, seen = [], set()
    for i in shuffle(len(pool), seed):
        if pool[i][key] not in seen:
            seen.add(pool[i][key])
            chosen.append(pool[i])
    return chosen[:shots]


def rerank_pool(demos: list[dict[str, Any]], drawn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """load_msmarco_rerank: with more than twice as many demonstration rows as drawn questions, the demonstrations
    without any drawn question's qid (then no per-question filter is needed)."""
    if len(demos) > 2 * len(drawn):
        qids = {d["qid"] for d in drawn}
        return [d for d in demos if d["qid"] not in qids]
    return demos


def popular_enough(row: dict[str, Any]) -> bool:
    """kilt_popqa_3's filter: math.log10(s_pop) < 3."""
    import math

    return math.log10(row["s_pop"]) < POPQA_THRESHOLD


def prompt(task: Task, sample: dict[str, Any]) -> str:
    """data.py's prompt_template filled as model_utils.tokenize fills it: `str.format(**sample)`."""
    return task.template.format(**sample)


def read(data: str | None, task: Task, length: int | None) -> tuple[list[dict[str, Any]], str]:
    """(rows, "relative/path sha256:...") of one task's file at `length` (None: its demonstrations' file); one line
    when it is missing or malformed."""
    import hashlib

    from tapecli.data.released import check_fields, parse_rows
    from tapecli.faults import reading

    root = _root(data)
    name = task.file(length) if length is not None else task.demo_file
    path = root / name
    if not path.is_file():
        at = f"at {length} tokens" if length is not None else "(its demonstrations)"
        raise TapeError(f"--data {data or HUB_ID}: no {name} for {task.name} {at}; {HINT} (or choose --lengths it "
                        "has)")
    with reading(path):
        raw = path.read_bytes()
    rows = parse_rows(path, raw)
    need: dict[str, Any] = ({"context": str, "question": str, "answer": str, "demos": list} if task.name == "json_kv"
                            else {"question": str, "answers": list, "ctxs": list} if task.category == "rag"
                            else {"qid": str, "query": str, "ctxs": list} if task.category == "rerank"
                            else {"context": str, "query": str, "type_needle_v": str})
    if task.name == "kilt_popqa":
        need["s_pop"] = (int, float)
    check_fields(rows, need, str(path))
    if task.category == "rerank":
        for k, row in enumerate(rows):
            if not row["ctxs"] or not all(isinstance(c, dict) and isinstance(c.get("id"), str)
                                          and isinstance(c.get("text"), str) and isinstance(c.get("label"), int)
                                          for c in row["ctxs"]):
                raise TapeError(f"{path}: row {k} needs non-empty 'ctxs' with 'id', 'text' and 'label'")
    if task.category == "rag":
        for k, row in enumerate(rows):
            if not row["answers"] or not all(isinstance(c, dict) and isinstance(c.get("title"), str)
                                             and isinstance(c.get("text"), str) for c in row["ctxs"]):
                raise TapeError(f"{path}: row {k} needs non-empty 'answers' and 'ctxs' with 'title' and 'text'")
    for k, row in enumerate(rows if task.category == "recall" else []):
        answer = row.get("answer", row.get("outputs")) if task.name != "json_kv" else row["answer"]
        if task.name != "json_kv" and (not isinstance(answer, list) or not answer
                                       or not all(isinstance(a, str) for a in answer)):
            raise TapeError(f"{path}: row {k} lacks the field 'outputs' (a non-empty list of str)")
    return rows, f"{name} sha256:{hashlib.sha256(raw).hexdigest()}"


def _root(data: str | None) -> Path:
    """The folder holding json_kv/ and ruler/: `data` itself or its data/ subfolder; None: the hub's, extracted."""
    if data is None:
        return _hub_root()
    root = Path(data).expanduser()
    if not root.is_dir():
        raise TapeError(f"--data {data}: no such folder; {HINT}")
    return root / "data" if (root / "data").is_dir() and not (root / "json_kv").is_dir() else root


def _hub_root() -> Path:
    import tarfile

    from huggingface_hub import hf_hub_download

    try:
        archive = Path(hf_hub_download(HUB_ID, "data.tar.gz", repo_type="dataset"))
    except Exception:  # noqa: BLE001 - offline, unreachable or refused: the same sentence
        raise TapeError(f"{HUB_ID} cannot be read from the Hugging Face hub (offline or unreachable); {HINT}"
                        ) from None
    target = archive.parent / "helmet-data"
    if not (target / "data").is_dir():
        partial = archive.parent / "helmet-data.partial"
        with tarfile.open(archive) as tar:
            tar.extractall(partial, filter="data")
        partial.rename(target)
    return target / "data"
