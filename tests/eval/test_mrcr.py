"""`tape eval mrcr`: the dataset card's grading function (written out here from its published source) on hand-made
responses, the transcript and the bins, the scores with a stand-in model worked out by hand, and the real command on
a tape run and a Hugging Face Llama reading tiny parquet files in MRCR's released layout."""

from __future__ import annotations

import json
from difflib import SequenceMatcher

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import mrcr as data
from tapecli.errors import TapeError
from tapecli.eval import mrcr
from tapecli.eval.protocol import run

runner = CliRunner()


def official_grade(response, answer, random_string_to_prepend) -> float:
    """The `grade` of the openai/mrcr dataset card (README.md), as published."""
    if not response.startswith(random_string_to_prepend):
        return 0
    response = response.removeprefix(random_string_to_prepend)
    answer = answer.removeprefix(random_string_to_prepend)
    return float(SequenceMatcher(None, response, answer).ratio())


@pytest.mark.parametrize(("response", "answer", "prefix"), [
    ("aYooSG8CQgA poem about tapirs.", "aYooSG8CQgA poem about tapirs.", "aYooSG8CQg"),  # exact
    ("aYooSG8CQgA poem about frogs.", "aYooSG8CQgA poem about tapirs.", "aYooSG8CQg"),  # near miss
    ("A poem about tapirs.", "aYooSG8CQgA poem about tapirs.", "aYooSG8CQg"),  # the hash missing: 0
    (" aYooSG8CQgA poem.", "aYooSG8CQgA poem.", "aYooSG8CQg"),  # not at the start: 0
    ("aYooSG8CQ", "aYooSG8CQgA poem.", "aYooSG8CQg"),  # the hash cut short: 0
    ("", "aYooSG8CQgA poem.", "aYooSG8CQg"),  # empty response: 0
    ("aYooSG8CQg", "aYooSG8CQgA poem.", "aYooSG8CQg"),  # the hash alone: ratio of "" and the text, 0
    ("aYooSG8CQg", "aYooSG8CQg", "aYooSG8CQg"),  # both empty after the hash: SequenceMatcher says 1
    ("xyA poem", "A poem", ""),  # no hash given: the plain ratio
    ("aYooSG8CQgaYooSG8CQgA poem.", "aYooSG8CQgA poem.", "aYooSG8CQg"),  # removeprefix strips one hash only
])
def test_grade_equals_the_dataset_cards_function(response, answer, prefix):
    assert mrcr.grade(response, answer, prefix) == official_grade(response, answer, prefix)


def test_grade_pinned_values():
    assert mrcr.grade("h1abcd", "h1abcd", "h1") == 1.0
    assert mrcr.grade("h1abcd", "h1abce", "h1") == 0.75  # 2 x 3 matching / 8
    assert mrcr.grade("abcd", "h1abcd", "h1") == 0.0 and mrcr.grade("", "h1", "h1") == 0.0


def test_transcript_and_bins():
    chat = [{"role": "user", "content": "write a poem about tapirs"}, {"role": "assistant", "content": "Tapirs."},
            {"role": "user", "content": "Prepend h1 to the 1st (1 indexed) poem about tapirs."}]
    assert data.transcript(chat) == ("User: write a poem about tapirs\n\nAssistant: Tapirs.\n\n"
                                     "User: Prepend h1 to the 1st (1 indexed) poem about tapirs.\n\nAssistant:")
    assert data.BINS[0] == 4096 and data.BINS[-1] == 1048576 and len(data.BINS) == 9  # the 8 official bins
    assert [data.bin_of(n, [0, 100, 200]) for n in (0, 1, 100, 101, 200, 201)] == [None, 100, 100, 200, 200, None]
    with pytest.raises(TapeError, match="row 3: its prompt must be a JSON list"):
        data.messages({"prompt": json.dumps([{"role": "robot", "content": "x"}])}, 3)


TOPICS = ["poem about tapirs", "blog post about rocks", "riddle about owls", "song about rain"]


