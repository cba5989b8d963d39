"""`tape eval helmet`'s many-shot ICL and long-document QA categories: HELMET's loaders and metrics (written out here
from princeton-nlp/HELMET's data.py and utils.py, the datasets calls included) against tape's on tiny local copies of
the Hugging Face datasets they read, the scores with a stand-in model, and the real command on a tape run and a Hugging
Face Llama."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re

import pytest
from cli_helpers import one_line_error
from test_helmet import official_normalize_answer, official_parse_output, official_substring_exact_match_score
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import helmet as data
from tapecli.data import helmet_cut, helmet_icl, helmet_longqa
from tapecli.eval import helmet, helmet_answer
from tapecli.eval.protocol import run

runner = CliRunner()


# ---- HELMET utils.py's calculate_metrics (its f1 left out: not reported for these tasks) and data.py's post_process

def official_drqa_exact_match_score(prediction, ground_truth):
    return official_normalize_answer(prediction) == official_normalize_answer(ground_truth)


def official_max_over_ground_truths(metric_fn, prediction, ground_truths):
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths]
    elif isinstance(ground_truths[0], list):
        ground_truths = [ground_truth for ground_truths_list in ground_truths for ground_truth in ground_truths_list]
    return max(metric_fn(prediction, ground_truth) for ground_truth in ground_truths)


def official_calculate_metrics(prediction, answers):
    from rouge_score import rouge_scorer

    r_scorer = rouge_scorer.RougeScorer(['rougeL', 'rougeLsum'], use_stemmer=True)
    em = official_max_over_ground_truths(official_drqa_exact_match_score, prediction, answers)
    sub_em = official_max_over_ground_truths(official_substring_exact_match_score, prediction, answers)
    if isinstance(answers, str):
        answers = [answers]
    elif isinstance(answers[0], list):
        answers = [ground_truth for ground_truths_list in answers for ground_truth in ground_truths_list]
    rouges = [r_scorer.score(target=a, prediction=prediction) for a in answers]
    rouge = {}
    for k in r_scorer.rouge_types:
        rouge[k + "_f1"] = max([r[k].fmeasure for r in rouges])
        rouge[k + "_recall"] = max([r[k].recall for r in rouges])
    return {"exact_match": em, "substring_exact_match": sub_em, **rouge}


def official_icl_post_process(prediction, answer):
    prediction = official_parse_output(prediction, "label:")
    return official_calculate_metrics(prediction, answer)


def official_default_post_process(prediction, answer):
    mets = official_calculate_metrics(prediction, answer)
    parsed_pred = official_parse_output(prediction)
    if parsed_pred is not None:
        new_mets = official_calculate_metrics(parsed_pred, answer)
        mets = {k: max(v, new_mets[k]) for k, v in mets.items()}
    return mets


def official_choice_post_process(prediction, answer):
    mets = official_calculate_metrics(prediction, answer)
    mets.pop("substring_exact_match")
    parsed_pred = official_parse_output(prediction)
    if parsed_pred is not None:
        new_mets = official_calculate_metrics(parsed_pred, answer)
        new_mets.pop("substring_exact_match")
        mets = {k: max(v, new_mets[k]) for k, v in mets.items()}
    mets["substring_exact_match"] = False
    if answer[1].lower() in prediction.lower():
        mets["substring_exact_match"] = True
        mets["exact_match"] = True
    return mets


OUTPUTS = ["", "label: 3", "Label: 3\nlabel: 4", "3", " 3.", "label:", "The answer is Paris.", "Answer: the Eiffel "
           "tower\nParis", "B", "Answer: B", "b. red apples", "I think C. Blue", "running dogs ran", "A"]


@pytest.mark.parametrize("output", OUTPUTS)
def test_the_metrics_are_helmets(output):
    """ICL's exact match after "label:", QA's ROUGE-L F1 and SubEM (the larger of raw and parsed), the choice's
    accuracy (its "letter. option" rule), on outputs that are empty, repeat the prefix, tie between answers."""
    for answer in ["3", "4", "", "the"]:
        assert helmet_answer.scores("icl_nlu", output, answer) == {
            "exact_match": float(official_icl_post_process(output, answer)["exact_match"])}
    for answers in [["Paris"], ["Eiffel Tower", "the Paris tower"], ["run dog", "running dogs"], ["the"], [""]]:
        expected = official_default_post_process(output, answers)
        assert helmet_answer.scores("narrativeqa", output, answers) == {
            "rougeL_f1": expected["rougeL_f1"], "substring_exact_match": float(expected["substring_exact_match"])}
        assert helmet_answer.scores("infbench_qa_eng", output, answers) == {"rougeL_f1": expected["rougeL_f1"]}
    for answers in [["B", "B. red apples"], ["C", "C. blue"], ["A", "A. the"]]:
        assert helmet_answer.scores("infbench_choice_eng", output, answers) == {
            "exact_match": float(official_choice_post_process(output, answers)["exact_match"])}


def test_metrics_pinned():
    assert helmet_answer.scores("icl_trec_fine", "label: 12\nlabel: 7", "12") == {"exact_match": 1.0}
    assert helmet_answer.scores("icl_trec_fine", "12 13", "12") == {"exact_match": 0.0}
    assert helmet_answer.scores("infbench_choice_eng", "I think C. Blue", ["C", "C. blue"]) == {"exact_match": 1.0}
    assert helmet_answer.scores("infbench_choice_eng", "C)", ["C", "C. blue"]) == {"exact_match": 1.0}
    assert helmet_answer.scores("infbench_choice_eng", "maybe C", ["C", "C. blue"]) == {"exact_match": 0.0}
    # ROUGE-L with stemming: "running dogs ran" vs "run dog": LCS 2 (run, dog), P 2/3, R 1, F 0.8
    assert helmet_answer.scores("infbench_qa_eng", "running dogs ran", ["run dog"]) == {"rougeL_f1": 0.8}
    assert helmet_answer.scores("narrativeqa", "", ["a cat"]) == {"rougeL_f1": 0.0, "substring_exact_match": 0.0}


# ---- data.py's load_icl, as published (load_dataset replaced by the given datasets; num_proc dropped)

def official_load_icl(dataset, train_data, test_data, max_test_sample=None, seed=42):
    import datasets
    import numpy as np

    shot = int(dataset.split("shot")[0].split("_")[-1])
    if "trec_fine" in dataset.lower():
        text_field, label_field, num_labels = "text", "fine_label", 50
    elif "trec_coarse" in dataset.lower():
        text_field, label_field, num_labels = "text", "coarse_label", 6
    elif "banking77" in dataset.lower():
        text_field, label_field, num_labels = "text", "label", 77
    elif "clinic150" in dataset.lower():
        text_field, label_field, num_labels = "text", "intent", 151
    elif "nlu" in dataset.lower():
        data = train_data
        data = data.train_test_split(test_size=0.1, seed=seed)
        train_data = data["train"]
        test_data = data["test"]
        text_field, label_field, num_labels = "text", "label", 68

    def balance_labels(data, shots, seed):
        rand = random.Random(seed)
        label_mapping = {x[label_field]: [] for x in data}
        for x in data:
            label_mapping[x[label_field]].append(x)
        num_rounds = math.ceil(shots / len(label_mapping))
        new_data = [[] for _ in range(num_rounds)]
        for _, samples in label_mapping.items():
            indices = rand.sample(range(len(samples)), num_rounds % len(samples))
            while len(indices) < num_rounds:
                indices += rand.sample(range(len(samples)), min(num_rounds - len(indices), len(samples)))
            for i, idx in enumerate(indices):
                new_data[i].append(samples[idx])
        for i in range(len(new_data)):
            rand.shuffle(new_data[i])
        new_data = [item for sublist in new_data for item in sublist][:shots]
        return new_data

    if max_test_sample is not None and len(test_data) > max_test_sample:
        test_data = test_data.shuffle(seed=seed)
        test_data = balance_labels(test_data, max_test_sample, seed)
        test_data = datasets.Dataset.from_list(test_data)

    item_template = "{text}\nlabel: {label}"
    user_template = ("Use the provided mapping from the text to label to assign a label to the text. Only output "
                     "\"label: {{label}}\" and nothing else. \n\n{context}\n\n{question}")
    system_template = "label:"
    prompt_template = user_template + "\n" + system_template

    def preprocess(sample):
        local_seed = (int(hashlib.sha256(sample[text_field].encode("utf-8")).hexdigest(), 16) + seed) % 2**31
        np.random.seed(local_seed)
        demos = balance_labels(train_data, shot, local_seed)
        label_mapping = list(range(num_labels))
        random.seed(local_seed)
        random.shuffle(label_mapping)
        context = "\n\n".join([
            item_template.format(text=selected_item[text_field], label=str(label_mapping[int(selected_item[label_field])]))  # noqa: E501
            for selected_item in demos])
        return {"context": context, "question": sample[text_field],
                "answer": str(label_mapping[int(sample[label_field])])}

    final_data = test_data.map(preprocess)
    return [{"prompt": prompt_template.format(**d), "answer": d["answer"]} for d in final_data]


ICL_FIELDS = {"icl_trec_coarse": ("trec", "coarse_label", 6), "icl_trec_fine": ("trec", "fine_label", 50),
              "icl_banking77": ("banking77", "label", 77), "icl_clinic150": ("clinc_oos", "intent", 151),
              "icl_nlu": ("nlu_evaluation_data", "label", 68)}


def icl_rows(task: str, n: int, start: int = 0) -> list[dict]:
    """Rows of the task's dataset: labels 0..6 (TREC coarse: 0..5), some labels rarer than others."""
    _, field, num = ICL_FIELDS[task]
    rows = []
    for k in range(start, start + n):
        label = (k * 7) % min(num, 7) if k % 5 else 0
        row = {"text": f"utterance {k} asks about topic {label} {'please' * (k % 3)}".strip(), field: label}
        if task.startswith("icl_trec"):
            row = {"text": row["text"], "coarse_label": label % 6, "fine_label": label}
        rows.append(row)
    return rows


