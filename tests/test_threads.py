"""tapecli.threads: `--threads N` / TAPE_THREADS on every command, the thread count in the startup line, passive
OpenMP waiting unless the user chose, and `tape doctor`'s warning on a busy machine."""

from __future__ import annotations

import os
import subprocess

import pytest
import typer
from train_helpers import REPO, cli, subprocess_env
from typer.testing import CliRunner

from tapecli import threads
from tapecli.cli import app

BENCH = ["bench", "--pe", "rope", "--n-layers", "1", "--dim", "8", "--n-heads", "2", "--seq-len", "4", "--steps", "1",
         "--warmup", "0", "--rounds", "1", "--no-memory", "--no-tape-paths"]


def test_every_command_takes_threads():
    def leaves(command, prefix="tape"):
        for name, sub in command.commands.items():
            yield from leaves(sub, f"{prefix} {name}") if hasattr(sub, "commands") else [(f"{prefix} {name}", sub)]

    found = dict(leaves(typer.main.get_command(app)))
    assert len(found) > 15
    for path, command in found.items():
        option = next((p for p in command.params if "--threads" in p.opts), None)
        assert option is not None and option.envvar == threads.ENV and option.min == 1, path


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in subprocess_env().items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY",
                                                                         threads.ENV)}
    return subprocess.run(cli(*args), cwd=REPO, env={**environment, **env}, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize(("args", "env", "line"), [
    (["--threads", "1"], {"OMP_WAIT_POLICY": "ACTIVE"}, "1 thread (of {n} cores; OMP_WAIT_POLICY=ACTIVE)"),
    ([], {"OMP_NUM_THREADS": "1"}, "1 thread (of {n} cores; OMP_WAIT_POLICY=PASSIVE)"),
    ([], {}, "{n} thread{s} (of {n} cores; OMP_WAIT_POLICY=PASSIVE)"),
], ids=["users-wait-policy", "users-omp-threads", "default"])
def test_the_startup_line_says_how_many_threads(args: list[str], env: dict[str, str], line: str) -> None:
    """In a fresh process, as a user runs it: the choice is made before torch loads. (`--threads` and TAPE_THREADS
    with the default wait policy: the training and evaluation lines below.)"""
    proc = _run(*BENCH, *args, **env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    n = threads.cores()
    expected = line.format(n=n, s="s" * (n != 1))
    assert f"cpu ({expected}, torch " in " ".join(proc.stdout.split()), proc.stdout


def test_the_training_and_evaluation_startup_lines(tmp_path, tiny_corpus) -> None:
    """Two fresh processes (a few seconds each on an idle 2-core CPU): the thread count is chosen before torch loads,
    which only a new process shows; `--threads 1` for the training, TAPE_THREADS=1 for the evaluation."""
    from train_helpers import write_recipe

    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, train={"max_steps": 1, "save_every": 1, "warmup": 0,
                                                                   "eval_every": 0})
    trained = _run("pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"), "--threads", "1")
    assert trained.returncode == 0, trained.stderr[-2000:]
    line = f"cpu, 1 thread (of {threads.cores()} cores; OMP_WAIT_POLICY=PASSIVE)"
    assert trained.stdout.splitlines()[0].startswith(line), trained.stdout
    evaluated = _run("passkey", "-m", str(tmp_path / "run"), "--budgets", "40", "--trials", "1", "--out",
                     str(tmp_path / "eval"), "--device", "cpu", **{threads.ENV: "1"})
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert evaluated.stdout.splitlines()[0].startswith(line), evaluated.stdout


def test_a_bad_thread_count_is_one_line() -> None:
    from cli_helpers import one_line_error

    runner = CliRunner()
    one_line_error(runner.invoke(app, ["recipes", "--threads", "0"]), 2, "Invalid value for '--threads'")
    one_line_error(runner.invoke(app, ["recipes"], env={threads.ENV: "many"}), 2, "TAPE_THREADS")


def test_in_process_the_callers_thread_count_is_kept_unless_a_count_is_given() -> None:
    import torch

    before, variable = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    runner = CliRunner()
    try:
        assert runner.invoke(app, ["recipes"]).exit_code == 0 and torch.get_num_threads() == before
        assert runner.invoke(app, ["recipes", "--threads", "1"]).exit_code == 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        if variable is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = variable


def test_doctor_warns_on_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tapecli.experiments.doctor.compile_works", lambda device: "not checked")
    monkeypatch.setattr(os, "getloadavg", lambda: (threads.cores() + 1.5, 0.0, 0.0))
    assert threads.busy() == (threads.cores() + 1.5, threads.cores())
    doctor = ["doctor", "--device", "cpu", "--pe", "rope", "--no-hybrids"]
    result = CliRunner().invoke(app, doctor)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert (f"warning: this machine is busy (load {threads.cores() + 1.5:.1f} on {threads.cores()} cores): other "
            "processes hold the CPU and every thread of a tape command waits for them at every op; while they run, "
            "use --threads 1 (or TAPE_THREADS=1)") in flat
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert threads.busy() is None
    assert "warning" not in CliRunner().invoke(app, doctor).output
