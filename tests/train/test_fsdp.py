"""FSDP2 (`train.parallel: fsdp`) on CPU with gloo: two processes give the same gradients and the same weights as
one process, and a sharded run stopped by SIGTERM resumes exactly."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import interrupt_helpers
import pytest
import torch
from train_helpers import REPO, assert_same_weights, subprocess_env, weights, write_recipe

from tapecli.recipe import load_recipe
from tapecli.train.engine import pretrain

# `python -m torch.distributed.run` is torchrun with this interpreter (and so this checkout's shipped recipes).
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# TAPE brings frozen (inert) parameters into the sharded blocks; tied embeddings a parameter shared by two modules.
MODEL = {"pe": "tape", "tie_embeddings": True}
TRAIN = {"batch_size": 8, "max_steps": 4, "save_every": 2, "keep_last": 0, "eval_every": 2, "schedule": "constant",
         "warmup": 0, "parallel": "fsdp"}


def torchrun(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*TORCHRUN, "--standalone", "--nproc_per_node", "2", *args], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 or not check, (proc.stdout + proc.stderr)[-3000:]
    return proc


@pytest.mark.slow
def test_two_sharded_processes_give_the_gradients_of_one(tmp_path: Path, tiny_corpus: Path) -> None:
    from fsdp_worker import gradients

    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, model=MODEL, train=TRAIN)
    one = gradients(str(recipe), str(tmp_path / "one"), ["train.micro_batch_size=4"])  # one process: this one
    torchrun(str(REPO / "tests" / "fsdp_worker.py"), str(recipe), str(tmp_path / "two"), str(tmp_path / "two.pt"),
             "train.micro_batch_size=2")
    two = torch.load(tmp_path / "two.pt")
    assert not one["sharded"] and two["sharded"]
    assert one["grads"].keys() == two["grads"].keys() and any(".pe." in k for k in one["grads"])
    for name, grad in one["grads"].items():  # a sum instead of a mean over ranks would be off by a factor of 2
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_sharded_run_matches_one_process_and_resumes_exactly_after_sigterm(tmp_path: Path, tiny_corpus: Path) -> None:
    """Two sharded processes train the weights of one. Then both get SIGTERM after the first checkpoint (as a
    cluster's preemption signals every rank): they agree on the step to stop after and save; the same command
    (resume auto) re-shards the optimizer state and ends with the weights of the uninterrupted run, exactly."""
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, model=MODEL, train=TRAIN)
    single = pretrain(load_recipe(str(recipe), ["train.micro_batch_size=4"]), tmp_path / "single")

    def command(out: Path) -> list[str]:
        return ["pretrain", "--recipe", str(recipe), "--out", str(out), "train.micro_batch_size=2"]

    whole = tmp_path / "whole"
    out = torchrun("-m", "tapecli.cli", *command(whole)).stdout
    assert "memory per device (estimate)" in out and out.count("done: 4 steps") == 1
    assert_same_weights(weights(single), weights(whole), atol=1e-5)

    stopped = tmp_path / "stopped"
    proc = torchrun(*interrupt_helpers.argv(command(stopped), "tapecli.train.engine:save_checkpoint", signal.SIGTERM),
                    check=False)
    assert proc.returncode != 0 and "stopped: SIGTERM after step" in proc.stderr, proc.stderr[-3000:]
    assert not (stopped / "checkpoints" / "step-00000004").exists()
    out = torchrun("-m", "tapecli.cli", *command(stopped)).stdout
    assert f"resuming from {stopped / 'checkpoints'}" in out
    assert_same_weights(weights(whole), weights(stopped))


@pytest.mark.slow
def test_sharded_context_extension_over_a_bf16_base(tmp_path: Path, tiny_corpus: Path, tiny_hf_llama: Path) -> None:
    """A frozen bf16 base under fp32 adapters (mixed dtypes, which FSDP2 stores as one), bf16 compute."""
    from tapecli.store.door import open_model

    run = tmp_path / "run"
    out = torchrun("-m", "tapecli.cli", "extend-context", "--base", str(tiny_hf_llama), "--method", "lora",
                   "--recipe", "context-extension-smoke", "--out", str(run), "model.max_seq_len=64",
                   f"data.source={tiny_corpus}", "train.parallel=fsdp", "train.precision=bf16", "train.max_steps=2",
                   "train.save_every=2").stdout
    assert out.count("done: 2 steps") == 1 and "method lora" in out
    saved = weights(run)
    assert any("lora_B" in k for k in saved) and not any(k.endswith("q_proj.weight") for k in saved)
    assert all(t.dtype == torch.float32 for t in saved.values())
    model = open_model(str(run), device="cpu").model
    assert model.config.max_seq_len == 64