def write_icl(root, task: str, train: int = 40, test: int = 12) -> None:
    folder, _, _ = ICL_FIELDS[task]
    where = root / folder / ("plus" if folder == "clinc_oos" else "")
    where.mkdir(parents=True, exist_ok=True)
    split = "validation" if folder == "clinc_oos" else "test"
    (where / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in icl_rows(task, train)))
    if folder != "nlu_evaluation_data":  # NLU: HELMET splits its train split
        (where / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in icl_rows(task, test, 1000)))


@pytest.mark.parametrize(("task", "length", "samples"), [
    ("icl_trec_coarse", 4096, 5), ("icl_trec_fine", 8192, 500), ("icl_banking77", 4096, 7),
    ("icl_clinic150", 4096, 12), ("icl_nlu", 4096, 3)])
def test_icl_rows_and_prompts_are_load_icls(tmp_path, task, length, samples):
    """The test rows (balanced and shuffled when there are more than `samples`; NLU's 10% split), each one's
    label-balanced demonstrations (as many as HELMET's config has at that length, repeated when a label has too few)
    and its random label mapping, filled into the prompt: load_icl's, run with datasets on the same files."""
    import datasets

    write_icl(tmp_path, task)
    folder, _, _ = ICL_FIELDS[task]
    path = tmp_path / folder / ("plus" if folder == "clinc_oos" else "")
    whole = datasets.load_dataset(str(path))
    shots = helmet_icl.shots(task, length)
    name = f"{task}_{shots}shot_balance"
    expected = official_load_icl(name, whole["train"], whole.get("test", whole.get("validation")), samples)
    train, test, described = helmet_icl.splits(str(tmp_path), task)
    rows = helmet_icl.rows(train, test, task, length, samples, helmet.shuffled)
    assert [data.prompt(data.TASKS[task], r) for r in rows] == [e["prompt"] for e in expected]
    assert [r["answer"] for r in rows] == [e["answer"] for e in expected]
    assert len(rows) == min(samples, len(test)) and rows[0]["context"].count("\nlabel: ") == shots
    assert described.endswith(f"train {len(train)} rows, test {len(test)} rows")


