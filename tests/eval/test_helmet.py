"""`tape eval helmet`: HELMET's metrics, prompts, sample draw and truncation (written out here from
princeton-nlp/HELMET's utils.py, data.py and model_utils.py) on hand-made data, the scores with a stand-in model
worked out by hand, and the real command on a tape run and a Hugging Face Llama reading tiny files in HELMET's
released layout."""

from __future__ import annotations

import json
import re
import string

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import helmet as data
from tapecli.eval import helmet, helmet_metric
from tapecli.eval.protocol import run

runner = CliRunner()


# ---- HELMET utils.py and data.py, as published (the rouge part of calculate_metrics left out: not reported here)

def official_normalize_answer(s):
    def remove_articles(text):
        return re.sub(r'\b(a|an|the)\b', ' ', text)

    def white_space_fix(text):
        return ' '.join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return ''.join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def official_substring_exact_match_score(prediciton, ground_truth):
    return official_normalize_answer(ground_truth) in official_normalize_answer(prediciton)


def official_drqa_metric_max_over_ground_truths(metric_fn, prediction, ground_truths):
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths]
    elif isinstance(ground_truths[0], list):
        ground_truths = [ground_truth for ground_truths_list in ground_truths for ground_truth in ground_truths_list]
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


def official_parse_output(output, prefix="Answer:"):
    def lstrip_string(s, sub):
        return re.sub(f'^{re.escape(sub)}', '', s, flags=re.IGNORECASE)
    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pat in patterns:
        matches = pat.search(output)
        if matches is not None:
            return lstrip_string(matches[1].strip(), prefix).strip()
    return None


def official_sub_em(prediction, answers):
    """calculate_metrics(...)["substring_exact_match"]."""
    return official_drqa_metric_max_over_ground_truths(official_substring_exact_match_score, prediction, answers)


def official_json_kv_post_process(prediction, answer):
    """load_json_kv's post_process, its substring_exact_match."""
    mets = {"substring_exact_match": official_sub_em(prediction, answer)}
    parsed_pred = official_parse_output(prediction, "corresponding value:")
    new_mets = {"substring_exact_match": official_sub_em(parsed_pred, answer)}
    mets = {k: max(v, new_mets[k]) for k, v in mets.items()}
    return mets["substring_exact_match"]


def official_default_post_process(prediction, answer):
    """default_post_process (RAG), its substring_exact_match."""
    mets = {"substring_exact_match": official_sub_em(prediction, answer)}
    parsed_pred = official_parse_output(prediction)
    if parsed_pred is not None:
        new_mets = {"substring_exact_match": official_sub_em(parsed_pred, answer)}
        mets = {k: max(v, new_mets[k]) for k, v in mets.items()}
    return mets["substring_exact_match"]


def official_ruler_post_process(prediction, answer):
    recall = sum([a.lower() in prediction.lower() for a in answer]) / len(answer)
    return recall


# data.py's templates, as published
KV_PROMPT = ("{context}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"
             "{demos}Key: {question}" + "\n" + "Corresponding value:")
KV_DEMO = "Key: {key}\nCorresponding value:{value}"
MK_PROMPT = ("A special magic {type_needle_v} is hidden within the following text. Make sure to memorize it. I will "
             "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat is the special magic {type_needle_v} for "
             "{query} mentioned in the provided text?" + "\n"
             + "The special magic {type_needle_v} for {query} mentioned in the provided text is")
MV_PROMPT = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I "
             "will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
             "{type_needle_v} for {query} mentioned in the provided text?" + "\n"
             + "The special magic {type_needle_v} for {query} mentioned in the provided text are")

PREDICTIONS = ["", "The answer is Paris.", "paris", "  The  Eiffel-Tower!  ", "an apple a day", "Answer: Berlin\nParis",
               "Corresponding value: 1a2b-3c\nmore", "corresponding VALUE:  x-y ", "\n\nsecond line", "A", "the"]
ANSWERS = ["Paris", ["Berlin", "paris"], [["Rome"], ["the Eiffel tower", "Eiffel"]], "", "a", "1a2b-3c", ["x y"],
           "The", ["!"]]


@pytest.mark.parametrize("answer", ANSWERS)
def test_substring_exact_match_and_json_kv_are_helmets(answer):
    """Empty answers (normalised to "", found in anything), articles and punctuation only, lists of lists."""
    for prediction in PREDICTIONS:
        assert helmet_metric.substring_exact_match(prediction, answer) == official_sub_em(prediction, answer)
        assert helmet_metric.sub_em_score(prediction, answer, "corresponding value:") == \
            official_json_kv_post_process(prediction, answer)
        assert helmet_metric.sub_em_score(prediction, answer, "Answer:") == official_default_post_process(prediction,
                                                                                                          answer)
        assert helmet_metric.parse_output(prediction, "corresponding value:") == official_parse_output(
            prediction, "corresponding value:")
        assert helmet_metric.normalize_answer(prediction) == official_normalize_answer(prediction)


