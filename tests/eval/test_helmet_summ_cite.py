"""`tape eval helmet`'s summarisation and citation tasks: HELMET's loaders (load_infbench, load_multi_lexsum,
load_alce with eval.py's seeding), truncate_llama2, calculate_metrics' ROUGE and eval_alce.py's metrics, written out
here from princeton-nlp/HELMET as published and run on hand-made files and predictions; the scores of a stand-in model
worked out by hand; a tiny random T5 NLI model (saved with save_pretrained) through the real citation scorer; and the
real command on a trained tape run, resumed after a lost row."""

from __future__ import annotations

import copy
import json
import random
import re

import numpy as np
import pytest
from cli_helpers import one_line_error
from test_helmet import official_normalize_answer as normalize_answer
from test_helmet import official_parse_output as parse_output
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import helmet as data
from tapecli.data import helmet_cite, helmet_cut, helmet_summ
from tapecli.eval import helmet, helmet_cite_metric, helmet_metric, helmet_summ_cite, helmet_summ_metric
from tapecli.eval.protocol import run

runner = CliRunner()


def test_the_files_lengths_and_passages_are_helmets():
    """configs/summ.yaml and cite.yaml through scripts/generate_configs.py: tokens to generate, the documents' token
    budget (name_postfix: length - 200 - 1200, length - 300 - 400) and ALCE's passages per length (8 ... 700)."""
    assert {n: (t.generation_max_length, t.stop_new_line, t.metric) for n, t in data.TASKS.items()
            if t.category in ("summ", "cite")} == {
        "infbench_sum_eng": (1200, False, "rougeLsum_f1"), "multi_lexsum": (400, False, "rougeLsum_f1"),
        "alce_asqa": (300, False, "str_em"), "alce_qampari": (300, False, "qampari_rec_top5")}
    assert [n - helmet_summ.RESERVED["infbench_sum_eng"] for n in (8192, 131072)] == [6792, 129672]
    assert [n - helmet_summ.RESERVED["multi_lexsum"] for n in (8192, 131072)] == [7492, 130372]
    assert list(helmet_cite.PASSAGES.values()) == [8, 30, 75, 165, 345, 700]
    assert data.CATEGORIES["summ"] == ["infbench_sum_eng", "multi_lexsum"]
    assert data.CATEGORIES["cite"] == ["alce_asqa", "alce_qampari"]


# ---- HELMET utils.py's calculate_metrics (its ROUGE part; EM, F1 and SubEM are not reported for summarisation) and
# data.py's post-processing, as published

def official_calculate_metrics(prediction, answers):
    from rouge_score import rouge_scorer

    r_scorer = rouge_scorer.RougeScorer(['rougeL', 'rougeLsum'], use_stemmer=True)
    if isinstance(answers, str):
        answers = [answers]
    elif isinstance(answers[0], list):
        answers = [ground_truth for ground_truths_list in answers for ground_truth in ground_truths_list]

    rouges = [r_scorer.score(target=a, prediction=prediction) for a in answers]
    rouge = {}
    for k in r_scorer.rouge_types:
        rouge[k + "_f1"] = max([r[k].fmeasure for r in rouges])
        rouge[k + "_recall"] = max([r[k].recall for r in rouges])
    return {**rouge}


def official_post_process(prediction, answer, system_template):
    """load_multi_lexsum's post_process (system_template "Summary:"); default_post_process (load_infbench's
    summarisation) is the same with parse_output's default prefix "Answer:"."""
    mets = official_calculate_metrics(prediction, answer)
    parsed_pred = parse_output(prediction, system_template)
    if parsed_pred is not None:
        new_mets = official_calculate_metrics(parsed_pred, answer)
        mets = {k: max(v, new_mets[k]) for k, v in mets.items()}
    return mets


@pytest.mark.parametrize(("output", "answers"), [
    ("Summary: the cat sat on a mat.", "The cat sat on the mat."),
    ("Summary:", "A summary."),  # nothing generated
    ("", ["A summary."]),
    ("Summary: first line\nsecond line about the cats\nthird", ["the cats sat", "first line, second line"]),
    ("Summary: tie tie", [["tie one", "one tie"], ["other"]]),  # two answers of the same score
    ("Answer: the plot. Summary: characters", ["The plot and the characters."]),
])
@pytest.mark.parametrize("prefix", ["Summary:", "Answer:"])
def test_rouge_is_helmets(output, answers, prefix):
    assert helmet_summ_metric.summ_scores(output, answers, prefix) == official_post_process(output, answers, prefix)


def test_rouge_pinned():
    """"Summary: the cat sat" against "the cat sat on the mat": raw, LCS 3 of 4 and 6 tokens (F1 0.6); parsed after
    "Summary:", 3 of 3 and 6 (F1 2/3, recall 1/2): the larger of each."""
    scores = helmet_summ_metric.summ_scores("Summary: the cat sat", "the cat sat on the mat", "Summary:")
    assert scores == pytest.approx({"rougeL_f1": 2 / 3, "rougeL_recall": 0.5, "rougeLsum_f1": 2 / 3,
                                    "rougeLsum_recall": 0.5})
    assert helmet_metric.rouge("", "a b")["rougeLsum_f1"] == 0


