"""Synthetic tasks (selective copy, grid navigation): generators, recipe keys, `tape eval synthetic`, the demo."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.synthetic import (
    ACTIONS,
    BLANK,
    SEPARATOR,
    SYMBOLS,
    CopySpec,
    GridSpec,
    SyntheticDataset,
    split_specs,
)
from tapecli.data.tokenizer import CharTokenizer, load_tokenizer, load_tokenizer_dir
from tapecli.errors import TapeError
from tapecli.eval.synthetic import evaluate_synthetic
from tapecli.recipe import load_recipe

runner = CliRunner()
TOK = CharTokenizer("synthetic")


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_tokenizer_round_trip_and_registry(tmp_path):
    text = SYMBOLS + BLANK + SEPARATOR + "LRUD"
    assert TOK.decode(TOK.encode(text)) == text and TOK.vocab_size == 25
    assert sorted(TOK.encode(text)) == list(range(3, 25))  # one id per character, after PAD/BOS/EOS
    assert load_tokenizer("synthetic").symbols == TOK.symbols
    TOK.save(tmp_path / "tok")
    assert load_tokenizer_dir(tmp_path / "tok").encode("a_|L") == TOK.encode("a_|L")
    with pytest.raises(TapeError, match="no token for 'x'"):
        TOK.encode("x")


@pytest.mark.parametrize(("n", "blanks"), [(5, 0), (16, 16), (8, 40)])
def test_selective_copy_format(n, blanks):
    for seed in range(20):
        ex = CopySpec(n, blanks).example(random.Random(seed))
        prompt, copied = ex.text.split(SEPARATOR)
        assert len(ex.text) == CopySpec(n, blanks).length == 2 * n + blanks + 1
        assert prompt.count(BLANK) == blanks and copied == prompt.replace(BLANK, "")
        assert len(copied) == n and set(copied) <= set(SYMBOLS)
        assert ex.targets == ex.scored == [False] * (n + blanks + 1) + [True] * n


def replay(example, task: str, width: int) -> list[bool]:
    """Walk the actions from the start cell (naively, with explicit wrap-around); check every revisited cell shows
    what it showed before, and return which positions are revisits."""
    moves = {"L": (-1, 0), "R": (1, 0), "U": (0, 1), "D": (0, -1)}
    dims = 1 if task == "grid-1d" else 2
    x = y = 0
    seen = {(0, 0): example.text[0]}
    revisits = [False]
    for t in range(1, len(example.text)):
        token = example.text[t]
        if t % 2:  # actions at odd positions
            assert token in ACTIONS[task]
            dx, dy = moves[token]
            x, y = (x + dx) % width, (y + dy) % width if dims == 2 else 0
            revisits.append(False)
        else:
            assert token in SYMBOLS + BLANK
            revisits.append((x, y) in seen)
            assert seen.setdefault((x, y), token) == token, f"cell {(x, y)} changed at position {t}"
    return revisits


@pytest.mark.parametrize("task", ["grid-1d", "grid-2d"])
def test_grid_walks_and_revisit_only_scoring(task):
    revisits_total = 0
    for seed in range(30):
        spec = GridSpec(task, length=41 + seed % 2, width=5, p_empty=0.5)
        ex = spec.example(random.Random(seed))
        assert len(ex.text) == spec.length and ex.targets == [True] * spec.length
        assert ex.scored == replay(ex, task, spec.width)
        revisits_total += sum(ex.scored)
    assert revisits_total > 100  # a 5-wide torus is revisited often: the check above had work to do


def test_grid_steps_per_direction_and_blank_probability():
    run_lengths = {"grid-1d": set(), "grid-2d": set()}
    for task in run_lengths:
        for seed in range(50):
            actions = GridSpec(task, 400, 1000, 0.5).example(random.Random(seed)).text[1::2]
            # Runs of one action are at least one walk long; two walks in a row may share a direction.
            runs, count = [], 1
            for a, b in zip(actions, actions[1:], strict=False):
                count = count + 1 if a == b else runs.append(count) or 1
            run_lengths[task].update(runs)
    assert {1, 2, 3} <= run_lengths["grid-2d"] and {1, 5, 10} <= run_lengths["grid-1d"]
    for p in (0.0, 0.2, 1.0):
        first_visits = []
        for seed in range(20):
            ex = GridSpec("grid-1d", 201, 1000, p).example(random.Random(seed))
            first_visits += [o for o, s in zip(ex.text[::2], ex.scored[::2], strict=True) if not s]
        assert abs(first_visits.count(BLANK) / len(first_visits) - p) < 0.03


def test_examples_are_pure_functions_of_seed_split_and_index():
    spec = GridSpec("grid-2d", 64, 8, 0.5)
    a = SyntheticDataset("grid-2d", spec, seed=3, split="train", length=10, seq_len=64)
    b = SyntheticDataset("grid-2d", spec, seed=3, split="train", length=10, seq_len=64)
    assert [a.example(i) for i in range(5)] == [b.example(i) for i in (0, 1, 2, 3, 4)]
    assert a.example(4) == a.example(4) and a.example(4) != a.example(5)
    other_seed = SyntheticDataset("grid-2d", spec, seed=4, split="train", length=10, seq_len=64)
    other_split = SyntheticDataset("grid-2d", spec, seed=3, split="val", length=10, seq_len=64)
    assert a.example(0) != other_seed.example(0) and a.example(0) != other_split.example(0)
    with pytest.raises(IndexError):
        a.example(10)


def test_dataset_items_are_shifted_and_padded():
    spec = CopySpec(4, 3)
    ds = SyntheticDataset("selective-copy", spec, seed=0, split="train", length=5, seq_len=14)
    inputs, labels = ds[2]
    ids = TOK.encode(ds.example(2).text)
    assert inputs.tolist() == [TOK.bos_id] + ids[:-1] + [TOK.pad_id] * 2
    assert labels.tolist() == [-100] * 8 + ids[8:] + [-100] * 2
    grid = SyntheticDataset("grid-1d", GridSpec("grid-1d", 9, 4, 0.5), seed=0, split="train", length=5, seq_len=9)
    assert grid[0][1].tolist() == TOK.encode(grid.example(0).text)  # loss on every token
    with pytest.raises(TapeError, match="data.seq_len"):
        SyntheticDataset("selective-copy", spec, seed=0, split="train", length=5, seq_len=11)


def test_split_parameters_follow_the_paper_recipes():
    copy = load_recipe("selective-copy")
    assert split_specs("selective-copy", copy.data, copy.eval) == {
        "iid": CopySpec(128, 128), "ood-dense": CopySpec(128, 64), "ood-sparse": CopySpec(128, 256)}
    for task in ("grid-1d", "grid-2d"):
        grid = load_recipe(task)
        assert split_specs(task, grid.data, grid.eval) == {
            "iid": GridSpec(task, 128, 64, 0.5), "ood-dense": GridSpec(task, 64, 32, 0.2),
            "ood-sparse": GridSpec(task, 256, 128, 0.8)}
        assert (grid.model.n_layers, grid.model.n_heads, grid.train.batch_size, grid.train.lr) == (4, 2, 128, 3e-4)
    assert (copy.model.n_layers, copy.model.dim, copy.train.batch_size, copy.train.lr) == (2, 128, 64, 2e-4)


@pytest.mark.parametrize(("overrides", "key"), [
    (["data.tokenizer=byte"], "data.tokenizer"),
    (["data.seq_len=12"], "data.seq_len"),
    (["data.p_empty=1.5"], "data.p_empty"),
    (["eval.dense_grid=[8, 4]"], "eval.dense_grid"),
    (["eval.sparse_grid=[8.5, 4, 0.2]"], "eval.sparse_grid"),
    (["data.grid_width=1"], "data.grid_width"),
    (["data.copy_tokens=0"], "data.copy_tokens"),
])
def test_recipe_mistakes_name_the_key(overrides, key):
    with pytest.raises(TapeError, match=key.replace(".", r"\.")):
        load_recipe("selective-copy-smoke", overrides)


def test_synthetic_tokenizer_needs_a_synthetic_task():
    with pytest.raises(TapeError, match="data.tokenizer"):
        load_recipe("c4-smoke", ["data.source=x", "data.tokenizer=synthetic"])


class Peek(torch.nn.Module):
    """Predicts each next token by reading it from the (teacher-forced) input: right everywhere but the last
    position, where it has nothing to read and predicts PAD."""

    def __init__(self, pe: str = "rope") -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.config = type("Config", (), {"pe": pe, "max_seq_len": 1000})()

    def forward(self, input_ids, start_pos=0):
        following = torch.cat([input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])], dim=1)
        return torch.nn.functional.one_hot(following, 64).float()  # 64: more ids than any task's tokenizer has


@pytest.mark.parametrize("recipe", ["selective-copy-smoke", "grid-1d-smoke", "grid-2d-smoke", "flip-flop-smoke",
                                    "counting-smoke"])
def test_scoring_counts_exactly_the_scored_positions(tmp_path, recipe):
    r = load_recipe(recipe)
    results = evaluate_synthetic(Peek(), r, tmp_path, samples=6, batch_size=4)
    for split, spec in split_specs(r.data.kind, r.data, r.eval).items():
        examples = [SyntheticDataset(r.data.kind, spec, 1234, split, 6, spec.length).example(i) for i in range(6)]
        scored = [sum(ex.scored) for ex in examples if any(ex.scored)]
        last = [ex.scored[-1] for ex in examples if any(ex.scored)]  # the only scored position Peek gets wrong
        got = results["splits"][split]
        assert got["scored_tokens"] == sum(scored) and got["sequences"] == len(scored)
        assert got["token_accuracy"] == pytest.approx((sum(scored) - sum(last)) / sum(scored))
        assert got["accuracy"] == pytest.approx(sum(not x for x in last) / len(last))


def test_a_sequence_with_nothing_to_score_is_null_in_samples_and_left_out_of_results(tmp_path):
    """A walk that never revisits a cell has no scored token: samples.jsonl says "correct": null (not true) and the
    results leave it out, so the two tell the same story."""
    results = evaluate_synthetic(Peek(), load_recipe("grid-1d-smoke"), tmp_path, samples=6, batch_size=4)
    rows = read_rows(tmp_path)
    unscored = [row for row in rows if row["scored"] == 0]
    assert unscored  # (ood-dense of grid-1d-smoke, seed 1234, has such walks)
    assert all(row["correct"] is None and row["token_accuracy"] is None for row in unscored)
    assert all(isinstance(row["correct"], bool) for row in rows if row["scored"])
    for split, values in results["splits"].items():
        scored = [row for row in rows if row["split"] == split and row["scored"]]
        assert values["unscored_sequences"] == sum(row["split"] == split for row in unscored)
        assert values["sequences"] == len(scored)
        if scored:
            assert values["accuracy"] == pytest.approx(sum(row["correct"] for row in scored) / len(scored))


def test_interrupted_evaluation_resumes(tmp_path, monkeypatch):
    r = load_recipe("grid-1d-smoke")
    reference = evaluate_synthetic(Peek(), r, tmp_path / "ref", samples=5, batch_size=2)
    model, calls = Peek(), []
    original = model.forward

    def interrupted(input_ids, start_pos=0):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return original(input_ids, start_pos)

    monkeypatch.setattr(model, "forward", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate_synthetic(model, r, tmp_path / "run", samples=5, batch_size=2)
    log = tmp_path / "run" / "samples.jsonl"
    assert len(log.read_text().splitlines()) == 5 + 2  # iid whole (3 batches), then one batch of ood-dense
    with log.open("a") as f:
        f.write('{"split": "ood-dense", "index": 2, "sco')  # a row cut off mid-write
    calls.clear()
    monkeypatch.setattr(model, "forward", lambda input_ids, start_pos=0: calls.append(1) or original(input_ids))
    resumed = evaluate_synthetic(model, r, tmp_path / "run", samples=5, batch_size=2)
    assert len(calls) == 2 + 3  # the rest of ood-dense, then ood-sparse
    assert resumed["splits"] == reference["splits"]
    with pytest.raises(TapeError, match="other settings"):
        evaluate_synthetic(model, r, tmp_path / "run", samples=6, batch_size=2)


def read_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("task", ["selective-copy", "grid-1d", "grid-2d", "flip-flop", "counting"])
def test_train_then_evaluate_through_the_cli(tmp_path, task):
    run = tmp_path / "run"
    invoke("pretrain", "--recipe", f"{task}-smoke", "--out", str(run), "model.pe=rope")
    output = invoke("eval", "synthetic", "--model", str(run), "--splits", "iid,ood-sparse")
    out = run / "eval-synthetic" / "step-00000004"
    results = json.loads((out / "results.json").read_text())
    rows = read_rows(out)
    assert results["task"] == task and list(results["splits"]) == ["iid", "ood-sparse"] and "ood-sparse" in output
    assert len(rows) == 2 * 4  # eval.samples of the smoke recipe, per split
    for split, values in results["splits"].items():
        counted = [row for row in rows if row["split"] == split and row["scored"]]
        assert values["accuracy"] == pytest.approx(sum(row["correct"] for row in counted) / len(counted))
        assert values["token_accuracy"] == pytest.approx(
            sum(row["correct_tokens"] for row in counted) / sum(row["scored"] for row in counted))
        assert all(row["token_accuracy"] == row["correct_tokens"] / row["scored"] for row in counted)
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_synthetic_opens_models_the_shared_way(tmp_path, trained):
    """--dtype and --pe-arg work as in every `tape eval`, and the settings record what was evaluated."""
    run = trained("selective-copy-smoke", "model.pe=rope", "train.max_steps=2")
    out = tmp_path / "eval"
    invoke("eval", "synthetic", "--model", str(run), "--splits", "iid", "--samples", "2", "--dtype", "fp32",
           "--pe-arg", "theta=500", "--out", str(out))
    settings = json.loads((out / "settings.json").read_text())
    assert settings["model"]["dtype"] == "fp32" and settings["model"]["pe_overrides"] == {"theta": 500.0}
    assert settings["model"]["pe_args"]["theta"] == 500.0
    result = runner.invoke(app, ["eval", "synthetic", "--model", str(run), "--pe-arg", "bogus=1", "--out",
                                 str(tmp_path / "bad")])
    assert result.exit_code == 2 and "bogus" in result.output


def test_several_models_give_one_comparison(tmp_path, trained):
    runs = [trained.copy(tmp_path / pe, "selective-copy-smoke", f"model.pe={pe}", "train.max_steps=2")
            for pe in ("rope", "tape")]  # named by their folders
    output = invoke("eval", "synthetic", "--model", str(runs[0]), "--model", str(runs[1]), "--samples", "3",
                    "--out", str(tmp_path / "cmp"))
    assert "rope" in output and "tape" in output
    comparison = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert list(comparison) == ["rope", "tape"]
    assert comparison["tape"] == json.loads((tmp_path / "cmp" / "tape" / "results.json").read_text())
    assert (tmp_path / "cmp" / "accuracy.png").is_file()

    grid = trained("grid-1d-smoke", "train.max_steps=2")
    result = runner.invoke(app, ["eval", "synthetic", "-m", str(runs[0]), "-m", str(grid)])
    assert result.exit_code == 2 and "different tasks" in result.output
    result = runner.invoke(app, ["eval", "synthetic", "-m", str(runs[0]), "--splits", "iid,odd"])
    assert result.exit_code == 2 and "odd" in result.output


def test_synthetic_demo_trains_evaluates_and_compares(tmp_path):
    pes = ["rope", "cope"]  # a rotation and a contextual PE that attends by itself (every PE trains: test_train.py)
    from tapecli.experiments.demo_synthetic import BUDGETS, SyntheticBudget, run_synthetic_demo

    shipped = BUDGETS["selective-copy"]  # its model and data, trained for 2 steps
    budget = SyntheticBudget(shipped.task, (*shipped.overrides, "train.max_steps=2", "train.save_every=2",
                                            "train.batch_size=4", "train.micro_batch_size=4"), "tiny", samples=3)
    results = run_synthetic_demo(pes, budget, tmp_path)  # a preset of `tape sweep`
    assert [group["label"] for group in results["groups"]] == pes
    assert json.loads((tmp_path / "results.json").read_text()) == results and (tmp_path / "accuracy.png").is_file()
    evaluated = json.loads((tmp_path / f"{pes[1]}-seed0" / "eval-synthetic" / "step-00000002" / "results.json")
                           .read_text())
    assert evaluated["settings"]["samples"] == 3  # the budget's evaluation sequences per split
    assert results["groups"][1]["scores"]["ood-sparse"]["accuracy"]["mean"] == \
        evaluated["splits"]["ood-sparse"]["accuracy"]
    recorded = json.loads((tmp_path / f"{pes[0]}-seed0" / "run.json").read_text())["command"]  # resumes the demo
    assert recorded == f"tape demo --task selective-copy --pe {','.join(pes)} --seed 0 --out {tmp_path}"


def test_a_stopped_demo_is_resumed_by_the_same_command():
    from tapecli.train.preemption import stopped

    demo = ["tape", "demo", "--task", "selective-copy", "--pe", "rope,tape", "--seed", "1", "--out", "runs/x"]
    assert str(stopped(signal.SIGTERM, 5, Path("ckpt"), demo)).endswith(  # `tape demo` has no --resume option
        "resume with: tape demo --task selective-copy --pe rope,tape --seed 1 --out runs/x")
    assert str(stopped(signal.SIGTERM, 5, Path("ckpt"), ["tape", "pretrain", "--out", "r"])).endswith(
        "resume with: tape pretrain --out r --resume auto")


def test_demo_task_errors(tmp_path):
    result = runner.invoke(app, ["demo", "--task", "bogus", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "bogus" in result.output and not any(tmp_path.iterdir())
    result = runner.invoke(app, ["demo", "--task", "selective-copy", "--abacus", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "addition demo only" in result.output
