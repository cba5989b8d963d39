"""SCROLLS: reading the official zip layout, example construction, the official metric, and the CLI end to end."""

from __future__ import annotations

import json
import re
import zipfile

import pytest
from scrolls_helpers import qa_rows, write_scrolls_zip
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import scrolls
from tapecli.data.scrolls import Budgets, encode_example, group_examples, load_split, prompt_ids, target_ids
from tapecli.data.text import IGNORE_INDEX
from tapecli.data.tokenizer import load_tokenizer, train_tokenizer
from tapecli.errors import TapeError
from tapecli.eval import scrolls as scrolls_eval
from tapecli.eval import scrolls_metric as metric

runner = CliRunner()


@pytest.fixture(scope="module")
def sp(tmp_path_factory: pytest.TempPathFactory):
    """A real SentencePiece tokenizer (pad id 0, so the official pad id, vocab_size - 1, differs from it)."""
    root = tmp_path_factory.mktemp("sp_corpus")
    words = "the report says that budget funds were spent on roads schools and water in every county".split()
    (root / "a.txt").write_text("\n".join(" ".join(words[i:] + words[:i]) + "." for i in range(len(words))) * 20)
    model = train_tokenizer(str(root), vocab_size=400, out=str(tmp_path_factory.mktemp("sp") / "t.model"))
    return load_tokenizer(model)


# --- metric -------------------------------------------------------------------------------------------------


DOC_PREDICTIONS = {"a": "exact match example", "b": "hello there", "c": "general kenobi"}
DOC_REFERENCES = {"a": ["exact match example"], "b": ["hello", "hi there"], "c": ["commander kenobi"]}


@pytest.mark.parametrize(("task", "expected"), [
    ("gov_report", {"rouge/rouge1": 72.2222, "rouge/rouge2": 33.3333, "rouge/rougeL": 72.2222,
                    "rouge/rougeLsum": 72.2222, "rouge/geometric_mean": 55.8136, "scrolls_score": 55.8136}),
    ("contract_nli", {"exact_match": 33.3333, "scrolls_score": 33.3333}),
    ("narrative_qa", {"f1": 72.2222, "scrolls_score": 72.2222}),
])
def test_official_docstring_examples(task, expected):
    """The worked examples in the official metric's docstring (tau/scrolls metrics/scrolls.py)."""
    result = metric.score_predictions(task, DOC_PREDICTIONS, DOC_REFERENCES)
    assert {k: result[k] for k in expected} == expected
    assert result["num_predicted"] == 3 and result["mean_prediction_length_characters"] == 14.6667


def test_squad_normalisation_f1_and_exact_match():
    assert metric.normalize_answer("  The Cat's  hat, a   DOG!") == "cats hat dog"
    assert metric.token_f1("The cat sat.", "a cat sat down") == pytest.approx(0.8)  # P 1, R 2/3
    assert metric.token_f1("the cat cat cat", "cat cat dog") == pytest.approx(2 / 3)  # multiset overlap: 2
    assert metric.token_f1("", "") == 0.0 and metric.token_f1("yes", "no") == 0.0
    assert metric.exact_match("The Answer!", "answer") == 1.0 and metric.exact_match("answer", "answers") == 0.0
    # several references per id: the best one counts; mean over ids x100
    predictions = {"a": "blue whale", "b": "Yes", "c": "forty two"}
    references = {"a": ["whale", "The blue whale.", "red"], "b": ["no", "yes."], "c": ["42"]}
    assert metric.score_predictions("qasper", predictions, references)["f1"] == 66.6667
    assert metric.score_predictions("quality", predictions, references)["exact_match"] == 66.6667
    assert metric.score_predictions("quality", {"a": "x", "b": "y", "c": "42"}, references)["scrolls_score"] == 33.3333


def test_rouge_takes_each_keys_best_reference_then_the_geometric_mean_of_means():
    predictions = {"x": "the cat sat on the mat", "y": "alpha beta gamma delta"}
    references = {"x": ["the cat is on the mat"],
                  "y": ["alpha beta gamma delta omega omega omega omega", "delta gamma beta alpha"]}
    # x: R1 = R-L = 5/6, R2 = 3/5. y: R1 = 1 (second ref), R2 = 0.6 and R-L = 2/3 (first ref: P 1, R 3/7 and 1/2)
    r1, r2, rl = (5 / 6 + 1) / 2 * 100, 60.0, (5 / 6 + 2 / 3) / 2 * 100
    result = metric.score_predictions("qmsum", predictions, references)
    assert (result["rouge/rouge1"], result["rouge/rouge2"], result["rouge/rougeL"]) == (
        round(r1, 4), round(r2, 4), round(rl, 4))
    assert result["scrolls_score"] == result["rouge/geometric_mean"] == round((r1 * r2 * rl) ** (1 / 3), 4) == 74.4403