# ---- HELMET eval_alce.py, as published (its NLI call `_run_nli_autoais` is the argument `nli`; nltk's sent_tokenize
# is the splitter tape uses, `sent_tokenize`)

def remove_citations(sent):
    return re.sub(r"\[\d+", "", re.sub(r" \[\d+", "", sent)).replace(" |", "").replace("]", "")


def exact_presence(short_answers, context):
    n_short_answers = [normalize_answer(sa) for sa in short_answers]
    n_context = normalize_answer(context)

    for ans in n_short_answers:
        if ans in n_context:
            return True

    return False


def compute_str_em(data):
    if 'qa_pairs' not in data[0] or data[0]['qa_pairs'] is None:
        return 0, 0

    acc = []
    hit = []

    for item in data:
        loc_acc = []
        for qa_pair in item['qa_pairs']:
            loc_acc.append(exact_presence(qa_pair['short_answers'], item["output"]))
        acc.append(np.mean(loc_acc))
        hit.append( int(np.mean(loc_acc) == 1) )

    return 100 * np.mean(acc), 100 * np.mean(hit)


def compute_autoais(data, nli, sent_tokenize, qampari=False, at_most_citations=None):
    def _format_document(doc):
        if "sent" in doc:
            return "Title: %s\n%s" % (doc['title'], doc['sent'])  # noqa: UP031
        else:
            return "Title: %s\n%s" % (doc['title'], doc['text'])  # noqa: UP031

    ais_scores = []
    ais_scores_prec = []
    for item in data:
        if qampari:
            sents = [item['question'] + " " + x.strip() for x in item['output'].rstrip().rstrip(".").rstrip(",").split(",")]  # noqa: E501
        else:
            sents = sent_tokenize(item['output'])
            sents = [x for x in sents if len(x.strip()) >= 5]
        if len(sents) == 0:
            continue

        target_sents = [remove_citations(sent).strip() for sent in sents]

        entail = 0
        entail_prec = 0
        total_citations = 0
        for sent_id, sent in enumerate(sents):
            target_sent = target_sents[sent_id]
            joint_entail = -1

            ref = [int(r[1:])-1 for r in re.findall(r"\[\d+", sent)]
            if len(ref) == 0:
                joint_entail = 0
            elif any([ref_id >= len(item['docs']) for ref_id in ref]):
                joint_entail = 0
            else:
                if at_most_citations is not None:
                    ref = ref[:at_most_citations]
                total_citations += len(ref)
                joint_passage = '\n'.join([_format_document(item['docs'][psgs_id]) for psgs_id in ref])

            if joint_entail == -1:
                joint_entail = nli(joint_passage, target_sent)

            entail += joint_entail

            if joint_entail and len(ref) > 1:
                for psgs_id in ref:
                    passage = _format_document(item['docs'][psgs_id])
                    nli_result = nli(passage, target_sent)

                    if not nli_result:
                        subset_exclude = copy.deepcopy(ref)
                        subset_exclude.remove(psgs_id)
                        passage = '\n'.join([_format_document(item['docs'][pid]) for pid in subset_exclude])
                        nli_result = nli(passage, target_sent)
                        if nli_result:
                            flag = 0  # noqa: F841
                        else:
                            entail_prec += 1
                    else:
                        entail_prec += 1
            else:
                entail_prec += joint_entail

        ais_scores.append(entail / len(sents))
        ais_scores_prec.append(entail_prec / total_citations if total_citations > 0 else 0)

    return {
        "citation_rec": 100 * np.mean(ais_scores) if len(ais_scores) > 0 else 0,
        "citation_prec": 100 * np.mean(ais_scores_prec) if len(ais_scores_prec) > 0 else 0,
    }


def compute_qampari_f1(data, cot=False):
    prec = []
    rec = []
    rec_top5 = []
    for item in data:
        o = item['output']
        preds = [normalize_answer(x.strip()) for x in o.rstrip().rstrip(".").rstrip(",").split(",")]
        preds = [p for p in preds if len(p) > 0]
        answers = [[normalize_answer(x) for x in ans] for ans in item['answers']]
        flat_answers = [item for sublist in answers for item in sublist]

        prec.append(sum([p in flat_answers for p in preds]) / len(preds) if len(preds) > 0 else 0)
        rec.append(sum([any([x in preds for x in a]) for a in answers]) / len(answers))
        rec_top5.append(min(5, sum([any([x in preds for x in a]) for a in answers])) / min(5, len(answers)))
    return {"qampari_prec": 100 * np.mean(prec), "qampari_rec": 100 * np.mean(rec),
            "qampari_rec_top5": 100 * np.mean(rec_top5)}