def test_metrics_pinned():
    outputs = ("Corresponding value: 1a2b-3c", " 1a2b3c", "1a2b", "")
    assert [helmet_metric.sub_em_score(p, "1a2b-3c", "corresponding value:") for p in outputs] == [1.0, 1.0, 0.0,
                                                                                                  0.0]  # no "-"
    assert helmet_metric.sub_em_score("Paris\nAnswer: Berlin", ["Berlin"], "Answer:") == 1.0  # the parsed one
    assert helmet_metric.substring_exact_match("anything", "the") is True  # an answer that normalises to ""
    assert helmet_metric.parse_output("x\nAnswer: y", "Answer:") == "y"


@pytest.mark.parametrize(("prediction", "answers"), [
    ("The numbers are 123, 456.", ["123", "456", "789"]), ("", ["1"]), ("ABC-def", ["abc-DEF"]),
    ("12", ["1", "1"]),  # a repeated answer counts twice (a tie of two equal values)
    ("nothing", ["1", "2", "3", "4"]), ("1 2 3 4", ["1", "2", "3", "4"]), ("anything", [""]),
])
def test_ruler_recall_is_helmets(prediction, answers):
    assert helmet_metric.ruler_recall(prediction, answers) == official_ruler_post_process(prediction, answers)


def kv_row(k: int, value: str = "") -> dict:
    return {"context": f'JSON data:\n{{"key-{k}": "{value or f"value-{k}"}", "{{x}}": "y"}}', "question": f"key-{k}",
            "answer": value or f"value-{k}", "demos": [["dk1", "dv1"], ["dk2", "dv2"], ["dk3", "dv3"]], "num_kvs": 2}


def niah_row(k: int, context: str = "", outputs: list | None = None) -> dict:
    return {"index": k, "context": context or f"One of the special magic numbers for word-{k} is: {1000 + k}.",
            "query": f"word-{k}", "outputs": outputs or [str(1000 + k)], "type_needle_v": "numbers", "length": 1024}


@pytest.mark.parametrize("shots", [0, 2])
def test_the_prompts_are_helmets(shots):
    """data.py maps the row (json_kv: its first `shots` demos; RULER: query -> question, outputs -> answer) and fills
    prompt_template with str.format(**sample): braces inside the context are left alone."""
    row = kv_row(1)
    demos = "\n\n".join([KV_DEMO.format(key=key, value=" " + value) for key, value in row["demos"][:shots]]) + (
        "\n\n" if shots > 0 else "")
    sample = data.fields(data.TASKS["json_kv"], row, shots)
    assert data.prompt(data.TASKS["json_kv"], sample) == KV_PROMPT.format(**{**row, "demos": demos})
    assert '"{x}": "y"' in data.prompt(data.TASKS["json_kv"], sample)
    row = niah_row(3)
    for name, template in [("ruler_niah_mk_2", MK_PROMPT), ("ruler_niah_mk_3", MK_PROMPT),
                           ("ruler_niah_mv", MV_PROMPT)]:
        sample = data.fields(data.TASKS[name], row, shots)
        assert data.prompt(data.TASKS[name], sample) == template.format(**row)
        assert sample["answer"] == ["1003"] and sample["question"] == "word-3"
    assert data.fields(data.TASKS["ruler_niah_mv"], {**row, "answer": ["a"]}, 0)["answer"] == ["a"]


def test_the_files_and_generation_lengths_are_helmets():
    assert [data.TASKS["json_kv"].file(n) for n in (4096, 8192, 131072)] == [
        "json_kv/test_k50_dep6.jsonl", "json_kv/test_k105_dep6.jsonl", "json_kv/test_k1800_dep6.jsonl"]
    assert data.TASKS["ruler_niah_mk_3"].file(65536) == "ruler/niah_multikey_3/validation_65536.jsonl"
    assert {n: t.generation_max_length for n, t in data.TASKS.items() if t.category in ("recall", "rag", "rerank")} == {
        "json_kv": 100, "ruler_niah_mk_2": 50, "ruler_niah_mk_3": 100, "ruler_niah_mv": 50,  # configs/recall.yaml
        "kilt_nq": 20, "kilt_triviaqa": 20, "kilt_hotpotqa": 20, "kilt_popqa": 20,  # configs/rag.yaml
        "msmarco_rerank_psg": 200}  # configs/rerank.yaml
    rerank = data.TASKS["msmarco_rerank_psg"]
    assert [rerank.file(n) for n in (4096, 131072)] == ["msmarco/test_reranking_data_k14_dep3.jsonl",
                                                        "msmarco/test_reranking_data_k1000_dep3.jsonl"]
    assert rerank.demo_file == "msmarco/test_reranking_data_k10_dep3.jsonl" and rerank.metric == "NDCG@10"
    assert [data.TASKS[t].file(131072) for t in ("kilt_nq", "kilt_triviaqa", "kilt_hotpotqa", "kilt_popqa")] == [
        "kilt/nq-dev-multikilt_1000_k1000_dep6.jsonl", "kilt/triviaqa-dev-multikilt_1000_k1000_dep6.jsonl",
        "kilt/hotpotqa-dev-multikilt_1000_k1000_dep3.jsonl", "kilt/popqa_test_1000_k1000_dep6.jsonl"]
    assert data.TASKS["kilt_nq"].file(8192) == "kilt/nq-dev-multikilt_1000_k50_dep6.jsonl"
    assert [data.TASKS[t].demo_file for t in ("kilt_nq", "kilt_triviaqa", "kilt_hotpotqa", "kilt_popqa")] == [
        "kilt/nq-train-multikilt_1000_k3_dep6.jsonl", "kilt/triviaqa-train-multikilt_1000_k3_dep6.jsonl",
        "kilt/hotpotqa-train-multikilt_1000_k3_dep3.jsonl", "kilt/popqa_test_1000_k3_dep6.jsonl"]
    assert all(data.TASKS[t].stop_new_line == (data.TASKS[t].category in ("rag", "rerank"))
               for t in [*data.CATEGORIES["recall"], *data.CATEGORIES["rag"], *data.CATEGORIES["rerank"]])