def test_rouge_1_2_l_do_not_depend_on_sentence_splitting():
    """Only ROUGE-Lsum reads the newlines the splitter adds, so the score is the same with any splitter."""
    from rouge_score import rouge_scorer  # imports nltk (~2.5 s): here, not when the file is collected

    prediction = "The budget grew. Mr. Smith said roads were built! Were schools built? Yes, in 2019."
    reference = "Roads were built, Mr. Smith said. The budget grew in 2019. Schools too."
    ours = metric.rouge_scores(prediction, [reference])
    plain = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"]).score(reference, prediction)
    for key in ("rouge1", "rouge2", "rougeL"):
        assert ours[key] == pytest.approx(plain[key].fmeasure * 100)
    assert metric.rouge_text("One here. Two there! Three?") == "One here.\nTwo there!\nThree?"


def test_missing_or_extra_ids_are_one_line_errors():
    with pytest.raises(TapeError, match="no prediction for id 'c'"):
        metric.score_predictions("qasper", {"a": "x", "b": "y"}, DOC_REFERENCES)
    with pytest.raises(TapeError, match="id 'zz' is not in the references"):
        metric.score_predictions("qasper", {**DOC_PREDICTIONS, "zz": "x"}, DOC_REFERENCES)
    with pytest.raises(TapeError, match="not a string"):
        metric.score_predictions("qasper", {**DOC_PREDICTIONS, "a": 3}, DOC_REFERENCES)


# --- data ---------------------------------------------------------------------------------------------------


def test_reads_the_official_zip_layout_and_groups_references(tmp_path):
    path = write_scrolls_zip(tmp_path / "data")
    for source in (str(path), str(path.parent)):
        rows = load_split("qasper", "validation", source)
        assert len(rows) == 6 and rows[0] == qa_rows("validation")[0]
    examples = group_examples(rows)
    assert [(e.id, e.row, e.references) for e in examples] == [
        (f"validation-{q}", 2 * q, [f"{q + 1}", f"the number {q + 1}"]) for q in range(3)]
    assert all(not e.references for e in group_examples(load_split("qasper", "test", str(path))))
    # an unpacked zip works too
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(path).extractall(unpacked)
    assert load_split("qasper", "train", str(unpacked))["id"] == [r["id"] for r in qa_rows("train", 12)]


def test_data_mistakes_are_one_line_errors(tmp_path):
    path = write_scrolls_zip(tmp_path / "data")
    cases = [
        (("qasper", "validation", None), "download https://huggingface.co/datasets/tau/scrolls/resolve/main/"
                                         "qasper.zip and pass the file or its folder"),
        (("gov_report", "validation", str(path)), "validation.jsonl not found"),
        (("gov_report", "validation", str(tmp_path)), "holds neither gov_report.zip"),
        (("qasper", "dev", str(path)), "unknown SCROLLS split 'dev'"),
        (("qaspr", "validation", str(path)), "unknown SCROLLS task 'qaspr'"),
        (("qasper", "validation", str(tmp_path / "nope.zip")), "does not exist"),
    ]
    # an empty member, and fields that are not text (issue 34: a traceback and "generator raised StopIteration")
    numbers = [{**row, "input": 5} for row in qa_rows("validation")]
    number_outputs = [{**row, "output": 7} for row in qa_rows("validation")]
    for name, rows in (("empty", []), ("numbers", numbers), ("number_outputs", number_outputs)):
        write_scrolls_zip(tmp_path / name, rows={"train": qa_rows("train"), "validation": rows})
    cases += [
        (("qasper", "validation", str(tmp_path / "empty")), f"validation.jsonl in {tmp_path / 'empty'} is empty"),
        (("qasper", "validation", str(tmp_path / "numbers")), "has field 'input' of type int64, expected text"),
        (("qasper", "validation", str(tmp_path / "number_outputs")), "has field 'output' of type int64"),
    ]
    for args, message in cases:
        with pytest.raises(TapeError) as info:
            load_split(*args)
        assert message in str(info.value) and "\n" not in str(info.value)
    assert len(load_split("qasper", "train", str(tmp_path / "empty"))) == 6  # the other members still read