def official_eval_alce(items, qampari, nli, sent_tokenize):
    """eval_alce.main with --citations (eval.py's call) and at_most_citations 3, on eval.py's outputs."""
    data = copy.deepcopy(items)
    for i in range(len(data)):
        data[i]['output'] = re.sub(r"\n+", " ", data[i]['output'])
        data[i]['output'] = data[i]['output'].replace("<|im_end|>", "")
    normalized_data = copy.deepcopy(data)
    for i in range(len(normalized_data)):
        normalized_data[i]['output'] = remove_citations(normalized_data[i]['output'])
    result = {}
    result['str_em'], result['str_hit'] = compute_str_em(normalized_data)
    if qampari:
        result.update(compute_qampari_f1(normalized_data))
    result.update(compute_autoais(data, nli, sent_tokenize, qampari=qampari, at_most_citations=3))
    return result


def stub_nli(passage: str, claim: str) -> int:
    """A hand-made NLI decision: entailed when every word of the claim that names a colour is in the passage."""
    colours = [w for w in re.findall(r"\w+", claim.lower()) if w in ("red", "green", "blue", "black", "white")]
    return int(bool(colours) and all(c in passage.lower() for c in colours))


DOCS = [{"title": "Red", "text": "The box is red."}, {"title": "Green", "text": "The lid is green."},
        {"title": "Blue", "text": "The key is blue."}, {"title": "Plain", "text": "Nothing here."}]
ASQA_OUTPUTS = [
    " The box is red [1]. The lid is green [2].",  # each cited and supported
    " The box is red and the lid is green [1][2][4].",  # joint support; [4] is not needed (over-cited)
    " The box is red [2].",  # cited, not supported
    " The box is red.",  # no citation
    " The box is red [9].",  # a citation beyond the passages
    "",  # nothing generated: "Answer:" alone, no sentence of 5 characters
    " Red [1][2][3][4]. Blue\n\nis the key [3].",  # more than 3 citations (the first 3 kept), new lines
    " The key is blue [3][3]. It is black [1].",  # a passage cited twice; a claim no passage supports
]
QAMPARI_OUTPUTS = [" red [1], green [2], blue [4].", " Red [1], red [1], white.", "", " green [1][2], blue [3]",
                   " black, white, red, green, blue, violet [1].", " red [9],"]


def asqa_row(k: int) -> dict:
    return {"question": f"what colour is thing {k}?", "answer": "The box is red and the lid is green.",
            "qa_pairs": [{"question": "box?", "short_answers": ["red"]}, {"question": "lid?", "short_answers": [
                "green", "Green."]}], "docs": DOCS}


def qampari_row(k: int) -> dict:
    return {"question": f"which colours {k}?", "answers": [["red", "Red"], ["green"], ["blue"], ["black"], ["white"],
                                                             ["violet"]][: 2 + k % 5], "docs": DOCS}


@pytest.mark.parametrize("task", ["alce_asqa", "alce_qampari"])
def test_alce_metrics_are_eval_alces(task):
    """Per-sample scores (with eval.py's "Answer:" put before each completion) averaged as results.json averages them
    equal eval_alce.py's on the same outputs and NLI decisions; a sample without sentences is left out of the
    citation means, as eval_alce leaves it out."""
    from tapecli.data.sentences import sentence_splitter

    qampari = task == "alce_qampari"
    outputs = QAMPARI_OUTPUTS if qampari else ASQA_OUTPUTS
    rows = [(qampari_row if qampari else asqa_row)(k) for k in range(len(outputs))]
    definition = data.TASKS[task]
    calls = []

    def nli(passage, claim):
        calls.append((passage, claim))
        return stub_nli(passage, claim)

    class Evaluation:
        nli_model = "stub"

    Evaluation.nli = staticmethod(nli)
    got = []
    for k, (row, output) in enumerate(zip(rows, outputs, strict=True)):
        scores = helmet_summ_cite.score(Evaluation, definition, {**row, "answer": row.get("answers")}, output, "cpu")
        got.append({"task": task, "length": 4096, "row": k, "input_tokens": 1, "truncated": False, **scores})
    summary = helmet_summ_cite.extend(helmet.summarise(got, [task], [4096]), got, [task], [4096], "stub")
    expected = official_eval_alce([{**r, "output": "Answer:" + o} for r, o in zip(rows, outputs, strict=True)],
                                  qampari, stub_nli, sentence_splitter()[1])
    metric = "qampari_rec_top5" if qampari else "str_em"
    assert summary["scores"][task]["4096"] == round(expected[metric], 2)
    assert summary["citations"][task]["4096"] == {k: round(expected[k], 2) for k in ("citation_rec", "citation_prec")}
    assert summary["categories"]["cite"]["4096"] == round((summary["scores"][task]["4096"] + round(
        expected["citation_rec"], 2) + round(expected["citation_prec"], 2)) / 3, 2)
    assert "notes" not in summary and calls
    if qampari:  # rows 0 and 3: red and green of two answer groups; row 1: red twice, white (k=1: 3 groups)
        # "Answer:" before the completion makes its first answer "answer red": HELMET's scoring of a completion
        assert [r["qampari_rec_top5"] for r in got] == [0.5, 1 / 3, 0.0, 0.2, 1.0, 0.0]
        assert expected["citation_rec"] > 0 and expected["citation_prec"] > 0
    else:
        assert [r["str_em"] for r in got] == [1, 1, 0.5, 0.5, 0.5, 0, 0.5, 0]
        assert got[5]["citation_rec"] == 0 and got[1]["citation_prec"] == pytest.approx(2 / 3)  # "Answer:" alone
        assert got[0]["citation_rec"] == 1 and got[3]["citation_rec"] == 0 and got[4]["citation_rec"] == 0
    without = helmet_summ_cite.extend(helmet.summarise(got, [task], [4096]), got, [task], [4096], None)
    assert "citations" not in without and without["notes"] == [helmet_summ_cite.NO_NLI_NOTE]