def test_the_draw_is_helmets_shuffle():
    """data.shuffle(seed=42).select(range(min(N, len))): datasets' shuffle is numpy's default_rng(42).permutation."""
    import numpy as np

    for size, n in [(10, 3), (100, 100), (5, 100), (1000, 100)]:
        assert helmet.draw(size, n) == sorted(np.random.default_rng(42).permutation(size)[:min(n, size)].tolist())
    assert helmet.draw(10, 3) == [0, 5, 6]


def test_truncation_cuts_the_context_as_helmets_tokenize():
    """model_utils.tokenize: over budget = length - generation_max_length, the context loses as many of its last
    tokens as the prompt is over (the fast-tokenizer path, context[:offset of token -t]; bytes here), once."""
    from tapecli.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    task = data.TASKS["ruler_niah_mk_2"]
    sample = data.fields(task, niah_row(0, context="abcdefghij " * 30), 0)
    full = tok.encode(data.prompt(task, sample), add_special_tokens=True)
    ids, cut = helmet.tokenize(tok, task, sample, len(full) + task.generation_max_length)
    assert ids == full and not cut
    length = len(full) + task.generation_max_length - 37
    ids, cut = helmet.tokenize(tok, task, sample, length)
    truncate_length = len(full) - (length - task.generation_max_length)
    official = {**sample, "context": sample["context"][:len(sample["context"]) - truncate_length]}
    assert cut and truncate_length == 37 and ids == tok.encode(data.prompt(task, official), add_special_tokens=True)
    assert len(ids) == length - task.generation_max_length


def write_data(root, lengths=(1024, 2048), n: int = 4, filler: int = 0) -> None:
    (root / "json_kv").mkdir(parents=True, exist_ok=True)
    (root / "json_kv" / "test_k50_dep6.jsonl").write_text("".join(json.dumps(kv_row(k)) + "\n" for k in range(n)))
    for kind in ("niah_multikey_2", "niah_multikey_3", "niah_multivalue"):
        (root / "ruler" / kind).mkdir(parents=True, exist_ok=True)
        for length in lengths:
            rows = [niah_row(k, outputs=[str(1000 + k), str(2000 + k)] if kind == "niah_multivalue" else None,
                             context=f"One of the special magic numbers for word-{k} is: {1000 + k}.{' x' * filler}")
                    for k in range(n)]
            (root / "ruler" / kind / f"validation_{length}.jsonl").write_text("".join(json.dumps(r) + "\n"
                                                                                       for r in rows))