def conversation(needles: int, k: int, turns: int) -> dict:
    """An MRCR row: `turns` requests of which `needles` ask for the same thing; the question asks for its 2nd."""
    messages, answers = [], []
    for t in range(turns):
        ask = TOPICS[0] if t % max(1, turns // needles) == 0 and len(answers) < needles else TOPICS[1 + t % 3]
        reply = f"reply {k}.{t} on {ask}" + " and more" * k
        messages += [{"role": "user", "content": f"write a {ask}"}, {"role": "assistant", "content": reply}]
        if ask == TOPICS[0]:
            answers.append(reply)
    prefix = f"H{k:02d}x{needles}"
    messages.append({"role": "user", "content": f"Prepend {prefix} to the 2nd (1 indexed) {TOPICS[0]}. Do not "
                                                "include any other text in your response."})
    return {"prompt": json.dumps(messages), "answer": prefix + answers[1], "random_string_to_prepend": prefix,
            "n_needles": needles, "desired_msg_index": 3, "total_messages": len(messages),
            "n_chars": sum(len(m["content"]) for m in messages)}


def write_mrcr(folder, per_set: int = 3, turns=(4, 12, 20)) -> None:
    """MRCR's released layout: {2,4,8}needle/{n}needle_0.parquet and _1.parquet (pyarrow, as the hub stores them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for needles in (2, 4, 8):
        rows = [conversation(needles, k, turns[k % len(turns)] + needles) for k in range(per_set)]
        (folder / f"{needles}needle").mkdir(parents=True)
        for shard in (0, 1):
            part = rows[shard::2]
            pq.write_table(pa.Table.from_pylist(part), folder / f"{needles}needle" / f"{needles}needle_{shard}.parquet")


def test_scores_with_a_stand_in_model_equal_the_hand_computed_ones(tmp_path, monkeypatch, trained):
    """The stand-in answers every 2-needle row exactly (then runs on into a next "User:" turn, which is cut), writes
    4-needle answers without the hash and running on (cut at twice the answer's tokens), and 8-needle ones with a
    changed last character."""
    write_mrcr(tmp_path / "mrcr")
    seen = {}

    def answer(model, prompts, max_new_tokens, batch_size=8, stop_tokens=None, pad_id=None, stop_check=None, **_):
        from tapecli.data.tokenizer import ByteTokenizer

        tok = ByteTokenizer()
        outs = []
        for p in prompts:
            text = tok.decode(p)
            prefix = text.split("Prepend ")[-1].split(" ")[0]
            row = next(r for r in seen["rows"] if r["random_string_to_prepend"] == prefix)
            body = row["answer"].removeprefix(prefix)
            reply = {2: " " + prefix + body + "\nUser: write a", 4: body + "z" * 999,
                     8: prefix + body[:-1] + "#"}[row["n_needles"]]
            assert stop_check(tok.encode(reply)) == ("\nUser:" in reply)
            outs.append((tok.encode(reply) + stop_tokens + [pad_id] * max_new_tokens)[:max_new_tokens])
        return outs

    monkeypatch.setattr("tapecli.eval.common.generate_batch", answer)
    evaluation = mrcr.Mrcr(str(tmp_path / "mrcr"), [2, 4, 8], [0, 1024, 2048, 3072])
    evaluation.check([])
    seen["rows"] = evaluation.rows
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=2, show_progress=False)
    m = report.results["mrcr"]["models"][0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and {r["needles"] for r in rows} == {2, 4, 8}
    eight = [r for r in rows if r["needles"] == 8]
    ratios = [official_grade(r["response"], evaluation.rows[r["row"]]["answer"], r["prefix"]) for r in eight]
    assert all(0.9 < x < 1 for x in ratios) and [r["score"] for r in eight] == ratios
    assert m["by_needles"] == {"2": 100.0, "4": 0.0, "8": round(100 * sum(ratios) / 3, 2)}
    assert m["missing_hash"] == round(100 * 3 / 9, 2) and m["rows"] == 9
    assert all(len(r["response"]) == 2 * r["answer_tokens"] for r in rows if r["needles"] == 4)  # cut at its budget
    for r in rows:  # the bin of every row is that of its prompt + answer tokens
        assert r["tokens"] == r["prompt_tokens"] + r["answer_tokens"]
        assert data.bin_of(r["tokens"], [0, 1024, 2048, 3072]) == r["bin"]
    assert {b for cells in m["counts"].values() for b in cells} == {str(r["bin"]) for r in rows}
    # A row's answer is what it generates alone: batched with a longer answer's row, it is still cut at its own budget.
    from tapecli.store.door import open_model

    opened = open_model(str(trained()), device="cpu")
    evaluation.prepare(opened)
    short, long = (next(r for r in rows if r["needles"] == n and r["row"] % 3 == k) for n, k in ((4, 0), (8, 2)))
    assert long["answer_tokens"] > short["answer_tokens"]
    again = evaluation.evaluate(opened, [(4, short["bin"], short["row"]), (8, long["bin"], long["row"])])
    assert again == [{k: v for k, v in r.items() if k != "model"} for r in (short, long)]
    assert (tmp_path / "out" / "mrcr.png").read_bytes()[:4] == b"\x89PNG"
    # --samples keeps each cell's first rows in file order; a cell is (needles, bin)
    capped = mrcr.Mrcr(str(tmp_path / "mrcr"), [2], [0, 3072], samples=2)
    capped.check([])
    report = run(capped, [str(trained())], tmp_path / "capped", device="cpu", show_progress=False)
    files_order = [r["row"] for r in map(json.loads, (tmp_path / "capped" / "samples.jsonl").read_text().splitlines())]
    assert files_order == [0, 1]  # 2needle_0.parquet's first rows (k = 0, 2), then _1.parquet's (k = 1) is left


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """Two real models answer real conversations; a rerun after a lost last row redoes only that row; bad input is
    one line before anything is written; without --data (offline) one sentence says what to pass."""
    write_mrcr(tmp_path / "mrcr", per_set=2, turns=(3, 5))
    out = tmp_path / "out"
    args = ["eval", "mrcr", "--model", str(trained()), "--model", str(tiny_hf_llama), "--data", str(tmp_path / "mrcr"),
            "--needles", "2,4", "--bins", "0,256,1k", "--device", "cpu", "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| 2 needles |" in result.output and "lack the hash" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {r["model"] for r in rows} == {0, 1} and {r["needles"] for r in rows} == {2, 4}
    assert all(0 <= r["score"] <= 1 and r["bin"] in (256, 1024) for r in rows)
    assert all(len(r["response"]) <= 4 * 2 * r["answer_tokens"] for r in rows)  # bytes <= 4 x tokens, 2 x answer
    results = json.loads((out / "results.json").read_text())
    assert [m["kind"] for m in results["models"]] == ["tape", "hf"] and results["settings"]["bins"] == [0, 256, 1024]
    assert len(results["settings"]["data"]["files"]) == 6 and (out / "mrcr.png").is_file()
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")  # the last row lost, as after a kill
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().splitlines() == lines
    model = str(trained())
    for extra, fragment in [(["--needles", "3"], "--needles: comma-separated numbers among 2, 4, 8"),
                            (["--bins", "4k"], "--bins: at least two edges"),
                            (["--bins", "0,2"], "no MRCR conversation of 2, 4, 8 needles falls in --bins 0,2"),
                            (["--data", str(tmp_path / "none")], "no such file or folder; download the parquet"),
                            ([], "openai/mrcr cannot be read from the Hugging Face hub (offline or unreachable); "
                                 "download the parquet files")]:
        where = tmp_path / f"x{len(extra)}{extra[:1]}"
        one_line_error(runner.invoke(app, ["eval", "mrcr", "--model", model, "--device", "cpu", "--out",
                                           str(where), *(extra if extra[:1] == ["--data"] or not extra else
                                                         ["--data", str(tmp_path / "mrcr"), *extra])]), 2, fragment)
        assert not where.exists()