def test_citation_formula_pinned_by_hand():
    """ASQA row 1: one sentence citing [1][2][4], jointly entailed (recall 1); [1] and [2] each needed, [4] not: the
    others still entail without it (precision 2 of 3)."""
    split = lambda text: [s for s in re.split(r"(?<=\.) ", text) if s]  # noqa: E731
    rec, prec = helmet_cite_metric.citations("The box is red and the lid is green [1][2][4].", "q", DOCS, stub_nli,
                                             split, False)
    assert (rec, prec) == (1, 2 / 3)
    assert helmet_cite_metric.citations("Red [1]. Green [5].", "q", DOCS, stub_nli, split, False) == (0.5, 1.0)
    assert helmet_cite_metric.citations("No.", "q", DOCS, stub_nli, split, False) == (None, None)
    assert helmet_cite_metric.citations("", "which?", DOCS, stub_nli, split, True) == (0.0, 0)


# ---- HELMET data.py's load_alce, with eval.py's random.seed(42) and shuffle(seed=42).select, as published

def official_load_alce(dataset, rows, demos, shots, max_test_samples):
    import datasets

    random.seed(42)  # eval.py, right before load_data
    instruction = demos["instruction"]
    demo_prompt = demos["demo_prompt"]
    doc_prompt = demos["doc_prompt"]
    user_template = "{demo_text}{instruction}\n\nQuestion: {question}\n\n{context}"
    system_template = "Answer:"
    prompt_template = user_template + "\n\n" + system_template
    data_ = datasets.Dataset.from_list(rows)
    num_docs = int(dataset.split("_")[-1])

    def preprocess_example(example):
        context = "\n\n".join([doc_prompt.format(**d, ID=idx+1) for idx, d in enumerate(example["docs"][:num_docs])])
        demo_text = "\n\n\n".join([
            demo_prompt.format(**demo, instruction=instruction, context = "\n\n".join([doc_prompt.format(**d, ID=idx+1) for idx, d in enumerate(demo["docs"])]))  # noqa: E501
            for demo in random.sample(demos["demos"], shots)
        ])
        if shots > 0:
            demo_text += "\n\n\n"
        return {"context": context, "demo_text": demo_text, "instruction": instruction}
    data_ = data_.map(preprocess_example)
    data_ = data_.shuffle(seed=42).select(range(min(max_test_samples, len(data_))))
    return sorted(prompt_template.format(**d) for d in data_)


def alce_docs(k: int, n: int = 12) -> list[dict]:
    return [{"title": f"Page {k}-{j}", "text": f"Passage {j} of question {k} {{braces}}.", "id": str(j)}
            for j in range(n)]


def write_alce(root, n: int = 7) -> None:
    (root / "alce").mkdir(parents=True, exist_ok=True)
    asqa = [{**asqa_row(k), "docs": alce_docs(k), "sample_id": str(k)} for k in range(n)]
    qampari = [{**qampari_row(k), "docs": alce_docs(k), "id": str(k)} for k in range(n)]
    (root / "alce" / "asqa_eval_gtr_top2000.json").write_text(json.dumps(asqa))
    (root / "alce" / "qampari_eval_gtr_top2000.json").write_text(json.dumps(qampari))


@pytest.mark.parametrize(("task", "shots", "samples"), [("alce_asqa", 2, 4), ("alce_qampari", 2, 100),
                                                         ("alce_asqa", 0, 3), ("alce_qampari", 3, 5)])
