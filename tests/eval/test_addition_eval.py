"""`tape eval addition` and `tape demo`: exact-match rule, files written, resume, train-then-evaluate end to end."""

from __future__ import annotations

import json
from operator import itemgetter
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError
from tapecli.eval.addition import AdditionEvalSettings, evaluate_addition
from tapecli.model import ModelConfig, Transformer

runner = CliRunner()
TOK = CharTokenizer("addition")


class Oracle(torch.nn.Module):
    """Answers by reading the prompt; `mistake` turns the right answer into a specific wrong one."""

    def __init__(self, mistake: str = "") -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))  # evaluate_addition asks the parameters for the device
        self.mistake = mistake

    def generate(self, input_ids, max_new_tokens, stop_tokens, pad_id, **_):
        rows = []
        for prompt in input_ids.tolist():
            a, b = TOK.decode(prompt).rstrip("=").split("+")
            answer = TOK.encode(str(int(a[::-1]) + int(b[::-1]))[::-1]) + [TOK.eos_id]
            if self.mistake == "no-eos":
                answer = answer[:-1] + [TOK.encode("0")[0]] * 5
            elif self.mistake == "extra-digit":
                answer = answer[:-1] + TOK.encode("0") + [TOK.eos_id]
            rows.append(prompt + (answer + [pad_id] * max_new_tokens)[:max_new_tokens])
        return torch.tensor(rows)


def tiny_model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=TOK.vocab_size, dim=32, n_layers=1, n_heads=2, pe="rope", max_seq_len=64))


def read_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("mistake", "accuracy"), [("", 1.0), ("no-eos", 0.0), ("extra-digit", 0.0)])
def test_exact_match_needs_the_whole_answer_then_eos(tmp_path, mistake, accuracy):
    settings = AdditionEvalSettings(max_len=4, samples=3, train_digits=2)
    results = evaluate_addition(Oracle(mistake), TOK, settings, tmp_path, show_progress=False)
    assert results["mean_accuracy"] == results["in_box_accuracy"] == results["out_of_box_accuracy"] == accuracy
    for row in read_rows(tmp_path):
        assert row["gold"] == str(row["a"] + row["b"])
        assert (row["prediction"] == row["gold"]) == (mistake == "")


