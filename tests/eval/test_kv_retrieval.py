"""`tape eval kv-retrieval`: the lost-in-the-middle prompt equal to the official test's, seeded examples, gold
positions spread as the paper spreads them, accuracy worked out by hand with a stand-in model, and the real command on
a tape run and a Hugging Face Llama."""

from __future__ import annotations

import json
import re

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import kv_retrieval as kv
from tapecli.errors import TapeError
from tapecli.eval import kv_retrieval
from tapecli.eval.protocol import run

runner = CliRunner()
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


def test_the_prompt_is_the_official_one():
    """prompts/test_prompting.py's test_get_kv_retrieval_prompt, with its data and its expected text."""
    data = [("test key1", "test value1"), ("test key2", "test value2"), ("test key3", "test value3")]
    assert kv.prompt(data, "test key2") == "\n".join([
        "Extract the value corresponding to the specified key in the JSON object below.", "", "JSON data:",
        '{"test key1": "test value1",', ' "test key2": "test value2",', ' "test key3": "test value3"}', "",
        'Key: "test key2"', "Corresponding value:"])


def test_examples_are_seeded_uuid_pairs_and_the_gold_pair_moves_alone():
    ex = kv.example(20, 3, seed=0)
    assert ex == kv.example(20, 3, seed=0) and ex != kv.example(20, 3, seed=1) and ex != kv.example(20, 4, seed=0)
    assert len(ex.records) == len({k for k, _ in ex.records}) == 20 and (ex.key, ex.value) in ex.records
    assert all(UUID.fullmatch(k) and UUID.fullmatch(v) for k, v in ex.records)
    for position in (0, 7, 19):
        moved = kv.at_position(ex, position)
        assert moved[position] == (ex.key, ex.value)
        assert [r for r in moved if r[0] != ex.key] == [r for r in ex.records if r[0] != ex.key]
    assert kv.correct(ex.value, f"  {ex.value.upper()} is the value") and not kv.correct(ex.value, ex.key)


def test_gold_positions_are_spread_evenly_as_in_the_paper():
    assert kv.gold_positions(75, 4) == [0, 24, 49, 74]
    assert kv.gold_positions(140, 5) == [0, 34, 69, 104, 139]
    assert kv.gold_positions(300, 7) == [0, 49, 99, 149, 199, 249, 299]
    for k, n in [(10, 4), (37, 6), (4, 4), (1000, 11)]:
        positions = kv.gold_positions(k, n)
        gaps = [b - a for a, b in zip(positions, positions[1:], strict=False)]
        assert positions[0] == 0 and positions[-1] == k - 1 and len(positions) == n
        assert max(gaps) - min(gaps) <= 1, (k, n, positions)
    with pytest.raises(TapeError, match="--positions: between 1 and the number of pairs"):
        kv.gold_positions(4, 5)
    with pytest.raises(TapeError, match="--keys: at least 2 pairs"):
        kv.gold_positions(1, 1)
    with pytest.raises(TapeError, match=r"^--keys: pass at least one number of pairs, e.g. 75,140,300$"):
        kv_retrieval.KvRetrieval([]).check([])
    evaluation = kv_retrieval.KvRetrieval([300, 75, 140, 75, 10])
    evaluation.check([])  # the paper's positions for its k, else 5
    assert evaluation.gold == {10: [0, 2, 4, 7, 9], 75: [0, 24, 49, 74], 140: [0, 34, 69, 104, 139],
                               300: [0, 49, 99, 149, 199, 249, 299]}


def test_accuracy_with_a_stand_in_model_equals_the_hand_computed_one(tmp_path, monkeypatch, trained):
    """Right only when the gold pair is first: per k, 1 of 3 positions (33.33); the U-curve's cells 100, 0, 0."""
    def answer(opened, prompts, batch_size, max_new_tokens, stop_check=None):
        assert max_new_tokens == 100
        out = []
        for p in prompts:
            first = re.search(r'\{"[^"]+": "([^"]+)"', p)[1]
            gold = re.search(r'Key: "([^"]+)"', p)[1]
            out.append(first if p.index(f'"{gold}"') < p.index('",\n') else "no")
        return out

    monkeypatch.setattr("tapecli.eval.common.generate_texts", answer)
    report = run(kv_retrieval.KvRetrieval([4, 6], 3, 2), [str(trained())], tmp_path / "kv", device="cpu",
                 show_progress=False)
    m = report.results["kv-retrieval"]["models"][0]
    assert m["accuracy"] == {"4": {"0": 100.0, "1": 0.0, "3": 0.0}, "6": {"0": 100.0, "2": 0.0, "5": 0.0}}
    assert m["by_keys"] == {"4": 33.33, "6": 33.33} and m["effective_length"] is None
    assert m["effective_length_nolima"] == 6 and m["effective_length_nolima_tokens"] == m["mean_prompt_tokens"]["6"]
    for name in ("kv-retrieval.png", "u-curve-4.png", "u-curve-6.png", "heatmap.png"):
        assert (tmp_path / "kv" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    out = tmp_path / "kv"
    args = ["eval", "kv-retrieval", "--model", str(trained()), "--model", str(tiny_hf_llama), "--keys", "2,3",
            "--positions", "2", "--samples", "1", "--device", "cpu", "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| 3 pairs |" in result.output and "gold position" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 and {(r["keys"], r["position"]) for r in rows} == {(2, 0), (2, 1), (3, 0), (3, 2)}
    # Both models read the same examples (one seed), each with its own tokenizer.
    assert {r["value"] for r in rows if r["model"] == 0} == {r["value"] for r in rows if r["model"] == 1}
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["positions"] == {"2": [0, 1], "3": [0, 2]}
    for extra, fragment in [(["--keys", "1"], "--keys: at least 2 pairs"),
                            (["--keys", "4", "--positions", "9"], "--positions: between 1 and the number of pairs"),
                            (["--keys", "x"], "--keys: expected comma-separated ints"),
                            (["--samples", "0"], "'--samples': Input should be greater than or equal to 1")]:
        one_line_error(runner.invoke(app, ["eval", "kv-retrieval", "--model", str(trained()), "--out",
                                           str(tmp_path / "bad"), *extra]), 2, fragment)
        assert not (tmp_path / "bad").exists()
