"""`tape eval longbench-v2`: the official prompts, answer extraction, truncation and result.py's accuracy (written out
here from THUDM/LongBench's pred.py and result.py) on hand-made data, the chain-of-thought's two steps with a stand-in
model, and the real command on a tape run and a Hugging Face Llama reading a tiny data.json."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import longbench_v2 as data
from tapecli.eval import longbench_v2 as lb
from tapecli.eval.protocol import run

runner = CliRunner()

# THUDM/LongBench main, prompts/0shot.txt, 0shot_cot.txt and 0shot_cot_ans.txt, as published.
TEMPLATE_0SHOT = ('Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\nWhat is '
                  'the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n'
                  'Format your response as follows: "The correct answer is (insert answer here)".')
TEMPLATE_0SHOT_COT = ('Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\n'
                      'What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n'
                      '(D) $C_D$\n\nLet’s think step by step:')
TEMPLATE_0SHOT_COT_ANS = ('Please read the following text and answer the questions below.\n\nThe text is too long and '
                          'omitted here.\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n'
                          '(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nLet’s think step by step: $COT$\n\nBased on the above, '
                          'what is the single, most likely answer choice? Format your response as follows: "The '
                          'correct answer is (insert answer here)".')


def official_prompt(template, item, cot=None):
    """pred.py's get_pred: the chain of replaces."""
    prompt = template.replace('$DOC$', item['context'].strip()).replace('$Q$', item['question'].strip()).replace(
        '$C_A$', item['choice_A'].strip()).replace('$C_B$', item['choice_B'].strip()).replace(
        '$C_C$', item['choice_C'].strip()).replace('$C_D$', item['choice_D'].strip())
    return prompt if cot is None else prompt.replace('$COT$', cot)


def official_extract_answer(response):
    """pred.py's extract_answer."""
    response = response.replace('*', '')
    match = re.search(r'The correct answer is \(([A-D])\)', response)
    if match:
        return match.group(1)
    else:
        match = re.search(r'The correct answer is ([A-D])', response)
        if match:
            return match.group(1)
        else:
            return None


def official_result(pred_data, compensated):
    """result.py's loop for one file: Overall, Easy, Hard, Short, Medium, Long."""
    easy, hard, short, medium, long = 0, 0, 0, 0, 0
    easy_acc, hard_acc, short_acc, medium_acc, long_acc = 0, 0, 0, 0, 0
    for pred in pred_data:
        acc = int(pred['judge'])
        if compensated and pred["pred"] == None:  # noqa: E711 -- as published
            acc = 0.25
        if pred["difficulty"] == "easy":
            easy += 1
            easy_acc += acc
        else:
            hard += 1
            hard_acc += acc
        if pred['length'] == "short":
            short += 1
            short_acc += acc
        elif pred['length'] == "medium":
            medium += 1
            medium_acc += acc
        else:
            long += 1
            long_acc += acc
    return [round(100 * (easy_acc + hard_acc) / len(pred_data), 1), round(100 * easy_acc / easy, 1),
            round(100 * hard_acc / hard, 1), round(100 * short_acc / short, 1), round(100 * medium_acc / medium, 1),
            round(100 * long_acc / long, 1)]


def item(k: int, context: str = "", answer: str = "B", difficulty: str = "easy", length: str = "short") -> dict:
    return {"_id": f"id{k:03d}", "domain": "Single-Document QA", "sub_domain": "Academic", "difficulty": difficulty,
            "length": length, "question": f" Which colour is box {k}? ", "choice_A": "red", "choice_B": " blue ",
            "choice_C": "green", "choice_D": "black", "answer": answer,
            "context": context or f"Box {k} is blue. " * 3}


def test_the_prompts_are_the_official_ones():
    row = item(1, context="  The $Q$ marker, and $C_A$ too.  ")  # pred.py replaces in order: the context's markers too
    assert data.fill(data.ZERO_SHOT, row) == official_prompt(TEMPLATE_0SHOT, row)
    assert data.fill(data.COT, row) == official_prompt(TEMPLATE_0SHOT_COT, row)
    assert data.fill(data.COT_ANSWER, row, "First, $C_B$.") == official_prompt(TEMPLATE_0SHOT_COT_ANS, row,
                                                                                "First, $C_B$.")
    assert "Which colour is box 1? marker, and red too." in data.fill(data.ZERO_SHOT, row)