def test_alce_rows_demonstrations_and_prompts_are_load_alces(tmp_path, task, shots, samples):
    """The drawn rows, each one's demonstrations (random.sample after random.seed(42), every row in file order) and
    the prompt with 8 passages (HELMET's 4K), against load_alce run on the same file with datasets."""
    write_alce(tmp_path)
    rows = json.loads((tmp_path / "alce" / data.TASKS[task].folder.split("/")[1]).read_text())
    evaluation = helmet.Helmet(str(tmp_path), [task], [4096], samples=samples, shots=shots)
    evaluation.check([])
    got = sorted(data.prompt(data.TASKS[task], s) for s in evaluation.rows[task, 4096].values())
    assert got == official_load_alce(f"{task}_8", rows, helmet_cite.demo_file(task), shots, samples)
    assert len(got) == min(samples, 7) and all(g.count("Document [") == 8 + 5 * shots for g in got)
    assert evaluation.read_files[0].startswith(f"{data.TASKS[task].folder} sha256:")


# ---- HELMET data.py's load_infbench (summarisation), load_multi_lexsum and truncate_llama2, as published, with a
# tiny tokenizer in Llama 2's place and, for Multi-LexSum's demonstrations (an unseeded shuffle in HELMET), the seed
# tape uses

def official_truncate_llama2(max_length, data_, tokenizer, postfix_text=" ... [the rest of the text is omitted]"):
    separator_length = len(tokenizer(postfix_text)["input_ids"])

    def truncate(sample):
        tokens = tokenizer(sample["context"], return_offsets_mapping=True)
        if len(tokens["input_ids"]) > max_length:
            sample["context"] = sample["context"][:tokens["offset_mapping"][max_length-separator_length][1]] + postfix_text  # noqa: E501
        return sample
    return data_.map(truncate)


def official_load_infbench(rows, shots, max_test_samples, length, tokenizer, seed=42):
    import datasets

    data_ = datasets.Dataset.from_list(rows)
    user_template = "You are given a book and you are tasked to summarize it. Write a summary of about 1000 to 1200 words. Only write about the plot and characters of the story. Do not discuss the themes or background of the book. Do not provide any analysis or commentary.\n\n{demo}{context}\n\nNow summarize the book."  # noqa: E501
    system_template = "Summary:"
    prompt_template = user_template + "\n\n" + system_template

    def process_example(example):
        return {"question": example["input"], "demo": ""}
    data_ = data_.map(process_example)

    def add_demos(example):
        demos = data_.filter(lambda x: x["id"] != example["id"]).shuffle(seed=seed).select(range(shots))
        demo = "\n\n".join([f"[story text]\nSummary: {x['answer'][0].strip()}" for x in demos])
        return {"demo": f"For example:\n\n{demo}\n\nNow, read the following story:\n\n"}
    if shots > 0:
        data_ = data_.map(add_demos)
    data_ = data_.filter(lambda x: len(tokenizer(x["context"])['input_ids']) >= 65536)
    data_ = official_truncate_llama2(length - 200 - 1200, data_, tokenizer)
    data_ = data_.shuffle(seed=seed).select(range(min(len(data_), max_test_samples)))
    return sorted(prompt_template.format(**d) for d in data_)


def official_load_multi_lexsum(train, validation, shots, max_samples, length, tokenizer, seed=42):
    import hashlib

    import datasets

    all_data = datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                                     "validation": datasets.Dataset.from_list(validation)})
    all_data = all_data.filter(lambda x: x["summary/short"] is not None)
    user_template = "You are given the legal documents in a civil rights lawsuit, and you are tasked to summarize the case. Write a concise summary of one paragraph (200 to 250 words). The summary should contain a short description of the background, the parties involved, and the outcomes of the case.\n\n{demo}Legal documents:\n{context}\n\nNow please summarize the case."  # noqa: E501
    system_template = "Summary:"
    prompt_template = user_template + "\n\n" + system_template
    train_data = all_data["train"]

    def seeded(x):  # HELMET: train_data.shuffle() (unseeded); tape's seed
        return int(hashlib.sha256(str(x["id"]).encode("utf-8")).hexdigest(), 16) % 2**31

    all_data = all_data.map(lambda x: {
        "context": '\n\n'.join(x["sources"]),
        "demo": "" if shots == 0 else "Example summaries:\n\n" + "\n\n".join(["Summary: {}".format(ex["summary/short"]) for ex in train_data.shuffle(seed=seeded(x)).select(range(shots))]) + "\n\nNow, write a summary of the following legal documents.\n",  # noqa: E501
        "answer": x["summary/short"],
        "question": "",
    })
    test_data = all_data["validation"]
    test_data = test_data.filter(lambda x: len(tokenizer(x["context"])['input_ids']) >= 65536)
    test_data = official_truncate_llama2(length - 300 - 400, test_data, tokenizer)
    if max_samples is not None and len(test_data) > max_samples:
        test_data = test_data.shuffle(seed=seed).select(range(max_samples))
    return sorted(prompt_template.format(**d) for d in test_data)


