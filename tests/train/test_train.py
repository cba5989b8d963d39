"""The training engine on tiny models: every PE trains, the loss is what it should be, bad input fails cleanly."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from train_helpers import REPO, assert_same_weights, cli, subprocess_env, weights, write_recipe
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.model import PE_NAMES
from tapecli.recipe import load_recipe
from tapecli.store.run import read_metrics
from tapecli.train.engine import pretrain
from tapecli.train.optim import lr_at

runner = CliRunner()


def train(tmp_path: Path, corpus: Path, out: str, *overrides: str, **sections: dict) -> Path:
    recipe = write_recipe(tmp_path / f"{out}.yaml", corpus, **sections)
    return pretrain(load_recipe(str(recipe), list(overrides)), tmp_path / out)


def test_setup_leaves_the_callers_recipe_alone(tmp_path: Path, tiny_corpus: Path) -> None:
    """The run directory records the resolved recipe (precision, vocabulary size); the caller's copy is untouched."""
    recipe = load_recipe(str(write_recipe(tmp_path / "r.yaml", tiny_corpus)), ["train.precision=auto",
                                                                              "train.max_steps=1", "train.warmup=0"])
    before = recipe.to_yaml()
    run = pretrain(recipe, tmp_path / "run")
    assert recipe.to_yaml() == before and recipe.model.vocab_size is None and recipe.train.precision == "auto"
    resolved = load_recipe(str(run / "recipe.yaml"))
    assert resolved.model.vocab_size == 259 and resolved.train.precision == ("bf16" if torch.cuda.is_available()
                                                                              else "fp32")


@pytest.mark.parametrize("pe", PE_NAMES)
def test_every_pe_trains_and_checkpoints(trained, pe: str) -> None:
    run = trained("tiny", f"model.pe={pe}")  # 2 steps; shared with the other tests that use a trained model
    rows = read_metrics(run)
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    assert set(rows[0]) == {"step", "loss", "lr", "tokens", "tokens_per_s", "elapsed", "grad_norm"}
    assert [r["step"] for r in rows if "val_loss" in r] == [2]
    assert (run / "checkpoints" / "step-00000002" / "model.safetensors").is_file()


def test_pinned_loss(trained) -> None:
    """A fixed tiny config must keep producing the same losses (torchtune-style regression pin)."""
    run = trained("tiny", "train.max_steps=4")
    losses = [r["loss"] for r in read_metrics(run) if "loss" in r]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(PINNED_LOSSES), rtol=1e-4, atol=1e-4)


PINNED_LOSSES = [5.55493, 5.47530, 5.38956, 5.34098]  # rope, TINY recipe, seed 1234, fp32 CPU


def test_run_directory(trained) -> None:
    run = trained()  # 2 steps
    info = json.loads((run / "run.json").read_text())
    assert info["seed"] == 1234 and info["version"] and "git_revision" in info and "start_time" in info
    resolved = load_recipe(str(run / "recipe.yaml"))  # the resolved recipe loads back, vocab size filled in
    assert resolved.train.max_steps == 2 and resolved.model.vocab_size == 259


def test_gradient_accumulation_matches_one_big_batch(tmp_path: Path, tiny_corpus: Path, trained) -> None:
    accumulated = trained("tiny", "train.max_steps=4")  # micro-batches of 2: test_pinned_loss's run
    single = train(tmp_path, tiny_corpus, "single", "train.micro_batch_size=4")
    assert_same_weights(weights(accumulated), weights(single), atol=1e-6)


def test_activation_checkpointing_changes_memory_not_results(tmp_path: Path, tiny_corpus: Path, trained) -> None:
    plain = trained()  # 2 steps
    recomputed = train(tmp_path, tiny_corpus, "recomputed", "train.max_steps=2", "train.activation_checkpointing=true")
    assert_same_weights(weights(plain), weights(recomputed), atol=1e-6)