def test_icl_shots_and_generation_are_helmets():
    """generate_configs.py's shot counts at 4K-128K, 20 tokens stopping at a new line, 500 samples (configs/icl.yaml:
    the 128K names icl_trec_coarse_6600shot_balance, ...)."""
    at_128k = {"icl_trec_coarse": 6600, "icl_trec_fine": 6400, "icl_banking77": 5900, "icl_clinic150": 7050,
               "icl_nlu": 8296}
    assert {t: helmet_icl.shots(t, 131072) for t in at_128k} == at_128k
    assert [helmet_icl.shots("icl_banking77", n) for n in data.LENGTHS] == [180, 360, 720, 1450, 2900, 5900]
    assert data.CATEGORIES["icl"] == list(at_128k) and data.CATEGORIES["longqa"] == [
        "narrativeqa", "infbench_qa_eng", "infbench_choice_eng"]
    assert all((t.generation_max_length, t.stop_new_line, t.samples, t.metric) == (20, True, 500, "exact_match")
               for t in data.TASKS.values() if t.category == "icl")
    assert [(data.TASKS[t].generation_max_length, data.TASKS[t].samples, data.TASKS[t].stop_new_line)
            for t in data.CATEGORIES["longqa"]] == [(100, 100, False), (10, 100, False), (10, 100, False)]
    with pytest.raises(Exception, match="icl_nlu has demonstration counts for 4096, 8192"):
        helmet_icl.shots("icl_nlu", 1000)