def test_results_files_and_recomputed_accuracy(tmp_path):
    """The numbers in results.json follow from samples.jsonl; operands have exactly the cell's lengths."""
    settings = AdditionEvalSettings(max_len=4, samples=3, train_digits=2, pe="rope")
    results = evaluate_addition(tiny_model(), TOK, settings, tmp_path, batch_size=7, show_progress=False)
    assert json.loads((tmp_path / "results.json").read_text()) == results
    assert (tmp_path / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = read_rows(tmp_path)
    assert len(rows) == 4 * 4 * 3
    assert all(len(str(r["a"])) == r["i"] and len(str(r["b"])) == r["j"] for r in rows)
    assert results["mean_accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / len(rows))
    inside = [r["correct"] for r in rows if r["i"] <= 2 and r["j"] <= 2]
    assert results["in_box_accuracy"] == pytest.approx(sum(inside) / len(inside))
    for r in rows:
        assert results["grid"][r["i"] - 1][r["j"] - 1] == pytest.approx(
            sum(x["correct"] for x in rows if (x["i"], x["j"]) == (r["i"], r["j"])) / 3)
    assert results["settings"]["samples"] == 3 and "protocol" in results


def test_interrupted_evaluation_resumes_without_redoing_cells(tmp_path, monkeypatch):
    settings = AdditionEvalSettings(max_len=4, samples=3, train_digits=2)
    # batch_size == samples: one cell per batch, so an interrupted run batches exactly like an uninterrupted one.
    reference = evaluate_addition(tiny_model(), TOK, settings, tmp_path / "ref", batch_size=3, show_progress=False)

    model, calls = tiny_model(), []
    original = model.generate

    def interrupted_after_five_cells(input_ids, **kwargs):
        calls.append(input_ids)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return original(input_ids, **kwargs)

    monkeypatch.setattr(model, "generate", interrupted_after_five_cells)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        evaluate_addition(model, TOK, settings, out, batch_size=3, show_progress=False)
    assert len(read_rows(out)) == 5 * 3 and not (out / "results.json").exists()
    with (out / "samples.jsonl").open("a") as f:
        f.write('{"i": 4, "j": 1, "a": 12')  # a row cut off mid-write

    calls.clear()
    monkeypatch.setattr(model, "generate", lambda input_ids, **kw: calls.append(input_ids) or original(input_ids, **kw))
    resumed = evaluate_addition(model, TOK, settings, out, batch_size=3, show_progress=False)
    assert len(calls) == 16 - 5  # only the unfinished cells
    assert resumed["grid"] == reference["grid"]
    key = itemgetter("i", "j", "a", "b")
    assert sorted(read_rows(out), key=key) == sorted(read_rows(tmp_path / "ref"), key=key)

    with pytest.raises(TapeError, match="other settings"):
        evaluate_addition(model, TOK, AdditionEvalSettings(max_len=4, samples=4), out, show_progress=False)


@pytest.mark.slow
def test_train_then_evaluate_from_the_command_line(tmp_path):
    from tapecli.recipe import load_recipe
    from tapecli.train.engine import pretrain

    run = pretrain(load_recipe("arithmetic-smoke", ["model.pe=rope"]), tmp_path / "run")
    result = runner.invoke(app, ["eval", "addition", "--checkpoint", str(run), "--max-len", "6"])
    assert result.exit_code == 0, result.output
    out = run / "eval-addition" / "step-00000004"  # the default --out
    results = json.loads((out / "results.json").read_text())
    # The training box and the samples per cell come from the run's recipe (max_digits 5, eval.samples 2).
    assert results["settings"]["train_digits"] == 5 and results["settings"]["samples"] == 2
    assert len(results["grid"]) == 6 and results["out_of_box_accuracy"] is not None
    assert len(read_rows(out)) == 6 * 6 * 2 and (out / "heatmap.png").is_file()
    assert "mean accuracy" in result.output

    # Several models: one folder each, their heat-maps side by side in the comparison folder.
    result = runner.invoke(app, ["eval", "addition", "-c", str(run), "-c", str(run), "--max-len", "3", "--out",
                                 str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    comparison = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert list(comparison) == ["run", "run'"] and comparison["run"]["grid"] == comparison["run'"]["grid"]
    assert comparison["run"] == json.loads((tmp_path / "cmp" / "run" / "results.json").read_text())
    assert (tmp_path / "cmp" / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert "run: mean accuracy" in result.output and "run': mean accuracy" in result.output


def test_demo_trains_evaluates_and_compares(tmp_path):
    from tapecli.experiments.demo import DemoBudget, run_demo

    budget = DemoBudget(max_digits=2, eval_len=3, samples=2, steps=2, batch_size=4, lr=1e-3, n_layers=1, dim=32,
                        n_heads=2)
    results = run_demo(["rope", "tape"], budget, tmp_path, abacus=True)  # a preset of `tape sweep`
    assert [group["label"] for group in results["groups"]] == ["rope", "tape"]
    for group in results["groups"]:
        assert 0.0 <= group["scores"]["grid (mean)"]["accuracy"]["mean"] <= 1.0 and group["train"]["seconds"] > 0
        assert len(group["grid_accuracy"]) == 3 and group["train_digits"] == 2
    assert (tmp_path / "heatmaps.png").read_bytes()[:4] == b"\x89PNG"
    overrides = results["sweep"]["overrides"]
    assert overrides[0] == "model.abacus=true" and "train.max_steps=2" in overrides
    evaluated = json.loads((tmp_path / "tape-seed0" / "eval-addition" / "step-00000002" / "results.json").read_text())
    assert results["cells"][1]["scores"]["grid (mean)"]["accuracy"] == evaluated["mean_accuracy"]
    assert evaluated["settings"]["samples"] == 2 and evaluated["settings"]["train_digits"] == 2
    recorded = json.loads((tmp_path / "rope-seed0" / "run.json").read_text())["command"]  # what resumes the demo
    assert recorded == f"tape demo --task addition --abacus --pe rope,tape --seed 0 --out {tmp_path}"


@pytest.mark.parametrize("task", ["addition", "selective-copy"])
def test_demo_rejects_an_unknown_pe_before_training(tmp_path, task):
    result = runner.invoke(app, ["demo", "--task", task, "--pe", "bogus", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "bogus" in result.output and not any(tmp_path.iterdir())