def test_schedule_warms_up_then_decays_to_min_lr() -> None:
    lrs = [lr_at(s, lr=1.0, min_lr=0.1, warmup_steps=2, max_steps=6, schedule="linear") for s in range(6)]
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.7, 0.4, 0.1])
    assert lr_at(5, lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=6, schedule="cosine") == pytest.approx(0.1)
    assert lr_at(5, lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=6, schedule="constant") == 1.0


def test_a_zero_learning_rate_leaves_the_weights_exactly_as_they_were(tmp_path: Path, tiny_corpus: Path,
                                                                     trained) -> None:
    """lr 0 is allowed: training from a checkpoint then reproduces it bit for bit (issue 18's sanity check)."""
    base = trained()  # 2 steps
    still = train(tmp_path, tiny_corpus, "still", "train.lr=0", "train.min_lr=0", f"train.init_from={base}",
                  "train.max_steps=2")
    assert_same_weights(weights(base), weights(still))
    assert [r["lr"] for r in read_metrics(still) if "lr" in r] == [0.0, 0.0]


def test_a_one_step_smoke_run_of_a_recipe_with_a_warm_up(tmp_path: Path, tiny_corpus: Path) -> None:
    """c4-smoke warms up for 1 step; `train.max_steps=1` shortens that to 0 with a note instead of failing."""
    result = runner.invoke(app, ["pretrain", "--recipe", "c4-smoke", "--out", str(tmp_path / "one"),
                                 f"data.source={tiny_corpus}", "train.max_steps=1"])
    assert result.exit_code == 0, result.output
    assert "note: train.warmup: 1 warm-up steps do not fit train.max_steps=1; warming up for 0" in result.output
    assert [r["lr"] for r in read_metrics(tmp_path / "one") if "lr" in r] == [1e-3]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path: Path, tiny_corpus: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus)
    out = tmp_path / "run"
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(out), "train.lr=1e30",
                                 "train.min_lr=0", "train.warmup=0", "train.max_steps=6", "train.save_every=1",
                                 "train.grad_clip=0"])
    assert result.exit_code == 1, result.output
    # Either the loss is nan/inf, or (first) the weights are: then the step's checkpoint is not saved.
    match = re.search(r"error: (loss is (nan|inf) at step|after step) (\d+)[ ;].*the last good checkpoint is (\S+)",
                      result.output)
    assert match, result.output
    bad_step = int(match.group(3))
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved[-1] == f"step-{bad_step - 1:08d}" and match.group(4).endswith(saved[-1])
    assert all(torch.isfinite(t).all() for t in weights(out / "checkpoints" / saved[-1]).values())