@pytest.mark.parametrize("response", [
    "The correct answer is (B)", "**The correct answer is (C)**", "The correct answer is D.", "The correct answer is A",
    "the correct answer is (A)", "The correct answer is (E)", "", "The answer is (B)",
    "The correct answer is (A). No wait, The correct answer is (B).",  # two answers: the first
    "The correct answer is B, or maybe The correct answer is (C)",  # the parenthesised form wins over an earlier bare
    "The correct answer is **(D)**", "The correct answer is  (A)",
])
def test_answer_extraction_is_the_official_one(response):
    assert lb.extract_answer(response) == official_extract_answer(response)


def test_answer_extraction_pinned():
    assert [lb.extract_answer(r) for r in ("The correct answer is B, or maybe The correct answer is (C)",
                                           "The correct answer is **(D)**", "", "The correct answer is (E)")] == \
        ["C", "D", None, None]


@pytest.mark.parametrize("max_len", [5, 6, 9])
def test_truncation_keeps_both_ends_as_pred_py(max_len):
    ids = list(range(20))
    assert lb.middle_cut(ids, max_len) == ids[:max_len // 2] + ids[-max_len // 2:]
    assert len(lb.middle_cut(ids, max_len)) == max_len and lb.middle_cut(ids[:max_len], max_len) == ids[:max_len]


def test_accuracy_is_result_pys():
    rows = []
    for difficulty, length, pred, answer in [
            ("easy", "short", "B", "B"), ("easy", "medium", None, "A"), ("hard", "long", "C", "C"),
            ("hard", "short", "A", "D"), ("easy", "long", None, "B"), ("hard", "medium", "D", "D"),
            ("hard", "weird", "B", "B")]:  # result.py: any length but short and medium counts as long
        rows.append({"difficulty": difficulty, "length": length, "pred": pred, "judge": pred == answer})
    for compensated in (False, True):
        got = lb.accuracy(rows, compensated)
        assert [got[c] for c in lb.COLUMNS] == official_result(rows, compensated)
    assert lb.accuracy(rows) == {"overall": 57.1, "easy": 33.3, "hard": 75.0, "short": 50.0, "medium": 50.0,
                                 "long": 66.7}
    assert lb.accuracy(rows, True)["overall"] == 64.3  # (4 + 2 x 0.25) / 7
    assert lb.accuracy(rows[:1])["hard"] is None  # result.py divides by zero here; tape leaves the group empty


def write_data(path, n: int = 6, long_context: int = 0) -> list[dict]:
    rows = [item(k, answer="ABCD"[k % 4], difficulty=("easy", "hard")[k % 2], length=("short", "medium", "long")[k % 3],
                 context=("word " * long_context) if long_context and k == 0 else "") for k in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows), encoding="utf-8")
    return rows