def test_budgets_scale_with_seq_len():
    assert Budgets.for_task("qasper", 8192) == Budgets(prompt=7991, target=200)  # official: 7,991 + 200 + EOS
    assert Budgets.for_task("gov_report", 8192) == Budgets(prompt=7191, target=1000)  # 7,184 + 7, 1,000 + EOS
    assert Budgets.for_task("contract_nli", 1024) == Budgets(prompt=998, target=25)
    assert Budgets.for_task("qmsum", 1024) == Budgets(prompt=898, target=125)
    with pytest.raises(TapeError, match="data.seq_len"):
        Budgets.for_task("qasper", 8)


def test_qa_example_construction_and_masking(sp):
    text = "the report says that budget funds were spent on roads " * 40
    budgets = Budgets.for_task("qasper", 64)  # prompt 61, target 2
    assert budgets == Budgets(61, 2)
    prompt = prompt_ids(sp, "qasper", text, budgets)
    assert prompt == [sp.bos_id, *sp.encode(text)][:61]
    assert target_ids(sp, "roads and schools", budgets) == [*sp.encode("roads and schools")[:2], sp.eos_id]
    assert target_ids(sp, "roads", budgets, "official") == [sp.bos_id, *sp.encode("roads")[:1], sp.eos_id]

    for compat, pad in (("clean", sp.pad_id), ("official", sp.vocab_size - 1)):
        inputs, labels = encode_example(sp, "qasper", "what was built?\n\nroads", "roads and schools", 64, compat)
        prompt = prompt_ids(sp, "qasper", "what was built?\n\nroads", budgets, compat)
        target = target_ids(sp, "roads and schools", budgets, compat)
        seq = prompt + target
        assert len(inputs) == len(labels) == 64
        assert inputs == seq[:-1] + [pad] * (65 - len(seq))
        # only the target (and EOS) is learned: label t is the token after input t
        assert labels == [IGNORE_INDEX] * (len(prompt) - 1) + target + [IGNORE_INDEX] * (65 - len(seq))
    assert pad != sp.pad_id


def test_summary_prompts_keep_the_instruction(sp):
    text = "the report says that budget funds were spent on roads schools and water " * 30
    budgets = Budgets.for_task("gov_report", 256)  # target 31, prompt 224
    clean = prompt_ids(sp, "gov_report", text, budgets)
    suffix = sp.encode(scrolls.SUMMARY_SUFFIX)
    assert len(clean) == 224 and clean[0] == sp.bos_id and clean[-len(suffix):] == suffix
    assert clean[1 : 224 - len(suffix)] == sp.encode(scrolls.SUMMARY_PREFIX + text)[: 223 - len(suffix)]
    official = prompt_ids(sp, "gov_report", text, budgets, "official")
    full = [sp.bos_id, *sp.encode(scrolls.SUMMARY_PREFIX + text + scrolls.SUMMARY_SUFFIX)]
    assert official == full[: 224 - 7] + full[-7:]
    short = prompt_ids(sp, "gov_report", "roads.", budgets, "official")
    assert short == [sp.bos_id, *sp.encode(scrolls.SUMMARY_PREFIX + "roads." + scrolls.SUMMARY_SUFFIX)]


def test_recipe_keys():
    from tapecli.recipe import load_recipe

    recipe = load_recipe("scrolls", ["data.task=gov_report", "data.compat=official", "data.seq_len=1024",
                                     "model.max_seq_len=1024"])
    assert (recipe.data.kind, recipe.data.task, recipe.data.compat, recipe.data.source) == (
        "scrolls", "gov_report", "official", None)
    with pytest.raises(TapeError, match="data.task: unknown SCROLLS task 'qa'"):
        load_recipe("scrolls", ["data.task=qa"])
    with pytest.raises(TapeError, match="data.compat"):
        load_recipe("scrolls", ["data.compat=paper"])


# --- end to end ---------------------------------------------------------------------------------------------


