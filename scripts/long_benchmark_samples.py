"""Tiny files in the released formats of OpenAI MRCR, LongBench v2, NoLiMa and HELMET, and a
training text in the style of the first two, for the CPU-sized results page (docs/results/long-benchmarks-cpu.md):
the real datasets are hundreds of MB of prompts of 8K tokens and more, beyond a tiny model and not on an offline
machine.

    python scripts/long_benchmark_samples.py OUT [--seed 0]

writes
  OUT/mrcr/{2,4,8}needle/{n}needle_0.parquet   MRCR's columns: prompt (JSON chat messages), answer,
                                               random_string_to_prepend, n_needles, desired_msg_index,
                                               total_messages, n_chars; 12 conversations per needle count, 3 to 14
                                               requests each
  OUT/longbench-v2/data.json                   LongBench v2's fields; 24 questions on which box holds which colour,
                                               easy (4 boxes) or hard (12), short, medium or long contexts
  OUT/nolima/needle_set.json                   NoLiMa's needle-set format: 3 experiments whose needle names a
                                               {CHAR} and a place, asked about by one-hop and two-hop questions
  OUT/nolima/books/rand_book_1.txt, _2.txt     shuffled-book stand-ins: 600 lines of the words below each
  OUT/helmet/data/json_kv/test_k50_dep6.jsonl  HELMET's json_kv fields (context: a JSON object of 50 UUID pairs,
                                               question, answer, demos, num_kvs); 8 rows (HELMET's 4K file)
  OUT/helmet/data/ruler/niah_multikey_2/validation_{1024,2048,4096}.jsonl, niah_multikey_3/..., niah_multivalue/...
                                               RULER's fields as HELMET reads them (context, query, outputs,
                                               type_needle_v, length): "One of the special magic numbers (uuids) for
                                               KEY is: VALUE." needles among others, about L bytes; 8 rows each
  OUT/helmet/data/kilt/{nq,triviaqa}-dev-multikilt_1000_k20_dep6.jsonl, hotpotqa-..._dep3.jsonl,
  popqa_test_1000_k20_dep6.jsonl and their demonstration files (..-train-multikilt_1000_k3_...; PopQA's k3 test file)
                                               HELMET's RAG fields (question, answers, ctxs of title + text, PopQA's
                                               s_pop): "who keeps the X box?" among 20 passages (3 in the
                                               demonstration files) naming each box's keeper; 8 rows each
  OUT/helmet/data/msmarco/test_reranking_data_k14_dep3.jsonl, test_reranking_data_k10_dep3.jsonl
                                               HELMET's re-ranking fields (qid, query, ctxs of id, text, label):
                                               "which box does NAME keep?" over 14 (10) passages, labelled 3 for the
                                               answer, 1 for the keeper's other passages, 0 otherwise; 8 rows each
  OUT/helmet/data/trec/, banking77/, clinc_oos/plus/, nlu_evaluation_data/
                                               the fields of the hub datasets HELMET's ICL reads (text and the
                                               integer labels coarse_label + fine_label, label, intent): "NAME wants
                                               to INTENT the X box", 6 intents; 120 train rows, 24 test (validation)
                                               rows (NLU: train only, HELMET splits it)
  OUT/helmet/data/narrativeqa/{train,test}.jsonl, infinitebench/longbook_{qa,choice}_eng.jsonl
                                               NarrativeQA's fields (document.text, question.text, answers[].text):
                                               test documents of 140,000, 150,000 and 20,000 bytes (train 2,000) with
                                               4 "The X box is kept by NAME." facts each, asked as "Who keeps the X
                                               box?"; InfiniteBench's (id, context, input, answer, options): 8 rows of
                                               70,000 bytes each with one such fact (seed + 2)
  OUT/helmet/data/infinitebench/longbook_sum_eng.jsonl, multi_lexsum/{train,validation}.jsonl
                                               InfiniteBench's (id, context, input, answer, options) and Multi-LexSum's
                                               (id, sources, summary/short) fields: 8 books and 8 cases of 70,000 bytes
                                               of the words below, each summarised in a sentence (8 training cases of
                                               one short source); drawn from random.Random(seed + 2)
  OUT/helmet/data/alce/asqa_eval_gtr_top2000.json, qampari_eval_gtr_top2000.json
                                               ALCE's fields (question, docs of title + text, ASQA's qa_pairs with
                                               short_answers and answer, QAMPARI's answers): "what colour is the X
                                               box?" and "which boxes does NAME keep?" over 20 passages; 8 each
  OUT/helmet/byte-tokenizer/                   a tokenizer of one token per byte (tokenizer.json), for
                                               --truncation-tokenizer where HELMET's Llama-2 tokenizer is not at hand
                                               (long-document QA and summarisation)
  OUT/corpus.txt                               other conversations and questions of the same kinds (seed + 1), as
                                               tape reads them, each followed by its answer: MRCR's transcript
                                               (`tapecli.data.mrcr.transcript`) + " " + answer, LongBench v2's 0-shot
                                               prompt + "\nThe correct answer is (X)."; what the tiny model is
                                               trained on
Everything is drawn from `random.Random(seed)`: the same seed writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

FORMATS = ["poem", "riddle", "story", "song", "note"]
TOPICS = ["tapirs", "rocks", "owls", "rain", "ships", "bread"]
WORDS = ["the", "a", "slow", "bright", "cold", "river", "stone", "wind", "light", "old", "green", "song", "night"]
COLOURS = ["red", "blue", "green", "black", "white", "yellow"]
ORDINALS = {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 5: "5th", 6: "6th", 7: "7th", 8: "8th"}


def reply(rng: random.Random, ask: str) -> str:
    return f"A {ask}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."


def mrcr_row(rng: random.Random, needles: int) -> dict:
    fmt, topic = rng.choice(FORMATS), rng.choice(TOPICS)
    target = f"{fmt} about {topic}"
    others = [f"{f} about {t}" for f in FORMATS for t in TOPICS if (f, t) != (fmt, topic)]
    asks = [target] * needles + [rng.choice(others) for _ in range(rng.randint(1, 6))]
    rng.shuffle(asks)
    messages, replies = [], []
    for ask in asks:
        text = reply(rng, ask)
        messages += [{"role": "user", "content": f"write a {ask}"}, {"role": "assistant", "content": text}]
        if ask == target:
            replies.append((len(messages) - 1, text))
    which = rng.randint(1, needles)
    prefix = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(10))
    messages.append({"role": "user", "content": f"Prepend {prefix} to the {ORDINALS[which]} (1 indexed) {target}. Do "
                                                "not include any other text in your response."})
    index, answer = replies[which - 1]
    return {"prompt": json.dumps(messages), "answer": prefix + answer, "random_string_to_prepend": prefix,
            "n_needles": needles, "desired_msg_index": index, "total_messages": len(messages),
            "n_chars": sum(len(m["content"]) for m in messages)}


def longbench_row(rng: random.Random, k: int) -> dict:
    boxes = 4 if k % 2 == 0 else 12
    colours = {b: rng.choice(COLOURS) for b in range(1, boxes + 1)}
    filler = (k // 2) % 3  # short, medium, long: 1, 4 or 12 filler sentences between two facts
    parts = []
    for b, c in colours.items():
        parts.append(f"Box {b} is {c}.")
        parts += [" ".join(rng.choice(WORDS) for _ in range(6)).capitalize() + "." for _ in range((1, 4, 12)[filler])]
    asked = rng.randint(1, boxes)
    choices = rng.sample([c for c in COLOURS if c != colours[asked]], 3) + [colours[asked]]
    rng.shuffle(choices)
    return {"_id": f"{k:04d}", "domain": "Single-Document QA", "sub_domain": "Boxes",
            "difficulty": "easy" if boxes == 4 else "hard", "length": ("short", "medium", "long")[filler],
            "question": f"What colour is box {asked}?",
            **{f"choice_{x}": c for x, c in zip("ABCD", choices, strict=True)},
            "answer": "ABCD"[choices.index(colours[asked])], "context": " ".join(parts)}


NOLIMA = [  # (place the needle names, city it is in (one hop), region (two hops))
    ("Semper Opera House", "Dresden", "Saxony"), ("Kiasma museum", "Helsinki", "Uusimaa"),
    ("Uffizi Gallery", "Florence", "Tuscany")]


def needle_set() -> list[dict]:
    return [{"id": f"{k + 1:04d}", "reasoning_type": "world_knowledge", "system_prompt": "You are a helpful assistant",
             "needle": "Actually, {CHAR} lives next to the {1}.",
             "questions": {"onehop": "Which character has been to {2}?",
                           "twohop": "Which character has been to the region of {3}?"},
             "character_set": ["Yuki", "Stuart", "Katie", "Diana", "Caleb"],
             "tests": {"T01": {"input_args": list(args)}}} for k, args in enumerate(NOLIMA)]


def uuid(rng: random.Random) -> str:
    return "-".join("".join(rng.choice("0123456789abcdef") for _ in range(n)) for n in (8, 4, 4, 4, 12))


def json_kv_row(rng: random.Random) -> dict:
    pairs = [(uuid(rng), uuid(rng)) for _ in range(52)]
    kvs, demos = dict(pairs[:50]), [list(p) for p in pairs[50:]]
    key = rng.choice(list(kvs))
    return {"context": "JSON data:\n" + json.dumps(kvs, indent=1), "question": key, "answer": kvs[key],
            "demos": demos, "num_kvs": 50}


def niah_row(rng: random.Random, kind: str, length: int) -> dict:
    """RULER's multi-key (2: words -> numbers, 3: uuids -> uuids) or multi-value needles, about `length` bytes."""
    noun = "uuids" if kind == "niah_multikey_3" else "numbers"

    def value() -> str:
        return uuid(rng) if kind == "niah_multikey_3" else str(rng.randint(1_000_000, 9_999_999))

    def key(k: int) -> str:
        return uuid(rng) if kind == "niah_multikey_3" else f"{rng.choice(WORDS)}-{rng.choice(COLOURS)}-{k}"

    query = key(0)
    wanted = [value() for _ in range(4 if kind == "niah_multivalue" else 1)]
    lines = [f"One of the special magic {noun} for {query} is: {v}." for v in wanted]
    while sum(len(x) + 1 for x in lines) < length - 420:
        lines.append(f"One of the special magic {noun} for {key(len(lines))} is: {value()}.")
    rng.shuffle(lines)
    return {"index": 0, "context": "\n".join(lines), "query": query, "outputs": wanted, "type_needle_v": noun,
            "length": length}