def test_chain_of_thought_with_a_stand_in_model(tmp_path, monkeypatch, trained):
    """Step one reads the chain-of-thought prompt, cut in the middle to --max-length; step two reads the answer
    prompt with the stripped chain; the stand-in then answers A for every question, and is right on those whose
    answer is A. The first question's context is long: its prompt is cut, keeping both ends."""
    from tapecli.data.tokenizer import ByteTokenizer

    write_data(tmp_path / "data.json", n=6, long_context=300)
    tok = ByteTokenizer()
    seen = []

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, **_):
        outs = []
        for p in prompts:
            assert len(p) <= 400
            text = tok.decode(p)
            seen.append((max_new_tokens, text, p))
            reply = "  because box.  " if text.endswith("think step by step:") else "The correct answer is (A)"
            outs.append((tok.encode(reply) + stop_tokens + [pad_id] * max_new_tokens)[:max_new_tokens])
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    evaluation = lb.LongBenchV2(str(tmp_path / "data.json"), cot=True, max_length=400)
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=4, show_progress=False)
    m = report.results["longbench-v2-cot"]["models"][0]  # its own name: its own default folder
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [r["pred"] for r in rows] == ["A"] * 6 and [r["judge"] for r in rows] == [k % 4 == 0 for k in range(6)]
    assert rows[0]["truncated"] and not any(r["truncated"] for r in rows[1:]) and rows[0]["prompt_tokens"] > 400
    assert all(r["response_cot"] == "because box." for r in rows)
    budgets = [b for b, _, _ in seen]
    assert budgets == [1024] * 4 + [128] * 4 + [1024] * 2 + [128] * 2  # two batches, each its two steps
    full = data.fill(data.COT, item(0, context="word " * 300, answer="A"))
    ids = tok.encode(full, add_special_tokens=True)
    assert len(ids) > 400 and seen[0][2] == ids[:200] + ids[-200:]  # both ends kept, BOS included
    assert "Let’s think step by step: because box.\n\nBased on the above" in seen[4][1]
    assert m["accuracy"] == dict(zip(lb.COLUMNS, official_result(rows, False), strict=True))
    assert m["unanswered"] == 0 and m["truncated"] == 1 and m["max_length"] == 400
    assert (tmp_path / "out" / "longbench-v2.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """Two real models answer real prompts; a rerun after a lost last row redoes only that row; bad input is one line
    before anything is written; without --data (offline) one sentence says what to pass."""
    write_data(tmp_path / "lb" / "data.json", n=3)
    out = tmp_path / "out"
    args = ["eval", "longbench-v2", "--model", str(trained()), "--model", str(tiny_hf_llama), "--data",
            str(tmp_path / "lb"), "--max-length", "24", "--device", "cpu", "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| model | Overall | Easy | Hard | Short | Medium | Long | unanswered |" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["model"] for r in rows} == {0, 1} and all(r["truncated"] for r in rows)
    assert all(r["judge"] == (r["pred"] == r["answer"]) for r in rows)
    results = json.loads((out / "results.json").read_text())
    assert [m["kind"] for m in results["models"]] == ["tape", "hf"] and results["settings"]["cot"] is False
    assert results["settings"]["data"]["files"][0].startswith("data.json sha256:")
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().splitlines() == lines
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{**item(0), "answer": 3}]))
    model = str(trained())
    for n, (extra, fragment) in enumerate([(["--data", str(bad)], "row 0 lacks the field 'answer' (str)"),
                            (["--data", str(tmp_path / "none.json")], "no such file or folder; download data.json"),
                            (["--data", str(tmp_path / "lb")], "max_seq_len 64 leaves no room for a prompt beside "
                                                               "128 generated tokens; pass --max-length"),
                            ([], "THUDM/LongBench-v2 cannot be read from the Hugging Face hub (offline or "
                                 "unreachable); download data.json")]):
        where = tmp_path / f"x{n}"
        one_line_error(runner.invoke(app, ["eval", "longbench-v2", "--model", model, "--device", "cpu", "--out",
                                           str(where), *extra]), 2, fragment)
        assert not where.exists()


def test_the_results_pages_sample_files_are_read_by_both_evaluations(tmp_path):
    """scripts/long_benchmark_samples.py (docs/results/long-benchmarks-cpu.md) writes MRCR's, LongBench v2's and
    NoLiMa's released formats, every file the same bytes for the same seed."""
    import subprocess
    import sys
    from pathlib import Path

    from tapecli.data import mrcr, nolima

    script = Path(__file__).parents[2] / "scripts" / "long_benchmark_samples.py"
    for out in ("a", "b"):
        subprocess.run([sys.executable, str(script), str(tmp_path / out)], check=True, capture_output=True)
    conversations, _ = mrcr.read(str(tmp_path / "a" / "mrcr"))
    questions, described = data.read(str(tmp_path / "a" / "longbench-v2"))
    assert [r["n_needles"] for r in conversations] == [2] * 12 + [4] * 12 + [8] * 12 and len(questions) == 24
    assert {(r["difficulty"], r["length"]) for r in questions} == {(d, n) for d in ("easy", "hard")
                                                                   for n in ("short", "medium", "long")}
    for row in conversations:  # the answer is the asked-for needle's reply, hash first
        chat = mrcr.messages(row)
        assert row["answer"] == row["random_string_to_prepend"] + chat[row["desired_msg_index"]]["content"]
    assert described["files"] == data.read(str(tmp_path / "b" / "longbench-v2"))[1]["files"]
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) > 40 and files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*")
                                               if p.is_file())
    assert [f for f in files if (tmp_path / "a" / f).read_bytes() != (tmp_path / "b" / f).read_bytes()] == []
    experiments, _ = nolima.needle_set(str(tmp_path / "a" / "nolima" / "needle_set.json"))
    tests = nolima.expand(experiments)
    assert len(tests) == 6 and {t.question_type for t in tests} == {"onehop", "twohop"}
    assert tests[0].needle == "Actually, {CHAR} lives next to the Semper Opera House."
    assert [b[0] for b in nolima.haystacks(str(tmp_path / "a" / "nolima" / "books"))] == ["rand_book_1", "rand_book_2"]