# scrolls-smoke fine-tunes a checkpoint and takes its model from it; trained from scratch here, a tiny model
# (the recipe alone would build the paper's 12 x 768 default)
SMALL = ("model.n_layers=2", "model.dim=32", "model.n_heads=2")


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_train_then_eval_scrolls_from_the_cli(tmp_path):
    data_dir = tmp_path / "scrolls"
    write_scrolls_zip(data_dir)
    run = tmp_path / "ft"
    invoke("pretrain", "--recipe", "scrolls-smoke", "--out", str(run), f"data.source={data_dir}", *SMALL,
           "train.max_steps=2", "train.save_every=2")
    out = invoke("eval", "scrolls", "--model", str(run), "--task", "qasper", "--data", str(data_dir),
                 "--batch-size", "2")
    assert "QAS F1" in out
    eval_dir = run / "eval-scrolls" / "qasper-validation"
    predictions = json.loads((eval_dir / "predictions.json").read_text())
    assert list(predictions) == ["validation-0", "validation-1", "validation-2"]
    assert all(isinstance(p, str) for p in predictions.values())
    results = json.loads((eval_dir / "results.json").read_text())
    assert results["score_key"] == "f1" and results["scrolls_score"] == results["f1"]
    assert results["settings"]["max_new_tokens"] == 3 and results["settings"]["compat"] == "clean"
    samples = [json.loads(line) for line in (eval_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["id"] for s in samples] == list(predictions)
    assert all(s["new_tokens"] <= 3 and s["prompt_tokens"] <= 124 for s in samples)

    # batching (left padding + attention mask) changes speed, not the answers
    invoke("eval", "scrolls", "--model", str(run), "--task", "qasper", "--data", str(data_dir), "--batch-size", "1",
           "--out", str(tmp_path / "one-by-one"))
    assert json.loads((tmp_path / "one-by-one" / "qasper-validation" / "predictions.json").read_text()) == predictions

    # the score recomputed from predictions.json alone is the same
    scored = json.loads(invoke("eval", "scrolls", "--task", "qasper", "--predictions",
                               str(eval_dir / "predictions.json"), "--data", str(data_dir)))
    assert scored["scrolls_score"] == results["scrolls_score"]

    # resuming keeps finished examples: drop the last one, rerun, get the same files back
    lines = (eval_dir / "samples.jsonl").read_text().splitlines(keepends=True)
    (eval_dir / "samples.jsonl").write_text("".join(lines[:-1]) + lines[-1][:10])
    invoke("eval", "scrolls", "--model", str(run), "--task", "qasper", "--data", str(data_dir))
    assert json.loads((eval_dir / "predictions.json").read_text()) == predictions
    assert json.loads((eval_dir / "results.json").read_text())["scrolls_score"] == results["scrolls_score"]

    # a predictions file with a missing id is one line, exit code 2
    del predictions["validation-1"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(predictions))
    result = runner.invoke(app, ["eval", "scrolls", "--task", "qasper", "--predictions", str(bad),
                                 "--data", str(data_dir)])
    assert result.exit_code == 2 and "no prediction for id 'validation-1'" in result.output


def test_scoring_a_predictions_file_writes_results_to_out(tmp_path):
    """`--predictions P --out O` writes O/results.json (what it prints), as every evaluation writes its results."""
    data_dir = tmp_path / "scrolls"
    write_scrolls_zip(data_dir)
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({"validation-0": "1", "validation-1": "the number 2", "validation-2": "4"}))
    args = ["eval", "scrolls", "--task", "qasper", "--predictions", str(predictions), "--data", str(data_dir)]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)  # stdout stays one JSON document; the note on the file goes to stderr
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert written == printed and f"wrote results.json to {tmp_path / 'out'}" in result.stderr
    assert written["predictions"] == str(predictions.resolve()) and written["num_predicted"] == 3
    assert written["scrolls_score"] == pytest.approx(200 / 3)  # two of three answers match a reference exactly
    assert json.loads(runner.invoke(app, args).output) == printed  # without --out: printed only
    (tmp_path / "file.txt").write_text("keep me\n")
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "file.txt")])
    assert bad.exit_code == 2 and "is a file" in bad.output