# ---- data.py's load_narrativeqa and load_infbench, as published (load_dataset and the Llama-2 tokenizer replaced by
# the given datasets and tokenizer, num_proc dropped; the length thresholds given, so tiny files can cross them)

POSTFIX = " ... [the rest of the text is omitted]"


def official_truncate_llama2(dataset, data, tokenizer, postfix_text=POSTFIX):
    max_length = int(dataset.split("_")[-1])
    separator_length = len(tokenizer(postfix_text)["input_ids"])

    def truncate(sample):
        tokens = tokenizer(sample["context"], return_offsets_mapping=True)
        if len(tokens["input_ids"]) > max_length:
            sample["context"] = sample["context"][:tokens["offset_mapping"][max_length-separator_length][1]] + postfix_text  # noqa: E501
        return sample
    return data.map(truncate)


def official_filter_length(data, min_length, key, tokenizer):
    return data.filter(lambda x: len(tokenizer(x[key])['input_ids']) >= min_length)


def official_load_narrativeqa(dataset, all_data, tokenizer, shots=0, max_samples=None, seed=42, over=131072):
    user_template = ("You are given a story, which can be either a novel or a movie script, and a question. Answer the "
                     "question as concisely as you can, using a single phrase if possible.\n\n{demo}{context}\n\n"
                     "Question: {question}")
    prompt_template = user_template + "\n" + "Answer:"
    data = all_data["test"].shuffle(seed=seed)
    data = data.map(lambda x: {'input_length': len(tokenizer(x['document']['text'])['input_ids'])})
    data = data.filter(lambda x: x['input_length'] > over)
    data = data.remove_columns("input_length")
    data = data.map(lambda example: {
        "context": example["document"]["text"],
        "question": example["question"]["text"],
        "answer": [ex["text"] for ex in example["answers"]],
        "demo": "" if shots == 0 else "For example:\n\n" + "\n\n".join([f"Question: {ex['question']['text']}\nAnswer: {ex['answers'][0]['text']}" for ex in all_data["train"].shuffle().select(range(shots))]) + "\n\nNow, use the following story to answer the question:\n\n"  # noqa: E501
    }, remove_columns=["document", "answers"])
    data = official_filter_length(data, over, "context", tokenizer)
    data = official_truncate_llama2(dataset, data, tokenizer)
    if max_samples is not None:
        data = data.select(range(min(max_samples, len(data))))
    return [{"prompt": prompt_template.format(**d), "answer": d["answer"]} for d in data]


