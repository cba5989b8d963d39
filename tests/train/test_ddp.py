"""Data parallelism: two torchrun processes (gloo on CPU) give the same weights as one process on the same batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import REPO, assert_same_weights, subprocess_env, weights, write_recipe

from tapecli.recipe import load_recipe
from tapecli.store.run import read_metrics
from tapecli.train.engine import pretrain


@pytest.mark.slow
def test_two_processes_match_one(tmp_path: Path, tiny_corpus: Path) -> None:
    # Global batch 8: one process does 2 micro-batches of 4; each of 2 ranks does 2 micro-batches of 2. TAPE: besides
    # what every model has, its last layer's inert state maps (parameters without gradients) must not upset DDP.
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, model={"pe": "tape"},
                          train={"batch_size": 8, "max_steps": 3})
    single = pretrain(load_recipe(str(recipe), ["train.micro_batch_size=4"]), tmp_path / "single")

    torchrun = Path(sys.executable).parent / "torchrun"
    ddp = tmp_path / "ddp"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "tapecli.cli", "pretrain",
                           "--recipe", str(recipe), "--out", str(ddp), "train.micro_batch_size=2"],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("done: 3 steps") == 1  # only rank 0 prints

    assert_same_weights(weights(single), weights(ddp), atol=1e-5)
    single_rows, ddp_rows = read_metrics(single), read_metrics(ddp)
    assert [r["step"] for r in single_rows] == [r["step"] for r in ddp_rows]
    for a, b in zip(single_rows, ddp_rows, strict=True):
        for key in ("loss", "val_loss"):
            if key in a:
                assert abs(a[key] - b[key]) < 1e-5