def test_finetune_learns_targets_only_and_respects_freezing(tmp_path: Path, tiny_corpus: Path, trained) -> None:
    base = trained()  # 2 steps
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{a} plus {b} is", "target": f" {a + b}"}) + "\n"
                             for a in range(6) for b in range(4)))
    recipe = write_recipe(tmp_path / "ft.yaml", pairs, data={"kind": "pairs", "val_fraction": 0.0})
    out = tmp_path / "ft"
    result = runner.invoke(app, ["finetune", "--checkpoint", str(base), "--recipe", str(recipe), "--out", str(out),
                                 "train.max_steps=2", "train.lr=1e-2", "train.freeze=['*']",
                                 "train.unfreeze=['*norm*']"])
    assert result.exit_code == 0, result.output
    counts = re.search(r"parameters: ([\d,]+) total, ([\d,]+) trainable", result.output)
    total, trainable = (int(counts.group(i).replace(",", "")) for i in (1, 2))
    assert 0 < trainable < total

    before, after = weights(base), weights(out)
    for name in before:
        trainable_name = "norm" in name
        assert torch.equal(before[name], after[name]) != trainable_name, name

    # The first logged loss is the mean cross-entropy over target tokens only, on the batch of step 0.
    from tapecli.data.pairs import build_pair_datasets
    from tapecli.data.text import global_indices
    from tapecli.store.door import open_model

    opened = open_model(str(base), device="cpu")
    model, tokenizer = opened.model, opened.tokenizer
    data, _ = build_pair_datasets(str(pairs), tokenizer, 32, 0.0, 1234, "prompt", "target")
    batch = [data[i] for i in global_indices(0, 4, len(data), 1234)]
    inputs, labels = torch.stack([x for x, _ in batch]), torch.stack([y for _, y in batch])
    assert (labels == -100).sum() > (labels != -100).sum()  # the prompts are masked
    with torch.no_grad():
        expected = F.cross_entropy(model.train()(inputs).flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert read_metrics(out)[0]["loss"] == pytest.approx(float(expected), abs=1e-5)


def test_finetune_rejects_shape_changes(tmp_path: Path, tiny_corpus: Path, trained) -> None:
    base = trained()
    recipe = write_recipe(tmp_path / "ft.yaml", tiny_corpus)
    out = tmp_path / "ft"
    result = runner.invoke(app, ["finetune", "--checkpoint", str(base), "--recipe", str(recipe), "--out", str(out),
                                 "model.dim=64", "model.n_heads=4"])
    assert result.exit_code == 2 and "model.dim: the recipe asks for 64" in result.output
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["train.bogus=1"], "unknown key 'train.bogus'"),
    (["train.max_steps=many"], "train.max_steps"),
    (["data.source=/no/such/corpus.txt"], "/no/such/corpus.txt"),
    (["train.precision=fp16"], "fp16 needs a CUDA GPU"),
    (["data.source=allenai/c4:en"], "could not be loaded"),  # the tests run offline
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path, tiny_corpus: Path, args: list[str],
                                                      message: str) -> None:
    if args[0].startswith("train.precision") and torch.cuda.is_available():
        pytest.skip("fp16 is allowed on a GPU")
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus)
    out = tmp_path / "run"
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(out), *args])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: ") and message in result.output
    assert not out.exists()


def test_missing_checkpoint_is_one_line_exit_2(tmp_path: Path, tiny_corpus: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus)
    result = runner.invoke(app, ["finetune", "--checkpoint", str(tmp_path / "nope"), "--recipe", str(recipe),
                                 "--out", str(tmp_path / "ft")])
    assert result.exit_code == 2 and result.output.startswith(f"error: --checkpoint: {tmp_path / 'nope'} does not "
                                                              "exist; pass --checkpoint PATH (a tape run directory")
    assert not (tmp_path / "ft").exists()


@pytest.mark.slow
def test_real_process_prints_no_traceback(tmp_path: Path, tiny_corpus: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus)
    proc = subprocess.run(cli("pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "model.depth=3"),
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "unknown key 'model.depth'" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_auto_precision_is_fp32_on_cpu_and_bf16_on_capable_gpus(monkeypatch):
    from tapecli.runtime import resolve_precision

    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"  # an explicit choice is kept
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_precision("auto", torch.device("cuda")) == "fp32"


def test_a_fine_tune_resumes_whatever_its_recipe_says_of_data_tokenizer(trained, tmp_path: Path,
                                                                         tiny_corpus: Path) -> None:
    """With train.init_from the run keeps its model's tokenizer, so data.tokenizer is not compared on resume (the
    shipped fine-tuning recipe no longer spells it); without init_from another tokenizer is refused."""
    from tapecli.data.tokenizer import load_tokenizer_dir, train_tokenizer
    from tapecli.errors import TapeError
    from tapecli.model import ModelConfig
    from tapecli.store.checkpoint import read_model_config, resolve_checkpoint
    from tapecli.train.continuation import check_continuation

    run = trained()
    checkpoint = resolve_checkpoint(run)
    tokenizer = load_tokenizer_dir(checkpoint / "tokenizer")
    config = ModelConfig.from_dict(read_model_config(checkpoint))
    recipe, other = str(run / "recipe.yaml"), train_tokenizer(str(tiny_corpus), 400, str(tmp_path / "tok.model"))
    check_continuation(load_recipe(recipe, [f"data.tokenizer={other}", f"train.init_from={run}"]), checkpoint,
                       tokenizer, config)
    with pytest.raises(TapeError, match="is not the tokenizer"):
        check_continuation(load_recipe(recipe, [f"data.tokenizer={other}"]), checkpoint, tokenizer, config)