NAMES = ["Ada", "Bruno", "Chen", "Dalia", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun"]


def kilt_row(rng: random.Random, k: int, passages: int) -> dict:
    boxes = [f"{rng.choice(WORDS)} {rng.choice(COLOURS)} box {n}" for n in range(passages)]
    keepers = [rng.choice(NAMES) for _ in boxes]
    asked = rng.randrange(passages)
    ctxs = [{"id": str(n), "title": box.title(), "text": f"The {box} is kept by {keeper}.", "score": 1.0,
             "has_answer": n == asked} for n, (box, keeper) in enumerate(zip(boxes, keepers, strict=True))]
    rng.shuffle(ctxs)
    return {"id": f"q{k:04d}", "question": f"who keeps the {boxes[asked]}?", "answers": [keepers[asked]],
            "ctxs": ctxs, "s_pop": 10 ** rng.randint(1, 2)}


def rerank_row(rng: random.Random, k: int, passages: int) -> dict:
    keeper = rng.choice(NAMES)
    ctxs = []
    for n in range(passages):
        name = keeper if n < 3 else rng.choice([x for x in NAMES if x != keeper])
        ctxs.append({"id": str(n + 1), "text": f"{name} keeps the {rng.choice(WORDS)} {rng.choice(COLOURS)} box.",
                     "label": 3 if n == 0 else 1 if n < 3 else 0})
    rng.shuffle(ctxs)
    return {"qid": f"{5000 + k}", "query": f"which box does {keeper} keep?", "ctxs": ctxs}


INTENTS = ["keep", "find", "lose", "paint", "sell", "open"]


def intent_row(rng: random.Random, label: int, fields: tuple[str, ...]) -> dict:
    """An utterance asking to do one of six things with a box; the label (the intent's index) in `fields`."""
    text = f"{rng.choice(NAMES)} wants to {INTENTS[label]} the {rng.choice(WORDS)} {rng.choice(COLOURS)} box"
    return {"text": text, **{f: label for f in fields}}


def book(rng: random.Random, size: int, facts: list[str]) -> str:
    """About `size` bytes of sentences of WORDS with the facts spread through them."""
    lines, total = [], 0
    while total < size:
        lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + ".")
        total += len(lines[-1]) + 1
    for k, fact in enumerate(facts):
        lines.insert((k + 1) * len(lines) // (len(facts) + 1), fact)
    return " ".join(lines)


def icl_and_longqa(helmet: Path, rng: random.Random) -> None:
    """Local copies, in the hub datasets' fields, of what HELMET's ICL and long-QA categories read, and a byte-level
    tokenizer (one token per byte) to stand in for the Llama-2 tokenizer HELMET measures documents with."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    for folder, splits, fields in [("trec", ("train", "test"), ("coarse_label", "fine_label")),
                                   ("banking77", ("train", "test"), ("label",)),
                                   ("clinc_oos/plus", ("train", "validation"), ("intent",)),
                                   ("nlu_evaluation_data", ("train",), ("label",))]:
        (helmet / folder).mkdir(parents=True, exist_ok=True)
        for split in splits:
            n = 120 if split == "train" else 24
            rows = [intent_row(rng, rng.randrange(len(INTENTS)), fields) for _ in range(n)]
            (helmet / folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                            encoding="utf-8")
    (helmet / "narrativeqa").mkdir(parents=True, exist_ok=True)
    for split, sizes in (("test", (140_000, 150_000, 20_000)), ("train", (2_000, 2_000, 2_000))):
        rows = []
        for d, size in enumerate(sizes):
            keepers = [(f"{rng.choice(WORDS)} {rng.choice(COLOURS)} box {q}", rng.choice(NAMES)) for q in range(4)]
            text = book(rng, size, [f"The {box} is kept by {name}." for box, name in keepers])
            rows += [{"document": {"id": f"{split}-{d}", "kind": "gutenberg", "text": text},
                      "question": {"text": f"Who keeps the {box}?"},
                      "answers": [{"text": name}, {"text": name.upper()}]} for box, name in keepers]
        (helmet / "narrativeqa" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                               encoding="utf-8")
    (helmet / "infinitebench").mkdir(parents=True, exist_ok=True)
    for split in ("longbook_qa_eng", "longbook_choice_eng"):
        rows = []
        for k in range(8):
            box, name = f"{rng.choice(WORDS)} {rng.choice(COLOURS)} box {k}", rng.choice(NAMES)
            options = [name, *rng.sample([x for x in NAMES if x != name], 3)]
            rng.shuffle(options)
            rows.append({"id": k, "context": book(rng, 70_000, [f"The {box} is kept by {name}."]),
                         "input": f"Who keeps the {box}?", "answer": [name],
                         "options": options if split == "longbook_choice_eng" else []})
        (helmet / "infinitebench" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                                 encoding="utf-8")
    # The alphabet comes as a set (its order changes from run to run): sorted, the same ids every time.
    byte_level = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, []))
    byte_level.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    PreTrainedTokenizerFast(tokenizer_object=byte_level).save_pretrained(str(helmet.parent / "byte-tokenizer"))


def helmet_summ_cite(rng: random.Random, helmet: Path) -> None:
    """HELMET's summarisation and citation files (see the docstring)."""

    def text(size: int) -> str:
        words, total = [], 0  # total: len(" ".join(words)) + 1
        while total < size:
            words.append(rng.choice(WORDS))
            total += len(words[-1]) + 1
        return " ".join(words) + "."

    def summary(k: int) -> str:
        return f"The {rng.choice(WORDS)} {rng.choice(COLOURS)} box {k} is kept by the {rng.choice(WORDS)} river."

    for folder in ("infinitebench", "multi_lexsum", "alce"):
        (helmet / folder).mkdir(parents=True, exist_ok=True)
    books = [{"id": k, "context": text(70000), "input": "", "answer": [summary(k)], "options": []} for k in range(8)]
    train = [{"id": f"train-{k}", "sources": [text(400)], "summary/short": summary(k)} for k in range(8)]
    cases = [{"id": f"case-{k}", "sources": [text(35000), text(35000)], "summary/short": summary(k)} for k in range(8)]
    for path, rows in (("infinitebench/longbook_sum_eng.jsonl", books), ("multi_lexsum/train.jsonl", train),
                       ("multi_lexsum/validation.jsonl", cases)):
        (helmet / path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    asqa, qampari = [], []
    for k in range(8):
        boxes = [(rng.choice(WORDS), rng.choice(COLOURS), rng.choice(NAMES)) for _ in range(20)]
        docs = [{"id": str(j), "title": f"The {w} box", "text": f"The {w} box is {c} and kept by {n}."}
                for j, (w, c, n) in enumerate(boxes)]
        word, colour, name = boxes[rng.randrange(20)]
        asqa.append({"question": f"What colour is the {word} box?", "answer": f"The {word} box is {colour}.",
                     "qa_pairs": [{"question": f"What colour is the {word} box?", "short_answers": [colour]}],
                     "docs": docs, "sample_id": str(k)})
        qampari.append({"id": str(k), "question": f"Which boxes does {name} keep?", "docs": docs,
                        "answers": [[f"the {w} box", f"{w} box"] for w, _, n in boxes if n == name]})
    (helmet / "alce" / "asqa_eval_gtr_top2000.json").write_text(json.dumps(asqa), encoding="utf-8")
    (helmet / "alce" / "qampari_eval_gtr_top2000.json").write_text(json.dumps(qampari), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tapecli.data import longbench_v2 as lb
    from tapecli.data import mrcr

    out, rng = Path(args.out), random.Random(args.seed)
    for needles in (2, 4, 8):
        folder = out / "mrcr" / f"{needles}needle"
        folder.mkdir(parents=True, exist_ok=True)
        rows = [mrcr_row(rng, needles) for _ in range(12)]
        pq.write_table(pa.Table.from_pylist(rows), folder / f"{needles}needle_0.parquet")
    (out / "longbench-v2").mkdir(parents=True, exist_ok=True)
    rows = [longbench_row(rng, k) for k in range(24)]
    (out / "longbench-v2" / "data.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    (out / "nolima" / "books").mkdir(parents=True, exist_ok=True)
    (out / "nolima" / "needle_set.json").write_text(json.dumps(needle_set(), indent=1), encoding="utf-8")
    for k in (1, 2):
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(600)]
        (out / "nolima" / "books" / f"rand_book_{k}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    helmet = out / "helmet" / "data"
    (helmet / "json_kv").mkdir(parents=True, exist_ok=True)
    (helmet / "json_kv" / "test_k50_dep6.jsonl").write_text(
        "".join(json.dumps(json_kv_row(rng)) + "\n" for _ in range(8)), encoding="utf-8")
    for kind in ("niah_multikey_2", "niah_multikey_3", "niah_multivalue"):
        (helmet / "ruler" / kind).mkdir(parents=True, exist_ok=True)
        for length in (1024, 2048, 4096):
            rows = [{**niah_row(rng, kind, length), "index": k} for k in range(8)]
            (helmet / "ruler" / kind / f"validation_{length}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (helmet / "kilt").mkdir(parents=True, exist_ok=True)
    for test, demo in [("nq-dev-multikilt_1000_k20_dep6", "nq-train-multikilt_1000_k3_dep6"),
                       ("triviaqa-dev-multikilt_1000_k20_dep6", "triviaqa-train-multikilt_1000_k3_dep6"),
                       ("hotpotqa-dev-multikilt_1000_k20_dep3", "hotpotqa-train-multikilt_1000_k3_dep3"),
                       ("popqa_test_1000_k20_dep6", "popqa_test_1000_k3_dep6")]:
        for name, passages in ((test, 20), (demo, 3)):
            rows = [kilt_row(rng, k, passages) for k in range(8)]
            (helmet / "kilt" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                           encoding="utf-8")
    (helmet / "msmarco").mkdir(parents=True, exist_ok=True)
    for name, passages, first in (("test_reranking_data_k14_dep3", 14, 0), ("test_reranking_data_k10_dep3", 10, 100)):
        rows = [rerank_row(rng, first + k, passages) for k in range(8)]
        (helmet / "msmarco" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                                          encoding="utf-8")
    icl_and_longqa(helmet, random.Random(args.seed + 2))
    helmet_summ_cite(random.Random(args.seed + 2), helmet)
    train = random.Random(args.seed + 1)
    texts = []
    for _ in range(400):
        row = mrcr_row(train, train.choice((2, 4, 8)))
        texts.append(f"{mrcr.transcript(mrcr.messages(row))} {row['answer']}")
    for k in range(400):
        row = longbench_row(train, k)
        texts.append(f"{lb.fill(lb.ZERO_SHOT, row)}\nThe correct answer is ({row['answer']}).")
    train.shuffle(texts)
    (out / "corpus.txt").write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    print(f"wrote {out}/mrcr (36 conversations), {out}/longbench-v2/data.json (24 questions), {out}/nolima (3 "
          f"experiments, 2 books), {out}/helmet/data (json_kv, 3 RULER tasks x 3 lengths, 4 RAG tasks and "
          f"re-ranking, 8 rows each; ICL's 4 and long QA's 2 datasets; summarisation and citations, 8 each), "
          f"{out}/helmet/byte-tokenizer and {out}/corpus.txt ({sum(map(len, texts)):,} characters)")


if __name__ == "__main__":
    main()