@pytest.fixture(scope="module")
def truncation_tokenizer(tmp_path_factory):
    """A fast byte-level BPE tokenizer folder standing in for Llama 2's (HELMET's truncation tokenizer)."""
    from hf_helpers import save_bpe_tokenizer

    folder = tmp_path_factory.mktemp("trunc") / "tokenizer"
    save_bpe_tokenizer(folder)
    return folder


def document(k: int, tokens: int) -> str:
    """A document of about `tokens` tokens of the stand-in tokenizer (digits and spaces are single bytes)."""
    return f"Document {k}. " + " ".join(str((k * 7 + j) % 10) for j in range(tokens // 2 + 10))


def write_summ(root, n: int = 5, short: tuple[int, ...] = (1,)) -> None:
    """InfiniteBench's longbook_sum_eng.jsonl and Multi-LexSum's splits; the rows in `short` under 65,536 tokens
    (HELMET drops them), Multi-LexSum's row 2 without a short summary (dropped too)."""
    (root / "infinitebench").mkdir(parents=True, exist_ok=True)
    (root / "multi_lexsum").mkdir(parents=True, exist_ok=True)
    books = [{"id": k, "context": document(k, 2000 if k in short else 66000), "input": "", "options": [],
              "answer": [f" The book {k} tells of box {k}. "]} for k in range(n)]
    (root / "infinitebench" / "longbook_sum_eng.jsonl").write_text("".join(json.dumps(b) + "\n" for b in books))
    train = [{"id": f"t{k}", "sources": ["a"], "summary/short": f"Case t{k} was settled." if k != 1 else None,
              "summary/long": "x"} for k in range(6)]
    cases = [{"id": f"v{k}", "sources": [document(k, 2000 if k in short else 33000)] * 2,
              "summary/short": f"Case {k} was won." if k != 2 else None, "summary/long": "y"} for k in range(n)]
    for split, rows in (("train", train), ("validation", cases)):
        (root / "multi_lexsum" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize(("task", "shots", "samples", "length"), [
    ("infbench_sum_eng", 2, 3, 4096), ("infbench_sum_eng", 0, 100, 2048), ("multi_lexsum", 2, 100, 2048),
    ("multi_lexsum", 1, 2, 4096)])
def test_summarisation_rows_demonstrations_cuts_and_prompts_are_helmets(tmp_path, truncation_tokenizer, task, shots,
                                                                        samples, length):
    """The kept rows (65,536 tokens or more; Multi-LexSum: with a short summary), the draw, the demonstrations and the
    document cut by the truncation tokenizer to length - 1,400 (- 700) tokens with HELMET's suffix, against the
    loaders run on the same files with datasets."""
    from transformers import AutoTokenizer

    write_summ(tmp_path / "data")
    tok = AutoTokenizer.from_pretrained(truncation_tokenizer)
    evaluation = helmet.Helmet(str(tmp_path / "data"), [task], [length], samples=samples, shots=shots,
                               truncation_tokenizer=str(truncation_tokenizer))
    evaluation.check([])
    got = sorted(data.prompt(data.TASKS[task], s) for s in evaluation.rows[task, length].values())
    read = lambda name: [json.loads(x) for x in (tmp_path / "data" / name).read_text().splitlines()]  # noqa: E731
    if task == "infbench_sum_eng":
        expected = official_load_infbench(read("infinitebench/longbook_sum_eng.jsonl"), shots, samples, length, tok)
    else:
        expected = official_load_multi_lexsum(read("multi_lexsum/train.jsonl"), read("multi_lexsum/validation.jsonl"),
                                              shots, samples, length, tok)
    assert got == expected and len(got) == min(samples, 4 if task == "infbench_sum_eng" else 3)
    budget = length - helmet_summ.RESERVED[task]
    for s in evaluation.rows[task, length].values():
        assert s["context"].endswith(helmet_cut.SUFFIX) and len(tok(s["context"])["input_ids"]) <= budget + 1
    assert ("For example:" in got[0] or "Example summaries:" in got[0]) == (shots > 0)


def test_summarisation_and_citations_with_a_stand_in_model(tmp_path, monkeypatch, trained, truncation_tokenizer):
    """The stand-in writes the reference summary (even rows) or "nothing" (odd ones), and ALCE answers naming the
    first short answer with citation [1]: ROUGE and STR-EM worked out by hand, HELMET's generation lengths, the notes
    (no judge, no NLI) in results.json and the printed summary; bad lengths and files are one line each."""
    from tapecli.data.tokenizer import ByteTokenizer

    write_summ(tmp_path / "data")
    write_alce(tmp_path / "data")
    tok = ByteTokenizer()
    seen = []

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, **_):
        outs = []
        for p in prompts:
            text = tok.decode(p)
            seen.append(max_new_tokens)
            if text.endswith("Summary:"):
                k = int(re.findall(r"Document (\d+)\.", text)[-1])
                reply = f" Case {k} was won." if "Legal documents" in text else f" The book {k} tells of box {k}."
                reply = reply if k % 2 == 0 else " nothing"
            else:
                reply = " red [1], green [2]." if "which colours" in text else " The box is red [1]."
            outs.append((tok.encode(reply) + stop_tokens + [pad_id] * max_new_tokens)[:max_new_tokens])
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    evaluation = helmet.Helmet(str(tmp_path / "data"), ["summ", "cite"], [4096], samples=3,
                               truncation_tokenizer=str(truncation_tokenizer))
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=2, show_progress=False)
    m = report.results["helmet"]["models"][0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert seen == [1200] * 3 + [400] * 3 + [300] * 6
    assert m["truncated"] == 12  # the documents (~2,700 tokens) and ALCE's two long demonstrations, in bytes
    summ = {r["row"]: r for r in rows if r["task"] == "multi_lexsum"}
    assert sorted(summ) == [0, 3, 4] and summ[0]["rougeLsum_f1"] == 1.0 and summ[3]["rougeLsum_f1"] == 0.0
    assert m["scores"]["multi_lexsum"]["4096"] == round(100 * (1 + 0 + 1) / 3, 2)
    book = {r["row"]: r["rougeLsum_f1"] for r in rows if r["task"] == "infbench_sum_eng"}
    # load_infbench parses after "Answer:", so "Summary:" stays: 7 of 8 tokens match the 7 of the reference
    assert len(book) == 3 and all(v == pytest.approx(14 / 15 if k % 2 == 0 else 0.0) for k, v in book.items())
    assert m["rougeL_f1"]["multi_lexsum"]["4096"] == 66.67
    assert m["scores"]["alce_asqa"]["4096"] == 50.0  # red found, green not
    assert m["scores"]["alce_qampari"]["4096"] == round(100 * sum(1 / min(5, 2 + k % 5) for k in helmet.draw(7, 3))
                                                        / 3, 2)  # "answer red" (after "Answer:") misses; green hits
    assert m["categories"]["cite"]["4096"] == round((m["scores"]["alce_asqa"]["4096"]
                                                     + m["scores"]["alce_qampari"]["4096"]) / 2, 2)
    assert m["notes"] == [helmet_summ_cite.JUDGE_NOTE, helmet_summ_cite.NO_NLI_NOTE]
    printed = evaluation.summary(report.results)
    assert helmet_summ_cite.JUDGE_NOTE in printed and helmet_summ_cite.NO_NLI_NOTE in printed
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    assert settings["truncation_tokenizer"] == str(truncation_tokenizer) and settings["nli_model"] is None
    for lengths, fragment in [([1400], "infbench_sum_eng keeps 1400 tokens"), ([3000], "alce_asqa has passage counts")]:
        bad = helmet.Helmet(str(tmp_path / "data"), ["infbench_sum_eng" if lengths[0] == 1400 else "alce_asqa"],
                            lengths, truncation_tokenizer=str(truncation_tokenizer))
        with pytest.raises(Exception, match=fragment):
            bad.check([])
    with pytest.raises(Exception, match="no multi_lexsum/train.jsonl; save the train and validation splits"):
        helmet.Helmet(str(tmp_path / "out"), ["multi_lexsum"], [4096],
                      truncation_tokenizer=str(truncation_tokenizer)).check([])


# ---- a tiny random T5 as the NLI model: real loading, tokenising and generation (its decisions are arbitrary)

def make_tiny_t5(folder) -> None:
    """A 1-layer T5 with random weights (seed 11: it answers "1" for some inputs, something else for others) and a
    word-level tokenizer of seven tokens, saved with save_pretrained."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    words = ["<pad>", "</s>", "<unk>", "0", "1", "a", "b"]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
                            ).save_pretrained(folder)
    torch.manual_seed(11)
    config = T5Config(vocab_size=len(words), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1,
                      num_heads=2, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1)
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nli") / "t5"
    make_tiny_t5(folder)
    return folder


def test_the_nli_model_runs_alces_call(tiny_t5):
    """NliModel's decision is ALCE's: greedy generate(max_new_tokens=10) of "premise: ... hypothesis: ...", 1 exactly
    when the decoded text is "1" (checked against the same model called by hand), on ten inputs of its words."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    nli = helmet_cite_metric.NliModel(str(tiny_t5), "cpu")
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_t5, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(tiny_t5, use_fast=False)
    rng = random.Random(0)
    pairs = [(" ".join(rng.choice("ab01") for _ in range(rng.randint(3, 30))),
              " ".join(rng.choice("ab01") for _ in range(rng.randint(1, 4)))) for _ in range(10)]
    decisions = []
    for passage, claim in pairs:
        ids = tokenizer(f"premise: {passage} hypothesis: {claim}", return_tensors="pt").input_ids
        text = tokenizer.decode(model.generate(ids, max_new_tokens=10)[0], skip_special_tokens=True)
        decisions.append(int(text == "1"))
    assert [nli(p, c) for p, c in pairs] == decisions
    assert 0 < sum(decisions) < len(decisions)  # both answers occur, so both branches of the scorer run


@pytest.mark.slow
def test_the_command_on_a_tape_run_with_the_nli_model(tmp_path, trained, truncation_tokenizer, tiny_t5):
    """The trained tape run summarises Multi-LexSum and answers ALCE at 2,048 tokens (documents cut by the truncation
    tokenizer, prompts by the model's); the tiny T5 scores citations; a rerun after a lost last row redoes only that
    row; offline, HELMET's default truncation tokenizer and a hub NLI model are each one line saying what to pass."""
    root = tmp_path / "HELMET" / "data"
    write_summ(root)
    write_alce(root)
    out = tmp_path / "out"
    args = ["eval", "helmet", "--model", str(trained()), "--data", str(tmp_path / "HELMET"), "--tasks",
            "multi_lexsum,cite", "--lengths", "4k", "--samples", "2", "--shots", "1", "--truncation-tokenizer",
            str(truncation_tokenizer), "--nli-model", str(tiny_t5), "--device", "cpu", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| summ |" in result.output and "| cite |" in result.output and helmet_summ_cite.JUDGE_NOTE in result.output
    lines = (out / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == 6 and all(r["citation_rec"] is None or 0 <= r["citation_rec"] <= 1 for r in rows[2:])
    results = json.loads((out / "results.json").read_text())
    m = results["models"][0]
    assert set(m["citations"]) == {"alce_asqa", "alce_qampari"} and m["notes"] == [helmet_summ_cite.JUDGE_NOTE]
    assert results["settings"]["nli_model"] == str(tiny_t5)
    (out / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().splitlines() == lines
    model = str(trained())
    for n, (extra, fragment) in enumerate([
            (["--tasks", "multi_lexsum"], "--truncation-tokenizer meta-llama/Llama-2-7b-hf cannot be read from the "
                                          "Hugging Face hub (offline, unreachable or gated); pass a folder"),
            (["--tasks", "multi_lexsum", "--truncation-tokenizer", str(tmp_path)], "no tokenizer.json there"),
            (["--tasks", "alce_asqa", "--nli-model", "google/t5_xxl_true_nli_mixture"],
             "--nli-model google/t5_xxl_true_nli_mixture cannot be read from the Hugging Face hub (offline or "
             "unreachable); pass a folder holding a copy")]):
        where = tmp_path / f"x{n}"
        one_line_error(runner.invoke(app, ["eval", "helmet", "--model", model, "--device", "cpu", "--data",
                                           str(tmp_path / "HELMET"), "--lengths", "4k", "--samples", "1", "--out",
                                           str(where), *extra]), 2, fragment)
        assert not where.exists()


@pytest.mark.slow
def test_the_results_pages_summarisation_and_citation_files_are_helmets_layout(tmp_path):
    """scripts/long_benchmark_samples.py (docs/results/long-benchmarks-cpu.md) writes the summarisation and citation
    files where `tape eval helmet` looks for them, documents long enough for HELMET's filter, each ALCE answer in a
    passage, and a byte-level truncation tokenizer."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "long_benchmark_samples.py"
    subprocess.run([sys.executable, str(script), str(tmp_path)], check=True, capture_output=True)
    evaluation = helmet.Helmet(str(tmp_path / "helmet" / "data"), ["summ", "cite"], [4096], samples=8,
                               truncation_tokenizer=str(tmp_path / "helmet" / "byte-tokenizer"))
    evaluation.check([])
    assert all(len(evaluation.chosen[t, 4096]) == 8 for t in evaluation.tasks)
    tokenizer = helmet_cut.load_tokenizer(str(tmp_path / "helmet" / "byte-tokenizer"))
    assert len(tokenizer("héllo")["input_ids"]) == len("héllo".encode())  # one token per byte
    for task in ("infbench_sum_eng", "multi_lexsum"):
        budget = 4096 - helmet_summ.RESERVED[task]
        # truncate_llama2 keeps the text up to the end of token budget - len(suffix) (counted with Llama 2's BOS):
        # without a BOS, budget + 1 tokens with the suffix
        cut = [len(tokenizer(s["context"])["input_ids"]) for s in evaluation.rows[task, 4096].values()]
        assert cut == [budget + 1] * 8
    for s in evaluation.rows["alce_asqa", 4096].values():
        word = s["question"].removeprefix("What colour is the ").removesuffix(" box?")
        colour = s["qa_pairs"][0]["short_answers"][0]
        assert any(d["text"].startswith(f"The {word} box is {colour} ") for d in s["docs"])
    for s in evaluation.rows["alce_qampari", 4096].values():
        name = s["question"].removeprefix("Which boxes does ").removesuffix(" keep?")
        assert len(s["answers"]) == sum(d["text"].endswith(f"kept by {name}.") for d in s["docs"])