def test_scores_with_a_stand_in_model(tmp_path, monkeypatch, trained):
    """The stand-in answers with the first number or value its prompt asks about... read from the prompt: right on
    even rows, wrong on odd ones; multi-value rows get one of their two values (recall 0.5)."""
    from tapecli.data.tokenizer import ByteTokenizer

    write_data(tmp_path / "data", lengths=(1024,), n=4)
    tok = ByteTokenizer()
    seen = []

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, **_):
        outs = []
        for p in prompts:
            text = tok.decode(p)
            seen.append(max_new_tokens)
            k = int(re.findall(r"(?:word|key)-(\d+)", text)[-1])
            reply = (f" value-{k}" if "Corresponding value:" in text else f" {1000 + k}.") if k % 2 == 0 else " no"
            outs.append((tok.encode(reply) + stop_tokens + [pad_id] * max_new_tokens)[:max_new_tokens])
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    evaluation = helmet.Helmet(str(tmp_path / "data"), ["recall"], [1024], samples=4)
    with pytest.raises(Exception, match="json_kv has files for 4096"):
        run(evaluation, [str(trained())], tmp_path / "x", device="cpu", show_progress=False)
    evaluation = helmet.Helmet(str(tmp_path / "data"), ["ruler_niah_mk_2", "ruler_niah_mv", "json_kv"], [1024, 4096],
                               samples=3)
    with pytest.raises(Exception, match="no ruler/niah_multikey_2/validation_4096.jsonl"):
        run(evaluation, [str(trained())], tmp_path / "x", device="cpu", show_progress=False)
    write_data(tmp_path / "data", lengths=(4096,), n=4)
    evaluation = helmet.Helmet(str(tmp_path / "data"), ["ruler_niah_mk_2", "ruler_niah_mv", "json_kv"], [4096],
                               samples=3)
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=2, show_progress=False)
    m = report.results["helmet"]["models"][0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    chosen = helmet.draw(4, 3)
    assert chosen == [1, 2, 3] and [r["row"] for r in rows] == chosen * 3
    right = [k % 2 == 0 for k in chosen]  # 0, 1, 0
    assert m["scores"] == {"ruler_niah_mk_2": {"4096": round(100 * sum(right) / 3, 2)},
                           "ruler_niah_mv": {"4096": round(100 * sum(0.5 * x for x in right) / 3, 2)},
                           "json_kv": {"4096": round(100 * sum(right) / 3, 2)}}
    assert m["scores"]["ruler_niah_mk_2"]["4096"] == 33.33
    assert m["categories"] == {"recall": {"4096": round((33.33 + 16.67 + 33.33) / 3, 2)}}
    assert seen == [50, 50, 50, 50, 50, 50, 100, 100, 100] and m["truncated"] == 0
    assert all(r["ruler_recall" if r["task"] != "json_kv" else "substring_exact_match"] in (0, 0.5, 1) for r in rows)
    assert (tmp_path / "out" / "helmet.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(Exception, match="unknown task 'citations'; choose recall, rag, rerank, icl, longqa, summ, "
                                        "cite"):
        run(helmet.Helmet(str(tmp_path / "data"), ["citations"], [4096]), [str(trained())], tmp_path / "y",
            device="cpu")


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """Two real models answer real prompts (the tape run's cut to 400 - 50 tokens); a rerun after a lost last row
    redoes only that row; bad input is one line before anything is written; without --data (offline) one sentence
    says what to pass."""
    write_data(tmp_path / "HELMET" / "data", lengths=(400,), n=3, filler=300)
    out = tmp_path / "out"
    args = ["eval", "helmet", "--model", str(trained()), "--model", str(tiny_hf_llama), "--data",
            str(tmp_path / "HELMET"), "--tasks", "ruler_niah_mk_2,ruler_niah_mv", "--lengths", "400", "--device",
            "cpu", "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| task / length | 400 |" in result.output and "| recall |" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {r["model"] for r in rows} == {0, 1}
    tape_rows = [r for r in rows if r["model"] == 0]
    assert all(r["truncated"] and r["input_tokens"] == 350 for r in tape_rows if r["task"] == "ruler_niah_mk_2")
    results = json.loads((out / "results.json").read_text())
    assert [m["kind"] for m in results["models"]] == ["tape", "hf"]
    assert results["settings"]["data"]["files"][0].startswith("ruler/niah_multikey_2/validation_400.jsonl sha256:")
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().splitlines() == lines
    bad = tmp_path / "bad" / "ruler" / "niah_multikey_2"
    bad.mkdir(parents=True)
    (bad / "validation_400.jsonl").write_text(json.dumps({**niah_row(0), "outputs": []}) + "\n")
    model = str(trained())
    for n, (extra, fragment) in enumerate([
            (["--data", str(tmp_path / "bad"), "--tasks", "ruler_niah_mk_2", "--lengths", "400"],
             "row 0 lacks the field 'outputs' (a non-empty list of str)"),
            (["--data", str(tmp_path / "none")], "no such folder; download data.tar.gz"),
            (["--data", str(tmp_path / "HELMET"), "--tasks", "icl,summary"], "unknown task 'summary'"),
            ([], "princeton-nlp/HELMET cannot be read from the Hugging Face hub (offline or unreachable); "
                 "download data.tar.gz")]):
        where = tmp_path / f"x{n}"
        one_line_error(runner.invoke(app, ["eval", "helmet", "--model", model, "--device", "cpu", "--out",
                                           str(where), *extra]), 2, fragment)
        assert not where.exists()


def test_the_results_pages_sample_files_are_helmets_layout(tmp_path):
    """scripts/long_benchmark_samples.py (docs/results/long-benchmarks-cpu.md) writes HELMET's files where `tape eval
    helmet` looks for them, each value once in its context."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "long_benchmark_samples.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, capture_output=True)
    evaluation = helmet.Helmet(str(tmp_path / "helmet"), ["ruler_niah_mk_2", "ruler_niah_mk_3", "ruler_niah_mv"],
                               [1024, 2048, 4096], samples=8)
    evaluation.check([])
    assert len(evaluation.read_files) == 9 and all(len(rows) == 8 for rows in evaluation.rows.values())
    for (task, _), rows in evaluation.rows.items():
        for row in rows:
            assert len(row["outputs"]) == (4 if task == "ruler_niah_mv" else 1)
            assert all(row["context"].count(f"for {row['query']} is: {v}.") == 1 for v in row["outputs"])
    rag = helmet.Helmet(str(tmp_path / "helmet"), ["rag"], [4096], samples=8)
    rag.check([])
    assert len(rag.read_files) == 8 and all(len(c) == 8 for c in rag.chosen.values())
    for rows in [*rag.rows.values(), *rag.demos.values()]:
        for row in rows:  # the asked box's passage names its keeper
            box = row["question"].removeprefix("who keeps the ").removesuffix("?")
            assert [c["text"] for c in row["ctxs"] if c["has_answer"]] == [f"The {box} is kept by {row['answers'][0]}."]
    rerank = helmet.Helmet(str(tmp_path / "helmet"), ["rerank"], [4096], samples=8)
    rerank.check([])
    for row in rerank.rows["msmarco_rerank_psg", 4096]:
        keeper = row["query"].removeprefix("which box does ").removesuffix(" keep?")
        assert sorted(c["label"] for c in row["ctxs"]) == [0] * 11 + [1, 1, 3]
        assert all(c["text"].startswith(keeper) == (c["label"] > 0) for c in row["ctxs"])
    kv, _ = data.read(str(tmp_path / "helmet" / "data"), data.TASKS["json_kv"], 4096)
    assert len(kv) == 8 and all(json.loads(r["context"].removeprefix("JSON data:\n"))[r["question"]] == r["answer"]
                                for r in kv)


# ---- RAG: data.py's load_qa, as published (the datasets calls included), and eval.py's random.seed

QA_USER = ("Use the given documents to write a concise and short answer to the question. Write your answer in the "
           "following format:\nAnswer: [answer]\n\n{demos}{context}\n\nQuestion: {question}")
QA_PROMPT = QA_USER + "\n" + "Answer:"


def official_load_qa(dataset, rows, demo_rows, max_test_samples=None, popularity_threshold=None, shots=0):
    import hashlib
    import math
    import random

    import datasets

    random.seed(42)  # eval.py, right before load_data
    data = datasets.Dataset.from_list(rows)
    demo_data = datasets.Dataset.from_list(demo_rows)

    def drop_duplicates(data, key="id"):
        indices_to_keep = []
        keys = set()
        for i, d in enumerate(data):
            if d[key] in keys:
                continue
            indices_to_keep.append(i)
            keys.add(d[key])
        data = data.select(indices_to_keep)
        return data

    if "popqa" in dataset and popularity_threshold is not None:
        data = data.filter(lambda x: math.log10(x['s_pop']) < popularity_threshold)
        demo_data = demo_data.filter(lambda x: math.log10(x['s_pop']) < popularity_threshold)
    key = "id" if "id" in data.column_names else "question"
    if max_test_samples is not None:
        keys = set(data[key])
        keys = random.sample(sorted(keys), min(max_test_samples, len(keys)))
        data = data.filter(lambda x: x[key] in keys)
    demo_template = "{documents}\n\nQuestion: {question}\nAnswer: {answer}"
    passage_template = "Document (Title: {title}): {text}"

    def update(sample):
        demos = demo_data
        demo_text = ""
        if shots > 0:
            if 'popqa' in dataset:
                demos = demo_data.filter(lambda x: x[key] != sample[key])
            h = int(hashlib.sha256(str(sample[key]).encode("utf-8")).hexdigest(), 16) % 2**31
            demos = demos.shuffle(seed=h)
            demos = drop_duplicates(demos, key).select(range(shots))
            demo_text = "\n\n".join([demo_template.format(**d, documents="\n\n".join(
                [passage_template.format(**c) for c in d["ctxs"]]), answer=d["answers"][0]) for d in demos]) + "\n\n"
        passage_text = ""
        if len(sample['ctxs']) > 0:
            passage_text = "\n\n".join([passage_template.format(**c) for c in sample['ctxs']])
        return {"demos": demo_text, "context": passage_text, "answer": sample["answers"]}
    data = data.map(update)
    return [QA_PROMPT.format(**d) for d in data]


def qa_row(k: int, popularity: float = 10.0, same_as: int | None = None) -> dict:
    q = f"who keeps box {k if same_as is None else same_as}?"
    return {"question": q, "answers": [f"Keeper {k}", f"K{k}"], "s_pop": popularity,
            "ctxs": [{"title": f"Box {k}", "text": f"Box {k} is kept by Keeper {k}.", "score": 1.0},
                     {"title": "Noise", "text": "Nothing {here}.", "score": 0.5}]}


@pytest.mark.parametrize(("name", "shots", "samples", "repeated"), [
    ("kilt_nq", 2, 4, False), ("kilt_nq", 0, 100, False), ("kilt_popqa", 2, 3, False), ("kilt_hotpotqa", 3, 5, False),
    ("kilt_triviaqa", 2, 6, True)])  # demonstrations of two questions only: duplicates dropped
def test_rag_rows_demonstrations_and_prompts_are_load_qas(name, shots, samples, repeated):
    """The drawn questions (duplicates of a drawn question kept), each one's demonstrations (a per-question seeded
    shuffle, duplicate questions dropped, PopQA without the question itself and with log10(s_pop) < 3) and the
    filled prompt, against load_qa run on the same rows with datasets."""
    rows = [qa_row(k, popularity=10.0 ** (k % 5)) for k in range(12)] + [qa_row(12, same_as=3)]
    demos = [qa_row(100 + k, popularity=10.0 ** (k % 5)) for k in range(9)] + [qa_row(109, same_as=101)]
    if repeated:
        demos = [qa_row(100 + k, same_as=100 + k % 2) for k in range(12)]
    if name == "kilt_popqa":
        demos = rows  # PopQA draws its demonstrations from its own questions
    task = data.TASKS[name]
    expected = official_load_qa(name, rows, demos, samples, 3.0 if name == "kilt_popqa" else None, shots)
    chosen = helmet.draw_qa(task, rows, samples)
    pool = [d for d in demos if name != "kilt_popqa" or data.popular_enough(d)]
    got = [data.prompt(task, data.fields(task, rows[i], shots, data.demonstrations(
        task, rows[i], pool, data.qa_key(rows, task), shots, helmet.shuffled))) for i in chosen]
    assert got == expected and len(got) >= min(samples, 3)
    if name == "kilt_nq" and samples == 100:
        assert 3 in chosen and 12 in chosen  # one question twice: both rows


def test_rag_stand_in_stops_at_a_new_line(tmp_path, monkeypatch, trained):
    """RAG decodes up to 20 tokens and stops at a new-line token: what follows it is not scored (a stand-in that
    writes "Answer: no\nKeeper k" scores 0, "Answer: Keeper k\n..." scores 1)."""
    root = tmp_path / "data" / "kilt"
    root.mkdir(parents=True)
    rows = [qa_row(k) for k in range(4)]
    (root / "nq-dev-multikilt_1000_k20_dep6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "nq-train-multikilt_1000_k3_dep6.jsonl").write_text(
        "".join(json.dumps(qa_row(100 + k)) + "\n" for k in range(4)))
    evaluation = helmet.Helmet(str(tmp_path / "data"), ["kilt_nq"], [4096], samples=4)
    from tapecli.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    checks = []

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, stop_check=None, **_):
        outs = []
        for p in prompts:
            k = int(re.findall(r"who keeps box (\d+)\?", tok.decode(p))[-1])
            reply = tok.encode(f" Keeper {k}\nmore" if k % 2 else " no\nKeeper {k}")
            cut = next(n + 1 for n in range(len(reply)) if stop_check(reply[: n + 1]))
            checks.append((max_new_tokens, tok.decode(reply[:cut])))
            outs.append((reply + [pad_id] * max_new_tokens)[:max_new_tokens])  # the evaluation cuts it too
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=4, show_progress=False)
    m = report.results["helmet"]["models"][0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["output"] for r in rows] == [" no\n", " Keeper 1\n", " no\n", " Keeper 3\n"]
    assert checks == [(20, r["output"]) for r in rows]
    assert m["scores"] == {"kilt_nq": {"4096": 50.0}} and m["categories"] == {"rag": {"4096": 50.0}}
    assert report.results["helmet"]["settings"]["data"]["files"][1].startswith(
        "kilt/nq-train-multikilt_1000_k3_dep6.jsonl sha256:")


# ---- Re-ranking: utils.py's parse_rankings and calculate_retrieval_metrics, data.py's load_msmarco_rerank, as
# published

def official_parse_rankings(output):
    output = re.sub(r"[\[\]:]", "", output)
    output = output.lower().replace("id", "")
    pattern = r'(\d+)(?:\s*>\s*(\d+))*'
    match = re.finditer(pattern, output)
    longest = ""
    for m in match:
        if len(m.group(0)) > len(longest):
            longest = m.group(0)
    if len(longest) > 0:
        number_string = longest
        rankings = [num.strip() for num in number_string.split('>') if num.strip().isdigit()]
    else:
        rankings = [output]
    results = {}
    for i, rank in enumerate(rankings):
        if rank not in results:
            results[rank] = len(rankings) - i
    return results


def official_calculate_retrieval_metrics(results, qrels, k_values=(1, 5, 10, 25, 50, 100)):
    import pytrec_eval

    ndcg = {}
    for k in k_values:
        ndcg[f"NDCG@{k}"] = 0.0
    ndcg_string = "ndcg_cut." + ",".join([str(k) for k in k_values])
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {ndcg_string})
    scores = evaluator.evaluate(results)
    for query_id in scores.keys():
        for k in k_values:
            ndcg[f"NDCG@{k}"] += scores[query_id]["ndcg_cut_" + str(k)]
    for k in k_values:
        ndcg[f"NDCG@{k}"] = round(ndcg[f"NDCG@{k}"] / len(scores), 5)
    return ndcg


LABELS = {"1": 0, "2": 3, "3": 1, "4": 0, "5": 2, "6": 0, "7": 0, "8": 1, "9": 0, "10": 0, "11": 2, "12": 0}


@pytest.mark.parametrize("output", [
    "2 > 5 > 11 > 3 > 8", "[ID: 2] > [ID: 5] > [ID: 11]", "ID2 > ID5", "5 > 5 > 2",  # a repeated id: its first place
    "the best is 7, then 2 > 11 > 5 > 3", "", "no ids at all", "12 > 1 > 4 > 6 > 7 > 9 > 10 > 3 > 8 > 5 > 11 > 2",
    "2>5>11>3>8>1>4>6>7>9>10>12", "Ranking: 3 > 8\nRanking: 2 > 5 > 11",  # the longest run wins
])
def test_rankings_and_ndcg_are_helmets(output):
    from tapecli.eval import helmet_rerank

    parsed = helmet_rerank.parse_rankings(output)
    assert parsed == official_parse_rankings(output)
    k_values = [k for k in [1, 5, 10, 20, 50, 100, 200, 500, 1000] if k <= len(LABELS)]  # load_msmarco_rerank's
    official = official_calculate_retrieval_metrics({"q7": official_parse_rankings(output)}, {"q7": LABELS}, k_values)
    assert helmet_rerank.ndcg_at_10(parsed, LABELS, "q7") == official["NDCG@10"]


def test_ndcg_pinned_by_hand():
    """trec_eval's nDCG: gain = label, discount log2(rank + 1), ideal from the labels; ids not ranked count nothing."""
    import math

    from tapecli.eval.helmet_rerank import ndcg_at_10

    labels = {"1": 1, "2": 0, "3": 2}
    assert ndcg_at_10({"3": 3, "1": 2, "2": 1}, labels) == 1.0
    ideal = 2 + 1 / math.log2(3)
    assert ndcg_at_10({"1": 2, "3": 1}, labels) == round((1 + 2 / math.log2(3)) / ideal, 5) == 0.85972
    assert ndcg_at_10({"no ids": 1}, labels) == 0.0


def rerank_row(k: int, passages: int = 12, title: bool = False) -> dict:
    ctxs = [{"id": str(n + 1), "text": f"Passage {n + 1} about query {k}.", "label": (n * 7 + k) % 4,
             **({"title": f"T{n}"} if title else {})} for n in range(passages)]
    return {"qid": f"{1000 + k}", "query": f"what is query {k}?", "ctxs": ctxs}


def official_load_msmarco_rerank(rows, demo_rows, max_test_samples=None, shots=0, seed=42):
    import hashlib
    import random

    import datasets

    random.seed(seed)
    user_template = ("You are provided with a list of documents, each indicated by their ID. Rank each document based "
                     "on their relevance to the question in descending order from most relelvant to least relevant "
                     "texts. Include all documents in the rankings. Write your answer using the unique IDs, with the "
                     "following format:\nRanking: ID3 > ID1 > ID2\n\n{demos}{context}\n\nQuery: {question}")
    prompt_template = user_template + "\n" + "Ranking:"
    data = datasets.Dataset.from_list(rows)
    demos = datasets.Dataset.from_list(demo_rows)
    if max_test_samples is not None:
        key = "qid" if "qid" in data.column_names else "query"
        keys = set(data[key])
        keys = random.sample(sorted(keys), min(max_test_samples, len(keys)))
        data = data.filter(lambda x: x[key] in keys)
    demo_filtered = False
    if len(demos) > 2*len(data):
        qids = set(data["qid"])
        demos = demos.filter(lambda x: x["qid"] not in qids)
        demo_filtered = True

    def drop_duplicates(data, key="id"):
        indices_to_keep, keys = [], set()
        for i, d in enumerate(data):
            if d[key] in keys:
                continue
            indices_to_keep.append(i)
            keys.add(d[key])
        return data.select(indices_to_keep)

    def update(sample, demos):
        passage_template = ("[ID: {id}] Document (Title: {title}): {text}" if "title" in sample["ctxs"][0]
                            else "[ID: {id}] Document: {text}")
        passage_text = "\n\n".join([passage_template.format(**c) for c in sample['ctxs']])
        gold_ranking = " > ".join([x['id'] for x in sorted(sample["ctxs"], key=lambda x: x["label"], reverse=True)])
        demo_text = ""
        if shots > 0:
            if not demo_filtered:
                demos = demos.filter(lambda x: x["qid"] != sample["qid"])
            h = abs(int(hashlib.sha256(sample["qid"].encode("utf-8")).hexdigest(), 16) % 2**31)
            demo = demos.shuffle(seed=h)
            demo = drop_duplicates(demo, 'qid').select(range(shots))
            demo_ids = set()
            for d in demo:
                if d["qid"] in demo_ids or len(demo_ids) >= shots:
                    continue
                demo_ids.add(d["qid"])
                ids = sorted(d["ctxs"], key=lambda x: x["label"], reverse=True)
                ranking = " > ".join([x['id'] for x in ids])
                demo_text += "\n\n".join([passage_template.format(**c) for c in d['ctxs']]) + \
                    f"\n\nQuery: {d['query']}\nRanking: {ranking}" + "\n\n"
        return {"context": passage_text, "question": sample["query"], "demos": demo_text, "answer": gold_ranking}

    data = data.map(lambda x: update(x, demos), remove_columns=["query", "ctxs"])
    return [(prompt_template.format(**d), d["answer"]) for d in data]


@pytest.mark.parametrize(("samples", "shots", "n_demos", "title"), [
    (3, 2, 10, False), (5, 2, 6, True), (100, 0, 4, False), (4, 2, 9, False), (4, 2, 8, False)])
def test_rerank_rows_demonstrations_and_prompts_are_load_msmarco_reranks(samples, shots, n_demos, title):
    """Both ways of keeping a question out of its own demonstrations: more than twice as many demonstration rows as
    drawn questions (every drawn question's removed at once) or not (each question's own, per question)."""
    rows = [rerank_row(k, title=title) for k in range(8)]
    demos = [rerank_row(k % 10, passages=4, title=title) for k in range(n_demos)]  # repeated qids, some drawn too
    task = data.TASKS["msmarco_rerank_psg"]
    chosen = helmet.draw_qa(task, rows, samples)
    pool = data.rerank_pool(demos, [rows[i] for i in chosen])
    got = []
    for i in chosen:
        sample = data.fields(task, rows[i], shots, data.demonstrations(task, rows[i], pool, "qid", shots,
                                                                        helmet.shuffled))
        got.append((data.prompt(task, sample), sample["answer"]))
    assert got == official_load_msmarco_rerank(rows, demos, samples, shots)


def test_rerank_with_a_stand_in_model(tmp_path, monkeypatch, trained):
    """The stand-in ranks by the gold ranking on even questions and in reverse on odd ones, then writes a new line
    and more ids (not read); the score is the mean of HELMET's NDCG@10 x 100."""
    from tapecli.data.tokenizer import ByteTokenizer

    root = tmp_path / "data" / "msmarco"
    root.mkdir(parents=True)
    rows = [rerank_row(k) for k in range(4)]
    (root / "test_reranking_data_k14_dep3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "test_reranking_data_k10_dep3.jsonl").write_text(
        "".join(json.dumps(rerank_row(10 + k, passages=3)) + "\n" for k in range(5)))
    tok = ByteTokenizer()

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, stop_check=None, **_):
        outs = []
        for p in prompts:
            k = int(re.findall(r"Query: what is query (\d+)\?", tok.decode(p))[-1])
            ids = data.gold_ranking(rows[k]).split(" > ")
            reply = tok.encode(" " + " > ".join(ids if k % 2 == 0 else ids[::-1]) + "\n > 1 > 2")
            assert max_new_tokens == 200 and stop_check is not None
            outs.append((reply + [pad_id] * max_new_tokens)[:max_new_tokens])
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    report = run(helmet.Helmet(str(tmp_path / "data"), ["rerank"], [4096], samples=4), [str(trained())],
                 tmp_path / "out", device="cpu", batch_size=2, show_progress=False)
    m = report.results["helmet"]["models"][0]
    expected = []
    for k, row in enumerate(rows):
        ids = data.gold_ranking(row).split(" > ")
        output = " " + " > ".join(ids if k % 2 == 0 else ids[::-1]) + "\n"
        labels = {c["id"]: c["label"] for c in row["ctxs"]}
        k_values = [1, 5, 10]
        expected.append(official_calculate_retrieval_metrics({row["qid"]: official_parse_rankings(output)},
                                                             {row["qid"]: labels}, k_values)["NDCG@10"])
    assert expected[0] == 1.0 and expected[1] < 1
    assert m["scores"] == {"msmarco_rerank_psg": {"4096": round(100 * sum(expected) / 4, 2)}}
    assert m["categories"] == {"rerank": m["scores"]["msmarco_rerank_psg"]}
