"""`tape eval babilong`: BABILong's metric on hand-made answers, the scores of a stand-in model worked out by hand,
the real command on a tape run and a Hugging Face Llama (files, plots, resume, one-line errors), BABILong's own
files, and a run trained on the `babilong` data kind evaluated on its own eval keys, as `tape sweep` does."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.eval import babilong
from tapecli.eval.babilong_metric import TASK_LABELS, compare_answers
from tapecli.eval.protocol import run

runner = CliRunner()
BABILONG_RUN = ("babilong-example", "data.tokenizer=byte", "data.lengths=[0]", "data.seq_len=512",
                "model.max_seq_len=512", "train.max_steps=1", "train.batch_size=2", "train.micro_batch_size=2",
                "train.warmup=0", "train.save_every=1", "train.eval_every=1", "train.eval_batches=1",
                "eval.lengths=[0, 512]", "eval.depths=null", "eval.samples=2")


def test_babilongs_metric():
    labels = TASK_LABELS["qa1"]
    assert compare_answers("kitchen", "The most recent location of Mary is kitchen.", "Where is Mary?", labels)
    assert compare_answers("kitchen", "  KITCHEN", "Where is Mary?", labels)
    assert not compare_answers("kitchen", "kitchen or garden", "Where is Mary?", labels)  # two labels
    assert compare_answers("kitchen", "kitchen. Then the garden", "Where is Mary?", labels)  # first sentence only
    assert not compare_answers("kitchen", "garden", "Where is Mary?", labels)
    # Labels the question names never count: "before the office" -> office in the answer is ignored.
    assert compare_answers("hallway", "the office, then hallway", "Where was the milk before the office?", labels)
    assert compare_answers("Fred", "Fred <example> Mary", "Who received the milk?", TASK_LABELS["qa5"])
    assert not compare_answers("Fred", "<context> Fred", "Who received the milk?", TASK_LABELS["qa5"])


class Answers:
    """Stands in for generate_texts: answers each prompt with its target (right) or with the other location."""

    def __init__(self, right_at: set[int]) -> None:
        self.right_at, self.targets = right_at, {}

    def __call__(self, opened, prompts, batch_size, max_new_tokens, stop_check=None):
        out = []
        for p in prompts:
            length, target = self.targets[p]
            out.append(target if length in self.right_at else ("garden" if target != "garden" else "office"))
        return out


def test_scores_with_a_stand_in_model_equal_the_hand_computed_ones(tmp_path, monkeypatch, trained):
    """Right at lengths 0 and 256, wrong at 512: per task 100, 100, 0; RULER's effective length 256, NoLiMa's 256,
    LongScore over (256, 512) against the base 100: (0 - 100) / 2 = -50; every depth cell is listed."""
    answers = Answers({0, 256})
    original = babilong.Babilong.sample

    def sample(self, tokenizer, unit):
        s = original(self, tokenizer, unit)
        answers.targets[s.prompt] = (unit[1], s.target)
        return s

    monkeypatch.setattr(babilong.Babilong, "sample", sample)
    monkeypatch.setattr(babilong, "generate_texts", answers)
    evaluation = babilong.Babilong("qa1,qa4", [0, 256, 512], [0.0, 1.0], 2, prompt="bare")
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=3, show_progress=False)
    m = report.results["babilong"]["models"][0]
    assert m["scores"] == {"qa1": {"0": 100.0, "256": 100.0, "512": 0.0}, "qa4": {"0": 100.0, "256": 100.0,
                                                                                  "512": 0.0}}
    assert m["by_depth"]["qa1"] == {"256": {"0": 100.0, "1": 100.0}, "512": {"0": 0.0, "1": 0.0}}
    assert m["depth_average"] == {"256": {"0": 100.0, "1": 100.0}, "512": {"0": 0.0, "1": 0.0}}
    assert (m["effective_length"], m["effective_length_nolima"], m["long_score"]) == (256, 256, -50.0)
    assert babilong.table(m, [0, 256, 512]).endswith(
        "| average by depth | 256 | 512 |\n| --- | --- | --- |\n| depth 0 | 100.0 | 0.0 |\n| depth 1 | 100.0 | 0.0 |")
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    # Length 0: 2 samples x 2 depths, each story once; 256 and 512: 2 per depth; two tasks.
    assert len(rows) == 2 * (4 + 2 * 2 + 2 * 2)
    at_zero = sorted(r["index"] for r in rows if r["task"] == "qa1" and r["length"] == 0)
    assert at_zero == [0, 1, 2, 3] and {r["depth"] for r in rows if r["length"] == 0} == {"-"}
    assert sorted(r["index"] for r in rows if r["task"] == "qa1" and r["length"] == 512 and r["depth"] == "1") \
        == [2, 3]  # the second depth's stories
    for name in ("babilong.png", "heatmap.png", "depth.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """Two real models answer real prompts (greedy, up to 15 tokens); a second run resumes without redoing a
    sample; bad input is one line before anything is written."""
    out = tmp_path / "babilong"
    args = ["eval", "babilong", "--model", str(trained()), "--model", str(tiny_hf_llama), "--tasks", "qa1,qa4",
            "--lengths", "0,1k", "--depths", "0,1", "--samples", "1", "--prompt", "no-examples", "--device", "cpu",
            "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "effective length" in result.output and "| qa4 |" in result.output
    assert "| average by depth | 1024 |" in result.output and "| depth 1 |" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * (2 + 2) and {r["model"] for r in rows} == {0, 1}
    assert all(r["prompt_tokens"] + 15 <= 1024 for r in rows if r["length"] == 1024)
    assert all(0 <= r["score"] <= 1 and isinstance(r["prediction"], str) for r in rows)
    results = json.loads((out / "results.json").read_text())
    assert [m["kind"] for m in results["models"]] == ["tape", "hf"] and results["settings"]["prompt"] == "no-examples"
    for pattern in ("babilong.png", "heatmap-0-*.png", "heatmap-1-*.png", "depth-0-*.png", "depth-1-*.png"):
        assert len(list(out.glob(pattern))) == 1, sorted(p.name for p in out.iterdir())
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().count("\n") == len(rows)
    model = str(trained())
    for extra, fragment in [(["--tasks", "qa9"], "--tasks: unknown task qa9; known: all, qa1"),
                            (["--lengths", "0,abc"], "--lengths: expected comma-separated token counts"),
                            (["--depths", "0,2"], "--depths: 2 must be at most 1"),
                            (["--prompt", "chat"], "--prompt: expected one of full, no-examples, bare"),
                            (["--samples", "0"], "'--samples': Input should be greater than or equal to 1"),
                            (["--lengths", "0,1k", "--base-lengths", "2k"], "--base-lengths: 2048 is not among"),
                            (["--data", str(tmp_path / "none")], "no such directory"),
                            (["--lengths", "20"], "babilong qa1 at length 20: even the facts of 100 stories")]:
        where = tmp_path / f"x{len(extra)}{extra[0]}"
        one_line_error(runner.invoke(app, ["eval", "babilong", "--model", model, "--device", "cpu", "--out",
                                           str(where), *extra]), 2, fragment)
        assert not where.exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"depths": "anywhere"}, "--depths: fractions in [0, 1] or `any`, got 'anywhere'"),
    ({"depths": []}, "--depths: fractions in [0, 1] or `any`, got []"),
    ({"lengths": [-1, 0]}, "--lengths: token counts of 0 (facts only) or more, got [-1, 0]"),
    ({"window": 0.0}, "--depth-window must be in (0, 1], got 0.0"),
    ({"window": 1.5}, "--depth-window must be in (0, 1], got 1.5"),
    ({"data": "DATA", "haystack": "essay.txt"}, "--data reads BABILong's own samples, which hold their haystack: "
                                                 "drop --haystack"),
    ({"tasks": "qa1,qa6"}, "--tasks: unknown task qa6"),
])
def test_bad_options_are_one_line_before_any_model_opens(options, message, tmp_path):
    options = {k: str(tmp_path) if v == "DATA" else v for k, v in options.items()}
    with pytest.raises(TapeError) as info:
        babilong.Babilong(**options).check([])
    assert str(info.value) == message or str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_babilongs_own_files_replace_the_generator(tmp_path, trained, monkeypatch):
    """--data: the file's rows in BABILong's template; no depth; the target scored as in the file."""
    rows = [{"input": "Mary moved to the office. The sky is blue.", "question": "Where is Mary?", "target": "office"},
            {"input": "John went to the garden.", "question": "Where is John?", "target": "garden"}]
    (tmp_path / "data" / "qa1").mkdir(parents=True)
    (tmp_path / "data" / "qa1" / "0k.json").write_text(json.dumps(rows))
    seen = []

    def answer(opened, prompts, batch_size, max_new_tokens, stop_check=None):
        seen.extend(prompts)
        return ["office", "office"][: len(prompts)]

    monkeypatch.setattr(babilong, "generate_texts", answer)
    evaluation = babilong.Babilong("qa1", [0], samples=2, data=str(tmp_path / "data"))
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=2, show_progress=False)
    assert seen == [f"<context>\n{r['input']}\n</context>\n\nQuestion: {r['question']}" for r in rows]
    m = report.results["babilong"]["models"][0]
    assert m["scores"] == {"qa1": {"0": 50.0}} and "by_depth" not in m
    settings = json.loads((tmp_path / "out" / "settings.json").read_text())
    assert settings["data"]["files"][0].startswith("qa1/0k.json sha256:") and "seed" not in settings
    with pytest.raises(TapeError, match="has 2 samples, fewer than --samples 3"):
        run(babilong.Babilong("qa1", [0], samples=3, data=str(tmp_path / "data")), [str(trained())],
            tmp_path / "out3", device="cpu", show_progress=False)


def test_a_babilong_run_is_evaluated_on_its_own_eval_keys_as_the_sweep_does(tmp_path, trained):
    """A run trained (one step, for real) on kind babilong: `tape eval babilong --model RUN` takes the recipe's
    eval keys and data.prompt; the sweep's evaluation writes RUN/eval-babilong/<checkpoint>/results.json and reads
    one split per length back."""
    from tapecli.experiments.sweep.evaluations import evaluation_for

    run_dir = trained.copy(tmp_path / "run", *BABILONG_RUN)
    sweep = evaluation_for("babilong")
    sweep.run(run_dir)
    checkpoint = next((run_dir / "checkpoints").iterdir())
    results = json.loads(sweep.results_file(checkpoint).read_text())
    assert results["settings"]["lengths"] == [0, 512] and results["settings"]["depths"] is None
    assert results["settings"]["tasks"] == ["qa1"] and results["settings"]["samples"] == 2
    assert set(sweep.scores(results)) == {"0 tokens", "512 tokens"}
    assert all(0 <= v["accuracy"] <= 1 for v in sweep.scores(results).values())
    rows = (sweep.results_file(checkpoint).parent / "samples.jsonl").read_text().splitlines()
    assert len(rows) == 4 and {json.loads(r)["depth"] for r in rows} == {"-", "any"}
    # Runs with other eval keys are evaluated alike only when the options say how.
    other = trained.copy(tmp_path / "other", *BABILONG_RUN[:-1], "eval.samples=3")
    with pytest.raises(TapeError, match=r"^the models come from babilong runs with different eval keys \(--samples\); "
                                        r"pass --samples to evaluate them alike$"):
        babilong.Babilong().check([str(run_dir), str(other)])
    evaluation = babilong.Babilong(samples=1)
    evaluation.check([str(run_dir), str(other)])
    assert (evaluation.samples, evaluation.lengths, evaluation.depths) == (1, [0, 512], None)
    shutil.rmtree(run_dir)
    shutil.rmtree(other)