def official_load_infbench(dataset, data, tokenizer, shots=0, max_test_samples=None, seed=42, least=65536):
    if "qa_eng" in dataset:
        user_template = ("You are given a story and a question. Answer the question as concisely as you can, using a "
                         "single phrase if possible.\n\n{demo}{context}\n\nQuestion: {question}")
        data = data["longbook_qa_eng"]
    elif "choice_eng" in dataset:
        user_template = ("You are given a story and a question with multiple choices. Choose the best answer from "
                         "the options provided. Only one of the following options is correct, output the answer using "
                         "one single letter (A, B, C, or D). Don't say anything else.\n\n{demo}{context}\n\nQuestion: "
                         "{question}\nOptions:\n{options}")
        data = data["longbook_choice_eng"]
    prompt_template = user_template + "\n\n" + "Answer:"

    def process_example(example):
        update = {"question": example["input"], "demo": ""}
        if "choice" in dataset:
            options = "A. {}\nB. {}\nC. {}\nD. {}".format(*example["options"])
            answer = example["options"].index(example["answer"][0])
            answer = chr(ord("A") + answer)
            update["options"] = options
            update["answer"] = [answer, f"{answer}. {example['answer'][0]}"]
        return update
    data = data.map(process_example)

    def add_demos(example):
        demos = data.filter(lambda x: x["id"] != example["id"]).shuffle(seed=seed).select(range(shots))
        if "qa_eng" in dataset:
            temp = "[story text]\nQuestion: {question}\nAnswer: {answer[0]}"
            demo = "\n\n".join([temp.format(**x) for x in demos])
        elif "choice_eng" in dataset:
            temp = "[story text]\nQuestion: {question}\nOptions:\n{options}\nAnswer: {answer[0]}"
            demo = "\n\n".join([temp.format(**x) for x in demos])
        return {"demo": f"For example:\n\n{demo}\n\nNow, read the following story:\n\n"}
    if shots > 0:
        data = data.map(add_demos)
    data = official_filter_length(data, least, "context", tokenizer)
    data = official_truncate_llama2(dataset, data, tokenizer)
    if max_test_samples is not None:
        data = data.shuffle(seed=seed).select(range(min(len(data), max_test_samples)))
    return [{"prompt": prompt_template.format(**d), "answer": d["answer"]} for d in data]


def story(k: int, words: int) -> str:
    rng = random.Random(k)
    vocabulary = "the keeper of a black box walked along river green hill one two town".split()
    return f"Story {k}. " + " ".join(rng.choice(vocabulary) for _ in range(words))


def narrativeqa_rows(split: str, docs: list[tuple[int, int, int]]) -> list[dict]:
    """NarrativeQA's fields: per (document, words, questions) rows sharing the document."""
    rows = []
    for doc, words, questions in docs:
        text = story(doc, words)
        for q in range(questions):
            rows.append({"document": {"id": f"{split}-{doc}", "kind": "gutenberg", "text": text,
                                      "summary": {"text": "", "title": f"Book {doc}"}},
                         "question": {"text": f"Who keeps box {doc}-{q}?", "tokens": []},
                         "answers": [{"text": f"keeper {doc} {q}", "tokens": []}, {"text": f"K{q}", "tokens": []}]})
    return rows


NARRATIVE_TEST = [(1, 900, 3), (2, 60, 2), (3, 700, 2), (4, 400, 1)]
NARRATIVE_TRAIN = [(10 + k, 20, 2) for k in range(5)]


