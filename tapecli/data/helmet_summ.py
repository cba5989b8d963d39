"""HELMET's summarisation category (princeton-nlp/HELMET data.py: `load_infbench` for `infbench_sum_eng`,
`load_multi_lexsum`; configs/summ.yaml and scripts/generate_configs.py): its source files, demonstrations, the
length filter and the cut of each document with a fixed tokenizer (`truncate_llama2`), and the draw of its rows.

HELMET reads both from the Hugging Face hub, not from its data.tar.gz; tape reads them from `--data` (the folder
HELMET's data/ was extracted to) or, for users with a network, from the hub:

- `infbench_sum_eng`: InfiniteBench's released `longbook_sum_eng.jsonl` (rows with `id`, `context`, `input` and
  `answer`, a list holding the reference summary): `--data`'s `infinitebench/longbook_sum_eng.jsonl`, else the hub
  dataset `xinrongzhang2022/InfiniteBench`'s file;
- `multi_lexsum`: Multi-LexSum (v20230518) as `datasets.load_dataset("allenai/multi_lexsum", name="v20230518")`
  gives it (rows with `id`, `sources`, a list of documents, and `summary/short`, a string or null): `--data`'s
  `multi_lexsum/train.jsonl` and `multi_lexsum/validation.jsonl` (`Dataset.to_json` of those two splits), else the hub.

`prepare(...)` does what the loaders do, in their order: InfiniteBench's demonstrations (`shots` other books' summaries,
the rows without the book's own id shuffled with seed 42, shown as "[story text]\\nSummary: ..."), Multi-LexSum's
(`shots` training summaries, "Summary: ..."; HELMET draws them with an unseeded shuffle, which no run reproduces, so
tape shuffles the training split with the seed sha256(row id) % 2**31, as HELMET's load_qa seeds its draw), then
`filter_length` (documents of at least 65,536 tokens of the truncation tokenizer), the draw (InfiniteBench: always
`shuffle(seed=42)`, Multi-LexSum: only when there are more rows than samples) and `truncate_llama2`: a document longer
than the length less 1,400 (InfiniteBench: 200 + its 1,200 tokens to generate) or less 700 (Multi-LexSum: 300 + 400)
tokens of that tokenizer is cut at the end of its token (length - budget - the suffix's tokens) and ends with
" ... [the rest of the text is omitted]". HELMET's truncation tokenizer is Llama 2's (`meta-llama/Llama-2-7b-hf`),
"so that every model sees the same amount of information"; `--truncation-tokenizer` names another. It is read from its
tokenizer.json with the `tokenizers` library (`tapecli.data.helmet_cut`, the cut long-document QA shares).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError

INFBENCH_HUB = "xinrongzhang2022/InfiniteBench"
LEXSUM_HUB = "allenai/multi_lexsum"
LEXSUM_CONFIG = "v20230518"
MIN_TOKENS = 65536  # filter_length(data, 65536, "context")
RESERVED = {"infbench_sum_eng": 200 + 1200, "multi_lexsum": 300 + 400}  # generate_configs.py's name_postfix

SYSTEM = "Summary:"  # the system template: eval.py puts it before a completion (no chat template)


def infbench_demos(rows: list[dict[str, Any]], shots: int, shuffle: Any) -> list[str]:
    """load_infbench's add_demos for each row: the other rows (by id) shuffled with seed 42, the first `shots`."""
    if shots == 0:
        return [""] * len(rows)
    out = []
    for row in rows:
        others = [r for r in rows if r["id"] != row["id"]]
        chosen = [others[i] for i in shuffle(len(others), 42)[:shots]]
        demo = "\n\n".join(f"[story text]\nSummary: {r['answer'][0].strip()}" for r in chosen)
        out.append(f"For example:\n\n{demo}\n\nNow, read the following story:\n\n")
    return out


def lexsum_demos(rows: list[dict[str, Any]], train: list[dict[str, Any]], shots: int, shuffle: Any) -> list[str]:
    """load_multi_lexsum's demo for each row: `shots` training summaries (the train split shuffled with the seed
    sha256(str(row id)) % 2**31; see the module docstring)."""
    if shots == 0:
        return [""] * len(rows)
    out = []
    for row in rows:
        seed = int(hashlib.sha256(str(row["id"]).encode("utf-8")).hexdigest(), 16) % 2**31
        chosen = [train[i] for i in shuffle(len(train), seed)[:shots]]
        out.append("Example summaries:\n\n" + "\n\n".join(f"Summary: {r['summary/short']}" for r in chosen)
                   + "\n\nNow, write a summary of the following legal documents.\n")
    return out


