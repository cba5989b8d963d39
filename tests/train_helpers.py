"""Shared by the training tests: a tiny recipe (2 layers, dim 32, byte tokenizer, seq_len 32) and weight access."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent

TINY: dict[str, dict[str, Any]] = {
    "model": {"pe": "rope", "n_layers": 2, "dim": 32, "n_heads": 2, "max_seq_len": 64},
    "data": {"kind": "text", "tokenizer": "byte", "seq_len": 32, "val_fraction": 0.25},
    "train": {"batch_size": 4, "micro_batch_size": 2, "max_steps": 4, "lr": 3e-3, "min_lr": 3e-4, "warmup": 1,
              "schedule": "cosine", "precision": "fp32", "seed": 1234, "save_every": 2, "keep_last": 0,
              "eval_every": 2, "eval_batches": 2, "log_every": 1},
}


def write_recipe(path: Path, source: Path | str, **sections: dict[str, Any]) -> Path:
    """TINY with `source` as data.source and each section updated from `sections`; returns the YAML path."""
    tree = {name: {**body, **sections.get(name, {})} for name, body in TINY.items()}
    tree["data"]["source"] = str(source)
    path.write_text(yaml.safe_dump(tree))
    return path


def weights(run_or_checkpoint: Path) -> dict[str, torch.Tensor]:
    """The saved weights of a checkpoint, or of the newest checkpoint of a run directory."""
    from tapecli.store.checkpoint import resolve_checkpoint

    return load_file(str(resolve_checkpoint(run_or_checkpoint) / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if atol == 0.0:
            assert torch.equal(a[name], b[name]), f"{name} differs (max {float((a[name] - b[name]).abs().max())})"
        else:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=f"{name} differs")


class Interrupted(Exception):
    """Raised by `crash_after_checkpoint`: a run stopped right after a checkpoint, as a kill would stop it."""


def crash_after_checkpoint(monkeypatch, step: int) -> None:
    """Make the training engine raise Interrupted right after it saved the checkpoint of `step` (undo with
    monkeypatch.undo() before resuming)."""
    from tapecli.train import engine

    real_save = engine.save

    def save_then_crash(job, at: int, elapsed: float) -> Path:
        path = real_save(job, at, elapsed)
        if at == step:
            raise Interrupted
        return path

    monkeypatch.setattr(engine, "save", save_then_crash)


def subprocess_env() -> dict[str, str]:
    """Environment for `python -m tapecli.cli` / torchrun children: one thread each, the repo importable."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def cli(*args: str) -> list[str]:
    """argv running the tape CLI with this interpreter."""
    return [sys.executable, "-m", "tapecli.cli", *args]


def kill_after_first_checkpoint(args: list[str], out: Path, env: dict[str, str], last_step: int) -> None:
    """Start `tape ARGS` (a run into `out`), SIGKILL it as soon as its first checkpoint exists, and check that the
    kill came before the run's last step (`last_step`)."""
    proc = subprocess.Popen(cli(*args), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list((out / "checkpoints").glob("step-*")):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (out / "checkpoints" / f"step-{last_step:08d}").exists(), "the kill came too late to test anything"
