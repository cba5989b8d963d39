"""Checkpoints: exact resume (in-process and after SIGKILL), atomic saves, pruning, tied weights, loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import (
    Interrupted,
    assert_same_weights,
    crash_after_checkpoint,
    kill_after_first_checkpoint,
    subprocess_env,
    weights,
    write_recipe,
)

from tapecli.errors import TapeError
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import resolve_checkpoint, save_model
from tapecli.store.door import open_model
from tapecli.store.run import read_metrics
from tapecli.train import engine


def test_resume_is_bitwise_exact(tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """6 steps in one go == 3 steps, a crash right after the step-3 checkpoint, then --resume auto."""
    # randpe draws random positions from the torch RNG, so this also checks that RNG states are restored.
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, model={"pe": "randpe"},
                          train={"max_steps": 6, "save_every": 3, "eval_every": 2})
    whole = engine.pretrain(load_recipe(str(recipe)), tmp_path / "whole")

    crash_after_checkpoint(monkeypatch, 3)
    with pytest.raises(Interrupted):
        engine.pretrain(load_recipe(str(recipe)), tmp_path / "split")
    monkeypatch.undo()
    torch.manual_seed(999)  # whatever state the process is in, resuming restores the run's own
    engine.pretrain(load_recipe(str(recipe)), tmp_path / "split", resume="auto")

    assert_same_weights(weights(whole), weights(tmp_path / "split"))
    assert read_metrics(whole) == [{**r, **_timing(a)} for r, a in zip(read_metrics(tmp_path / "split"),
                                                                       read_metrics(whole), strict=True)]


def _timing(row: dict) -> dict:
    return {k: row[k] for k in ("tokens_per_s", "elapsed") if k in row}


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")  # in this process as in the killed one (OMP_NUM_THREADS=1): the same floats
def test_sigkill_mid_run_then_resume_matches_uninterrupted(tmp_path: Path, tiny_corpus: Path, capsys) -> None:
    """A real `tape pretrain` process killed at some step after its first checkpoint, resumed (here, in this
    process) to the weights and metrics of an uninterrupted run."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus,
                          train={"max_steps": 60, "save_every": 10, "keep_last": 2, "eval_every": 0,
                                 "log_every": 10})
    whole = engine.pretrain(load_recipe(str(recipe)), tmp_path / "whole")

    killed = tmp_path / "killed"
    kill_after_first_checkpoint(["pretrain", "--recipe", str(recipe), "--out", str(killed)], killed, subprocess_env(),
                                60)

    engine.pretrain(load_recipe(str(recipe)), killed, resume="auto")
    assert "which is no longer running; taking it over" in capsys.readouterr().err  # the killed run's claim
    assert_same_weights(weights(whole), weights(killed))
    def losses(run: Path) -> list[tuple[int, float]]:
        return [(r["step"], r.get("loss", r.get("val_loss"))) for r in read_metrics(run)]

    assert losses(killed) == losses(whole)  # no step logged twice
    assert not list((killed / "checkpoints").glob(".tmp-*"))


def test_keep_last_prunes_old_checkpoints(tmp_path: Path, tiny_corpus: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, train={"save_every": 1, "keep_last": 2})
    run = engine.pretrain(load_recipe(str(recipe)), tmp_path / "run")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000003", "step-00000004"]


def test_leftover_temp_dir_is_ignored_then_removed(tmp_path: Path, trained) -> None:
    run = trained.copy(tmp_path / "run")  # 2 steps
    # What a save killed half-way leaves behind: a temp dir with a truncated weights file.
    partial = run / "checkpoints" / ".tmp-step-00000009-4242"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\x00" * 10)
    assert resolve_checkpoint(run).name == "step-00000002"

    engine.pretrain(load_recipe(trained.recipe(), ["train.max_steps=3"]), run, resume="auto")
    assert resolve_checkpoint(run).name == "step-00000003" and not partial.exists()


def test_resume_never_refuses_to_mix_runs(trained) -> None:
    with pytest.raises(TapeError, match="already holds checkpoints"):  # and writes nothing (trained's check)
        engine.pretrain(load_recipe(trained.recipe()), trained(), resume="never")


def test_tied_embeddings_are_saved_once_and_reloaded_tied(trained) -> None:
    run = trained("tiny", "model.tie_embeddings=true")
    saved = load_file(str(resolve_checkpoint(run) / "model.safetensors"))
    assert "lm_head.weight" not in saved and "model.embed_tokens.weight" in saved
    model = open_model(str(run), device="cpu").model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, saved["model.embed_tokens.weight"])


def test_save_model_open_model_round_trip(tmp_path: Path, trained) -> None:
    run = trained()
    opened = open_model(str(run), device="cpu")
    model, tokenizer = opened.model, opened.tokenizer
    export = save_model(model, tokenizer, tmp_path / "export")
    assert resolve_checkpoint(export) == export
    again = open_model(str(export), device="cpu").model
    ids = torch.tensor([tokenizer.encode("round trip")])
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))
    with pytest.raises(TapeError, match="does not exist"):
        resolve_checkpoint(tmp_path / "missing")
    with pytest.raises(TapeError, match="holds no checkpoint"):
        resolve_checkpoint(tmp_path)
