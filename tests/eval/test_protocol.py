"""The evaluation shape (`tapecli.eval.protocol`): a protocol declares only its settings, units, work, results and
plots; the one runner opens the models, logs and resumes the units, writes results.json and the plots, picks the
default folders and compares several models. Exercised with a small real protocol on real tiny checkpoints."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tapecli.data.tokenizer import ByteTokenizer
from tapecli.errors import TapeError
from tapecli.eval.protocol import Evaluation, as_opened, evaluate_one, run
from tapecli.model import ModelConfig, Transformer
from tapecli.store.checkpoint import save_model

PROMPTS = ["the grass is green", "the sky is blue", "the sun is yellow", "here we go", "there and back again"]


@dataclass
class NextByte(Evaluation):
    """Greedy next-byte accuracy on the last byte of each prompt: one unit per prompt."""

    name = "next-byte"
    unit = "prompts"
    plot_file = "next-byte.png"
    prompts: list[str] = field(default_factory=lambda: list(PROMPTS))
    fail_after: int | None = None  # raise KeyboardInterrupt after this many batches (an interruption)
    calls: list[list[int]] = field(default_factory=list)  # the units of every `evaluate` call
    plotted: list[tuple[str, Path]] = field(default_factory=list)
    compared: list[tuple[list[str], Path]] = field(default_factory=list)

    def settings(self, opened):
        return {"task": "next-byte", "model": opened.record(), "prompts": self.prompts}

    def units(self, opened):
        return list(range(len(self.prompts)))

    def key(self, row):
        return row["index"]

    def evaluate(self, opened, units):
        if self.fail_after is not None and len(self.calls) == self.fail_after:
            raise KeyboardInterrupt
        self.calls.append(list(units))
        rows = []
        for i in units:
            ids = opened.tokenizer.encode(self.prompts[i])
            with torch.no_grad():
                guess = int(opened.model(torch.tensor([ids[:-1]]))[0, -1].argmax())
            rows.append({"index": i, "guess": guess, "correct": guess == ids[-1]})
        return rows

    def results(self, opened, settings, rows):
        return {"task": "next-byte", "settings": settings, "accuracy": sum(r["correct"] for r in rows) / len(rows),
                "prompts": len(rows)}

    def plot(self, results, path, label):
        self.plotted.append((label, path))
        path.write_text("a picture\n")

    def compare(self, results, folder):
        self.compared.append((list(results), folder))


@dataclass
class Together(NextByte):
    """The same protocol with every model in one folder (as perplexity's table)."""

    together = True

    def shared_settings(self, models, opening):
        return {"task": "next-byte", "models": len(models), "dtype": opening.dtype_name(), "prompts": self.prompts}

    def results(self, opened, settings, rows):
        return {"name": opened.name, "accuracy": sum(r["correct"] for r in rows) / len(rows)}

    def combine(self, settings, entries):
        return {"task": "next-byte", "settings": settings, "models": entries}


def tiny(seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=259, dim=16, n_layers=1, n_heads=2, max_seq_len=64)).eval()


@pytest.fixture
def runs(tmp_path):
    """Two tape runs (a checkpoint inside RUN/checkpoints/) with different weights."""
    return [save_model(tiny(seed), ByteTokenizer(), tmp_path / name / "checkpoints" / "step-00000003").parent.parent
            for seed, name in ((0, "a"), (1, "b"))]


def rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def test_one_model_files_resume_and_settings_guard(tmp_path, runs):
    reference = run(NextByte(), [str(runs[0])], tmp_path / "ref", batch_size=2, show_progress=False)
    results = reference.results["a"]
    assert json.loads((tmp_path / "ref" / "results.json").read_text()) == results
    assert results["prompts"] == 5 and results["seconds_this_session"] >= 0
    assert json.loads((tmp_path / "ref" / "settings.json").read_text()) == results["settings"]
    assert results["settings"]["model"]["source"] == str((runs[0] / "checkpoints" / "step-00000003").resolve())
    assert (tmp_path / "ref" / "next-byte.png").read_text() == "a picture\n"
    assert reference.wrote(NextByte()) == f"wrote results.json, samples.jsonl and next-byte.png to {tmp_path / 'ref'}"

    interrupted = NextByte(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        run(interrupted, [str(runs[0])], tmp_path / "out", batch_size=2, show_progress=False)
    assert [r["index"] for r in rows(tmp_path / "out")] == [0, 1, 2, 3]
    assert not (tmp_path / "out" / "results.json").exists()
    with (tmp_path / "out" / "samples.jsonl").open("a") as f:
        f.write('{"index": 4, "gue')  # a row cut off mid-write
    resumed = NextByte()
    report = run(resumed, [str(runs[0])], tmp_path / "out", batch_size=2, show_progress=False)
    assert resumed.calls == [[4]]  # only the unit not finished
    assert rows(tmp_path / "out") == rows(tmp_path / "ref")
    assert {k: v for k, v in report.results["a"].items() if k != "seconds_this_session"} == {
        k: v for k, v in results.items() if k != "seconds_this_session"}

    with pytest.raises(TapeError, match=r"other settings \(prompts differ\)"):
        run(NextByte(prompts=PROMPTS[:2]), [str(runs[0])], tmp_path / "out", show_progress=False)


def test_several_models_one_folder_each_and_their_comparison(tmp_path, runs):
    evaluation = NextByte()
    report = run(evaluation, [str(runs[0]), str(runs[1]), str(runs[0])], tmp_path / "cmp", show_progress=False)
    assert list(report.results) == ["a", "b", "a'"]  # labels are made unique
    for label, folder in report.folders.items():
        assert folder == tmp_path / "cmp" / label
        assert json.loads((folder / "results.json").read_text()) == report.results[label]
    assert json.loads((tmp_path / "cmp" / "comparison.json").read_text()) == report.results
    assert evaluation.compared == [(["a", "b", "a'"], tmp_path / "cmp")]
    assert [label for label, _ in evaluation.plotted] == ["a", "b", "a'"]
    assert rows(tmp_path / "cmp" / "a") == rows(tmp_path / "cmp" / "a'")
    assert report.results["a"]["settings"]["model"]["source"] != report.results["b"]["settings"]["model"]["source"]


def test_default_folders_come_from_the_run_directory(tmp_path, runs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = run(NextByte(), [str(runs[0])], show_progress=False)
    assert report.folders["a"] == runs[0].resolve() / "eval-next-byte" / "step-00000003"
    assert (runs[0] / "eval-next-byte" / "step-00000003" / "results.json").is_file()
    report = run(NextByte(), [str(runs[0]), str(runs[1])], show_progress=False)
    assert report.folders == {"a": runs[0].resolve() / "eval-next-byte" / "step-00000003",
                              "b": runs[1].resolve() / "eval-next-byte" / "step-00000003"}
    assert report.comparison == Path("eval-next-byte-comparison")
    assert (tmp_path / "eval-next-byte-comparison" / "comparison.json").is_file()
    lone = save_model(tiny(2), ByteTokenizer(), tmp_path / "lone")
    assert run(NextByte(), [str(lone)], show_progress=False).folders["lone"] == lone.resolve() / "eval-next-byte"


def test_models_in_one_folder(tmp_path, runs):
    report = run(Together(), [str(runs[0]), str(runs[1])], tmp_path / "t", batch_size=3, show_progress=False)
    results = report.results["next-byte"]
    assert [m["name"] for m in results["models"]] == ["a", "b"] and results["settings"]["models"] == 2
    logged = rows(tmp_path / "t")
    assert [(r["model"], r["index"]) for r in logged] == [(m, i) for m in (0, 1) for i in range(5)]
    assert list(logged[0]) == ["model", "index", "guess", "correct"]  # the model's index comes first
    separate = run(NextByte(), [str(runs[1])], tmp_path / "b-alone", show_progress=False).results["b"]
    assert results["models"][1]["accuracy"] == separate["accuracy"]

    interrupted = Together(fail_after=3)  # model 0 whole (2 batches), then one batch of model 1
    with pytest.raises(KeyboardInterrupt):
        run(interrupted, [str(runs[0]), str(runs[1])], tmp_path / "r", batch_size=3, show_progress=False)
    resumed = Together()
    again = run(resumed, [str(runs[0]), str(runs[1])], tmp_path / "r", batch_size=3, show_progress=False)
    assert resumed.calls == [[3, 4]] and rows(tmp_path / "r") == logged
    assert again.results["next-byte"]["models"] == results["models"]


def test_a_model_in_memory(tmp_path):
    opened = as_opened(tiny(0), ByteTokenizer(), name="mine")
    results = evaluate_one(NextByte(), opened, tmp_path, show_progress=False)
    assert results["settings"]["model"]["name"] == "mine" and len(rows(tmp_path)) == 5
    with pytest.raises(TapeError, match="needs an output folder"):
        run(NextByte(), [opened], show_progress=False)


def test_bad_options_fail_before_any_work(tmp_path, runs):
    (tmp_path / "file.txt").write_text("keep me\n")
    with pytest.raises(TapeError, match="is a file"):
        run(NextByte(), [str(runs[0])], tmp_path / "file.txt")
    with pytest.raises(TapeError, match="--batch-size must be a positive integer, got 0"):
        run(NextByte(), [str(runs[0])], tmp_path / "x", batch_size=0)
    with pytest.raises(TapeError, match="--model: pass at least one model"):
        run(NextByte(), [], tmp_path / "x")
    with pytest.raises(TapeError, match="does not exist"):
        run(NextByte(), [str(tmp_path / "missing")], tmp_path / "x")
    assert not (tmp_path / "x").exists() and (tmp_path / "file.txt").read_text() == "keep me\n"