def test_eval_scrolls_usage_errors(tmp_path):
    for args, message in [([], "pass --task"), (["--task", "qasper"], "pass --model"),
                          (["--task", "qasper", "--compat", "x", "--model", "m"], "--compat"),
                          (["--task", "nope", "--model", str(tmp_path)], "unknown SCROLLS task 'nope'")]:
        result = runner.invoke(app, ["eval", "scrolls", *args])
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.slow
def test_all_tasks_table_official_compat_and_seeded_sampling(tmp_path):
    data_dir = tmp_path / "scrolls"
    small = {"train": qa_rows("train", 4), "validation": qa_rows("validation", 4)}
    for task in scrolls.TASKS:
        write_scrolls_zip(data_dir, task, small)
    run = tmp_path / "ft"
    invoke("pretrain", "--recipe", "scrolls-smoke", "--out", str(run), f"data.source={data_dir}", *SMALL,
           "data.task=gov_report", "data.compat=official", "train.max_steps=1", "train.save_every=1")
    for task in scrolls.TASKS:  # one fine-tuned model per task, as in the paper: runs/ft-{task}
        (tmp_path / f"ft-{task}").symlink_to(run)
    out = tmp_path / "table"
    printed = invoke("eval", "scrolls", "--all-tasks", "--model", str(tmp_path / "ft-{task}"), "--model",
                     str(run / "checkpoints" / "step-00000001"), "--data", str(data_dir), "--limit", "1",
                     "--out", str(out))
    header = ["model", "QAS F1", "CNLI EM", "NQA F1", "QuAL EM", "QMS Rgm", "SumS Rgm", "GovR Rgm"]
    assert "| " + " | ".join(header) + " |" in printed.splitlines()
    rows = [line for line in printed.splitlines() if line.startswith(("| ft-{task} |", "| step-00000001 |"))]
    assert len(rows) == 2 and all(len(re.findall(r"\| \d+\.\d\d", row)) == 7 for row in rows)  # 7 task columns
    assert scrolls_eval.table(["a/ft-{task}", "b/ft-{task}"], [[{"task": "qasper", "scrolls_score": 1.234}]] * 2,
                              ["qasper"]) == (header[:2], [["a/ft-{task}", "1.23"], ["b/ft-{task}", "1.23"]])
    for model_dir in out.iterdir():
        assert sorted(p.name for p in model_dir.iterdir()) == sorted(f"{t}-validation" for t in scrolls.TASKS)
        results = json.loads((model_dir / "gov_report-validation" / "results.json").read_text())
        # the run was fine-tuned with compat official, so its evaluation builds prompts the same way
        assert results["settings"]["compat"] == "official" and results["num_predicted"] == 1
        assert results["score_key"] == "rouge/geometric_mean" and "rouge/rougeLsum" in results

    # --sample: summaries drawn with top-k 3, seeded per example, so batching does not change them
    runs = []
    for batch_size, name in (("1", "a"), ("2", "b")):
        invoke("eval", "scrolls", "--model", str(run), "--task", "qmsum", "--data", str(data_dir), "--sample",
               "--seed", "3", "--batch-size", batch_size, "--out", str(tmp_path / name))
        runs.append(json.loads((tmp_path / name / "qmsum-validation" / "results.json").read_text()))
        assert runs[-1]["settings"]["decoding"] == {"sample": True, "temperature": 1.0, "top_k": 3, "seed": 3}
    predictions = [(tmp_path / n / "qmsum-validation" / "predictions.json").read_text() for n in "ab"]
    assert predictions[0] == predictions[1]


@pytest.mark.slow
def test_eval_of_a_hugging_face_llama_equals_transformers_greedy_generate(tmp_path):
    """Answers of a real HF Llama directory (Llama-2-style SentencePiece tokenizer) equal transformers' own greedy
    decoding of the same prompts, batched with left padding; the official compat pads with vocab_size - 1."""
    import torch

    pytest.importorskip("transformers")
    from hf_helpers import make_hf_llama

    from tapecli.store.door import open_model

    hf = make_hf_llama(tmp_path / "hf", tokenizer="sp", max_position_embeddings=256, vocab=60)  # = the SP vocab
    summaries = {"validation": [{**row, "output": f"summary {i}"} for i, row in enumerate(qa_rows("validation"))]}
    data_dir = tmp_path / "scrolls"
    write_scrolls_zip(data_dir, "gov_report", summaries)
    invoke("eval", "scrolls", "--model", str(tmp_path / "hf"), "--task", "gov_report", "--data", str(data_dir),
           "--seq-len", "256", "--compat", "official", "--batch-size", "3", "--out", str(tmp_path / "out"))
    eval_dir = tmp_path / "out" / "gov_report-validation"
    results = json.loads((eval_dir / "results.json").read_text())
    assert results["settings"]["compat"] == "official" and results["settings"]["max_new_tokens"] == 31
    predictions = json.loads((eval_dir / "predictions.json").read_text())
    lines = (eval_dir / "samples.jsonl").read_text().splitlines()
    samples = {row["id"]: row for row in map(json.loads, lines)}
    tok = open_model(str(tmp_path / "hf")).tokenizer
    budgets = Budgets.for_task("gov_report", 256)
    rows = load_split("gov_report", "validation", str(data_dir))
    for example in group_examples(rows):
        prompt = prompt_ids(tok, "gov_report", rows[example.row]["input"], budgets, "official")
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=31, do_sample=False, eos_token_id=tok.eos_id,
                              pad_token_id=tok.eos_id)[0, len(prompt):].tolist()
        assert predictions[example.id] == scrolls_eval.decode_answer(tok, out) and max(out) < tok.vocab_size
        assert samples[example.id]["new_tokens"] == (out.index(tok.eos_id) if tok.eos_id in out else len(out))
    assert any(predictions.values())