def prepare(data: str | None, task: str, lengths: list[int], samples: int, shots: int, measure: Any,
            shuffle: Any) -> tuple[dict[int, dict[int, dict[str, Any]]], list[str]]:
    """({length: {row index in the source: the sample}} for the drawn rows, the files read with their SHA-256): the
    loader's rows, demonstrations, length filter, draw and truncation at each length (see the module docstring)."""
    for length in lengths:
        if length <= RESERVED[task]:
            raise TapeError(f"--lengths: {task} keeps {RESERVED[task]} tokens for the instructions and the summary "
                            f"(HELMET's name_postfix), so each length must exceed {RESERVED[task]}, got {length}")
    if task == "infbench_sum_eng":
        rows, described = _infbench(data)
        demos = infbench_demos(rows, shots, shuffle)
        samples_ = [{"id": r["id"], "context": r["context"], "question": r["input"], "answer": r["answer"], "demo": d}
                    for r, d in zip(rows, demos, strict=True)]
    else:
        train, rows, described = _lexsum(data)
        train = [r for r in train if isinstance(r.get("summary/short"), str)]  # load_multi_lexsum's filter
        demos = lexsum_demos(rows, train, shots, shuffle)
        samples_ = [{"id": r["id"], "context": "\n\n".join(r["sources"]), "question": "", "answer": r["summary/short"],
                     "demo": d} for r, d in zip(rows, demos, strict=True)]
    kept = [i for i, s in enumerate(samples_) if isinstance(s["answer"], str | list)
            and measure.count(s["context"]) >= MIN_TOKENS]
    if not kept:
        raise TapeError(f"{described[-1].split(' sha256:')[0]}: no document of {task} has {MIN_TOKENS} tokens of the "
                        "truncation tokenizer (HELMET's filter_length keeps only those)")
    if task == "infbench_sum_eng" or len(kept) > samples:
        kept = [kept[i] for i in shuffle(len(kept), 42)[:min(samples, len(kept))]]
    return {n: {i: {**samples_[i], "context": measure.truncate(samples_[i]["context"], n - RESERVED[task])[0]}
                for i in sorted(kept)} for n in lengths}, described


def _infbench(data: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    name = "infinitebench/longbook_sum_eng.jsonl"
    if data is None:
        path = _hub_file(INFBENCH_HUB, "longbook_sum_eng.jsonl", name)
    else:
        path = _local(data, name, f"download longbook_sum_eng.jsonl from the hub dataset {INFBENCH_HUB}")
    rows, described = _rows(path, name)
    from tapecli.data.released import check_fields

    check_fields(rows, {"id": int, "context": str, "input": str, "answer": list}, str(path))
    for k, row in enumerate(rows):
        if not row["answer"] or not isinstance(row["answer"][0], str):
            raise TapeError(f"{path}: row {k} lacks its summary ('answer': a list holding a str)")
    return rows, [described]


def _lexsum(data: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    from tapecli.data.released import check_fields

    splits, described = {}, []
    for split in ("train", "validation"):
        name = f"multi_lexsum/{split}.jsonl"
        if data is None:
            rows, what = _lexsum_hub(split), f"{LEXSUM_HUB} {LEXSUM_CONFIG} {split}"
        else:
            path = _local(data, name, f"save the train and validation splits of {LEXSUM_HUB} ({LEXSUM_CONFIG}) with "
                                      "datasets' to_json as multi_lexsum/train.jsonl and multi_lexsum/validation.jsonl")
            rows, what = _rows(path, name)
        check_fields(rows, {"id": str, "sources": list}, what)
        if not any(isinstance(r.get("summary/short"), str) for r in rows):
            raise TapeError(f"{what}: no row has a 'summary/short' (a str)")
        splits[split] = rows
        described.append(what)
    return splits["train"], splits["validation"], described


def _lexsum_hub(split: str) -> list[dict[str, Any]]:
    try:
        import datasets

        return datasets.load_dataset(LEXSUM_HUB, name=LEXSUM_CONFIG, split=split).to_list()
    except Exception:  # noqa: BLE001 - offline, unreachable or refused: the same sentence
        raise TapeError(f"{LEXSUM_HUB} ({LEXSUM_CONFIG}) cannot be read from the Hugging Face hub (offline, "
                        "unreachable or refused); save its train and validation splits with datasets' to_json as "
                        "multi_lexsum/train.jsonl and multi_lexsum/validation.jsonl and pass their folder's parent "
                        "as --data") from None


def _hub_file(repo: str, filename: str, name: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo, filename, repo_type="dataset"))
    except Exception:  # noqa: BLE001 - offline, unreachable or refused: the same sentence
        raise TapeError(f"{repo} cannot be read from the Hugging Face hub (offline or unreachable); download "
                        f"{filename} from it and pass the folder holding {name} as --data") from None


def _local(data: str, name: str, hint: str) -> Path:
    root = Path(data).expanduser()
    for path in (root / name, root / "data" / name):
        if path.is_file():
            return path
    raise TapeError(f"--data {data}: no {name}; {hint}")


def _rows(path: Path, name: str) -> tuple[list[dict[str, Any]], str]:
    from tapecli.data.released import parse_rows
    from tapecli.faults import reading

    with reading(path):
        raw = path.read_bytes()
    return parse_rows(path, raw), f"{name} sha256:{hashlib.sha256(raw).hexdigest()}"