def infbench_rows(n: int, words: int, choice: bool) -> list[dict]:
    rows = []
    for k in range(n):
        options = [f"keeper {k}", f"walker {k}", "the river", f"town {k}"] if choice else []
        answer = [options[k % 4]] if choice else [f"keeper {k}", f"the keeper {k}"]
        rows.append({"id": k, "context": story(100 + k % 3, words // (1 + k % 4)), "input": f"Who keeps box {k}?",
                     "answer": answer, "options": options})
    return rows


def write_longqa(root, scale: int = 1) -> None:
    (root / "narrativeqa").mkdir(parents=True, exist_ok=True)
    for split, docs in (("test", NARRATIVE_TEST), ("train", NARRATIVE_TRAIN)):
        rows = narrativeqa_rows(split, [(d, w * scale, q) for d, w, q in docs])
        (root / "narrativeqa" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "infinitebench").mkdir(parents=True, exist_ok=True)
    for split, choice in (("longbook_qa_eng", False), ("longbook_choice_eng", True)):
        rows = infbench_rows(7, 800 * scale, choice)
        (root / "infinitebench" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(("task", "length", "shots", "samples"), [
    ("narrativeqa", 800, 2, 100), ("narrativeqa", 1100, 0, 2), ("infbench_qa_eng", 700, 2, 100),
    ("infbench_choice_eng", 600, 3, 3), ("infbench_qa_eng", 4096, 0, 4)])
def test_longqa_rows_and_prompts_are_helmets(tmp_path, monkeypatch, tiny_hf_llama, task, length, shots, samples):
    """The documents kept by their token count, the draw, the demonstrations (NarrativeQA's from its train split by
    the unseeded shuffle, numpy's generator seeded with 42 first; InfiniteBench's from the other rows) and the
    document cut at length - 200 - generation length tokens with HELMET's postfix, filled into the prompt: data.py's
    loaders, run with datasets on the same files (the thresholds 131072 and 65536 lowered to 500 and 300 in both)."""
    import datasets
    import numpy as np

    write_longqa(tmp_path)
    monkeypatch.setattr(helmet_longqa, "NARRATIVEQA_MIN", 500)
    monkeypatch.setattr(helmet_longqa, "INFBENCH_MIN", 300)
    tokenizer = helmet_cut.load_tokenizer(str(tiny_hf_llama))
    definition = data.TASKS[task]
    name = f"{task}_{length - 200 - definition.generation_max_length}"
    if task == "narrativeqa":
        whole = datasets.load_dataset(str(tmp_path / "narrativeqa"))
        np.random.seed(42)
        expected = official_load_narrativeqa(name, whole, tokenizer, shots, samples, over=500)
    else:
        text, texts = datasets.Value("string"), datasets.Sequence(datasets.Value("string"))
        features = datasets.Features({"id": datasets.Value("int64"), "context": text, "input": text, "answer": texts,
                                      "options": texts})
        split = helmet_longqa.SPLITS[task]
        whole = datasets.load_dataset("json", data_files={split: str(tmp_path / "infinitebench" / f"{split}.jsonl")},
                                      features=features)
        expected = official_load_infbench(name, whole, tokenizer, shots, samples, least=300)
    np.random.seed(7)
    state = np.random.get_state()[1].copy()
    prepared = helmet.Prepared(str(tmp_path), shots, str(tiny_hf_llama), helmet.shuffled)
    rows, described = prepared.rows(definition, length, samples)
    assert (np.random.get_state()[1] == state).all()  # numpy's generator as it was
    assert [data.prompt(definition, r) for r in rows] == [e["prompt"] for e in expected]
    assert [r["answer"] for r in rows] == [e["answer"] for e in expected]
    assert 2 <= len(rows) <= samples and any(r["document_cut"] for r in rows) == (length < 4096)
    assert all(r["context"].endswith(POSTFIX) == r["document_cut"] for r in rows)
    if task == "narrativeqa":  # document 2 (shorter than 500 tokens) left out
        assert all("Story 2." not in r["context"] for r in rows) and "test 8 rows" in described
    assert prepared.rows(definition, length, samples)[0] == rows  # read once, the same rows


@pytest.mark.parametrize("metric", ["exact_match", "rougeL_f1"])
def test_icl_and_longqa_with_a_stand_in_model(tmp_path, monkeypatch, trained, tiny_hf_llama, metric):
    """A stand-in that answers right on some prompts: ICL by HELMET's own label mapping (exact match 1 on even
    utterances), long QA by the answer (ROUGE-L 1, SubEM 1) or a wrong one; the scores, categories, the NarrativeQA
    note and SubEM beside, and a resumed run redoing only the lost row."""
    from tapecli.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    if metric == "exact_match":
        write_icl(tmp_path / "data", "icl_banking77", train=30, test=10)
        tasks, lengths, expect_tokens = ["icl_banking77"], [4096], 20
    else:
        write_longqa(tmp_path / "data")
        monkeypatch.setattr(helmet_longqa, "NARRATIVEQA_MIN", 500)
        monkeypatch.setattr(helmet_longqa, "INFBENCH_MIN", 300)
        tasks, lengths, expect_tokens = ["longqa"], [900], None
    seen = []

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, **_):
        outs = []
        for p in prompts:
            text = tok.decode(p)
            seen.append(max_new_tokens)
            if text.endswith("\nlabel:"):
                utterance = text.rsplit("\n", 2)[-2]
                k, label = re.match(r"utterance (\d+) asks about topic (\d+)", utterance).groups()
                seed = (int(hashlib.sha256(utterance.encode("utf-8")).hexdigest(), 16) + 42) % 2**31
                mapping = list(range(77))
                random.Random(seed).shuffle(mapping)
                reply = f" {mapping[int(label)]}\nlabel: 5" if int(k) % 2 == 0 else " 99"
            elif "Options:" in text:
                k = int(re.findall(r"Who keeps box (\d+)\?", text)[-1])
                reply = " " + "ABCD"[k % 4] if k % 2 == 0 else " E"
            else:
                box = re.findall(r"Who keeps box (\d+)(?:-(\d+))?\?", text)[-1]
                right = f"keeper {box[0]} {box[1]}" if box[1] else f"keeper {box[0]}"
                reply = f" {right}" if int(box[0]) % 2 == 1 else " nobody"
            outs.append((tok.encode(reply) + stop_tokens + [pad_id] * max_new_tokens)[:max_new_tokens])
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    evaluation = helmet.Helmet(str(tmp_path / "data"), tasks, lengths, truncation_tokenizer=str(tiny_hf_llama))
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=3, show_progress=False)
    m = report.results["helmet"]["models"][0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    if metric == "exact_match":
        asked = [evaluation.rows["icl_banking77", 4096][r["row"]]["question"] for r in rows]
        right = [int(re.match(r"utterance (\d+)", q).group(1)) % 2 == 0 for q in asked]
        assert len(rows) == 10 and sum(right) == 5 and [r["exact_match"] for r in rows] == [float(x) for x in right]
        assert m["scores"] == {"icl_banking77": {"4096": 50.0}} and m["categories"] == {"icl": {"4096": 50.0}}
        assert set(seen) == {expect_tokens} and "also" not in m and m["truncated"] == 10
        assert report.results["helmet"]["settings"]["samples"] is None
    else:  # NarrativeQA: 6 rows (document 2 too short), right on documents 1 and 3 (5 rows); InfiniteBench: 7 rows,
        # QA right on odd ids (3), multiple choice on even ids (4)
        assert [sum(r["task"] == t for r in rows) for t in data.CATEGORIES["longqa"]] == [6, 7, 7]
        assert m["scores"] == {"narrativeqa": {"900": 83.33}, "infbench_qa_eng": {"900": 42.86},
                               "infbench_choice_eng": {"900": 57.14}}
        assert m["also"] == {"narrativeqa": {"substring_exact_match": {"900": 83.33}}}
        assert m["categories"] == {"longqa": {"900": round((83.33 + 42.86 + 57.14) / 3, 2)}}
        assert "GPT-4o judge, which is not run" in m["notes"][0]
        assert "GPT-4o judge" in report.results["helmet"]["protocol"]
        assert sorted(set(seen)) == [10, 100] and any(r["document_cut"] for r in rows)
        settings = json.loads((tmp_path / "out" / "settings.json").read_text())
        assert settings["truncation_tokenizer"] == str(tiny_hf_llama)
    lines = (tmp_path / "out" / "samples.jsonl").read_text().splitlines()
    (tmp_path / "out" / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    seen.clear()
    evaluation = helmet.Helmet(str(tmp_path / "data"), tasks, lengths, truncation_tokenizer=str(tiny_hf_llama))
    run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=3, show_progress=False)
    assert len(seen) == 1 and (tmp_path / "out" / "samples.jsonl").read_text().splitlines() == lines


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """The real command on both models, at HELMET's real document thresholds (131072 and 65536 tokens of the
    truncation tokenizer): real prompts, each category's table and the NarrativeQA note; bad input and a missing local
    copy are one line before anything is written; offline without --data, one sentence says what to pass."""
    root = tmp_path / "HELMET" / "data"
    write_icl(root, "icl_trec_coarse")
    write_longqa(root, scale=40)
    out = tmp_path / "out"
    args = ["eval", "helmet", "--model", str(trained()), "--model", str(tiny_hf_llama), "--data",
            str(tmp_path / "HELMET"), "--tasks", "icl_trec_coarse,longqa", "--lengths", "4k", "--samples", "2",
            "--truncation-tokenizer", str(tiny_hf_llama), "--device", "cpu", "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| task / length | 4096 |" in result.output and "| icl |" in result.output and "| longqa |" in result.output
    assert "| narrativeqa substring_exact_match |" in result.output and "GPT-4o judge" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * (2 + 2 + 2 + 2) and {r["model"] for r in rows} == {0, 1}
    assert all(r["document_cut"] for r in rows if r["task"] != "icl_trec_coarse")
    assert all(r["truncated"] for r in rows if r["task"] == "icl_trec_coarse")  # 200 demonstrations: over 4K
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["data"]["files"][0].endswith("trec/ train 40 rows, test 12 rows")
    model = str(trained())
    for n, (extra, fragment) in enumerate([
            (["--data", str(root), "--tasks", "icl_nlu", "--lengths", "4k"],
             "no nlu_evaluation_data/ folder (a local copy of the hub dataset xingkunliuxtracta/nlu_evaluation_data); "
             "on a machine with a network run `huggingface-cli download --repo-type dataset"),
            (["--data", str(root), "--tasks", "icl", "--lengths", "1000"], "icl_trec_coarse has demonstration counts"),
            (["--data", str(root), "--tasks", "narrativeqa", "--lengths", "300", "--truncation-tokenizer",
              str(tiny_hf_llama)], "narrativeqa needs more than"),
            (["--data", str(root), "--tasks", "longqa", "--truncation-tokenizer", str(tmp_path / "none")],
             "no tokenizer.json there; pass a folder holding a fast tokenizer (tokenizer.json), HELMET's is "
             "meta-llama/Llama-2-7b-hf's"),
            (["--tasks", "icl_banking77", "--lengths", "4k"],
             "PolyAI/banking77 cannot be read from the Hugging Face hub (offline or unreachable); on a machine with a "
             "network run `huggingface-cli download --repo-type dataset PolyAI/banking77 --local-dir DATA/banking77` "
             "and pass --data DATA")]):
        where = tmp_path / f"x{n}"
        one_line_error(runner.invoke(app, ["eval", "helmet", "--model", model, "--device", "cpu", "--out",
                                           str(where), *extra]), 2, fragment)
        assert not where.exists()


@pytest.mark.slow
def test_the_results_pages_sample_files_read_as_helmets(tmp_path):
    """scripts/long_benchmark_samples.py (docs/results/long-benchmarks-cpu.md) writes local copies that `tape eval
    helmet` reads for every ICL and long-QA task, and a byte-level tokenizer (one token per byte) that measures the
    long-QA documents: NarrativeQA's two long documents (4 questions each) pass 131072 tokens, the short one does not;
    every ∞Bench context passes 65536; each is cut at 4K as truncate_llama2 cuts (no BOS here: budget + 1 bytes)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "long_benchmark_samples.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, capture_output=True)
    tokenizer = tmp_path / "helmet" / "byte-tokenizer"
    measure = helmet_cut.Measure(helmet_cut.load_tokenizer(str(tokenizer)))
    assert measure.count("héllo") == 6 and measure.separator == len(POSTFIX)
    evaluation = helmet.Helmet(str(tmp_path / "helmet" / "data"), ["icl", "longqa"], [4096], samples=8,
                               truncation_tokenizer=str(tokenizer))
    evaluation.check([])
    assert {t: len(rows) for (t, _), rows in evaluation.rows.items()} == {
        **{t: 8 for t in data.CATEGORIES["icl"]}, "narrativeqa": 8, "infbench_qa_eng": 8, "infbench_choice_eng": 8}
    for (task, _), rows in evaluation.rows.items():
        if task.startswith("icl_"):
            assert all(r["context"].count("\nlabel: ") == helmet_icl.shots(task, 4096) for r in rows)
            continue
        budget = 4096 - 200 - data.TASKS[task].generation_max_length  # cut after token budget - postfix: one more
        assert all(r["document_cut"] and len(r["context"].encode()) == budget + 1 for r in rows)  # byte than budget
