"""One writer per output directory (tapecli.store.claim), with real processes: a live owner refuses a second writer
in one line naming it; a SIGKILLed owner's claim is taken over with a note; a claim from another host counts while
its heartbeat is fresh; readers are not blocked."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from train_helpers import REPO, cli, subprocess_env, write_recipe
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.store import claim as claims
from tapecli.store.claim import INFO, LOCK, claim

HOLD = ("import sys, time\nfrom tapecli.store.claim import claim\n"
        "with claim(sys.argv[1], command=sys.argv[2], beside=sys.argv[3] == 'beside'):\n"
        "    print('held', flush=True)\n    time.sleep(120)\n")


@pytest.fixture
def holder():
    """Start a process that claims a directory and sleeps; yields a function (directory, command, beside) -> Popen.
    Every holder is SIGKILLed at the end."""
    procs: list[subprocess.Popen] = []

    def start(directory: Path, command: str = "tape pretrain --out x", beside: bool = False) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), command, "beside" if beside else "in"],
                                env=subprocess_env(), cwd=REPO, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_live_owner_refuses_a_second_writer_and_a_killed_one_is_taken_over(tmp_path, holder, capsys):
    out = tmp_path / "run"
    proc = holder(out, "tape pretrain --recipe c4-smoke --out run")
    with pytest.raises(TapeError) as refused, claim(out):
        pass
    message = str(refused.value)
    assert message.startswith(f"--out {out}: in use by tape pretrain --recipe c4-smoke --out run (pid {proc.pid} on "
                              f"{socket.gethostname()}, since ")
    assert message.endswith("wait for it to finish or stop it, or pass another --out") and "\n" not in message

    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up: the info file stays, the kernel drops the lock
    proc.wait()
    assert json.loads((out / INFO).read_text())["pid"] == proc.pid
    with claim(out, command="tape pretrain again"):
        assert json.loads((out / INFO).read_text())["command"] == "tape pretrain again"
    note = capsys.readouterr().err
    assert f"(pid {proc.pid} on " in note and note.strip().endswith("which is no longer running; taking it over")
    assert not (out / INFO).exists() and (out / LOCK).exists()  # released; the lock file stays (see release)


def test_a_claim_from_another_host_counts_while_its_heartbeat_is_fresh(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / INFO).write_text(json.dumps({"host": "node-17", "pid": 4242, "command": "tape pretrain",
                                        "since": "2026-11-25T10:00:00+00:00"}))
    with pytest.raises(TapeError, match=r"in use by tape pretrain \(pid 4242 on node-17, since 2026-11-25"), \
            claim(out):
        pass
    stale = time.time() - claims.STALE_AFTER - 5
    os.utime(out / INFO, (stale, stale))
    with claim(out):
        assert "node-17" in capsys.readouterr().err


def test_the_owner_keeps_its_claim_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "HEARTBEAT", 0.05)
    out = tmp_path / "run"
    with claim(out):
        old = time.time() - 1000
        os.utime(out / INFO, (old, old))
        time.sleep(0.3)
        assert time.time() - (out / INFO).stat().st_mtime < 5


def test_nested_claims_in_one_process_are_one_and_beside_leaves_the_directory_alone(tmp_path, holder):
    out = tmp_path / "run"
    with claim(out), claim(out / "."):
        assert (out / INFO).exists()
    assert not (out / INFO).exists()
    export = tmp_path / "exported"
    with claim(export, beside=True):
        assert not export.exists() and (tmp_path / f".exported{INFO}").exists()
    holder(export, "tape export --out exported", beside=True)
    with pytest.raises(TapeError, match="in use by tape export"), claim(export, beside=True):
        pass


def test_an_evaluation_folder_has_one_writer(tmp_path, holder):
    from tapecli.eval.common import SamplesLog

    folder = tmp_path / "eval-passkey"
    holder(folder, "tape eval passkey --out eval-passkey")
    with pytest.raises(TapeError, match="in use by tape eval passkey"), SamplesLog(folder, {"n": 1}):
        pass
    assert not (folder / "settings.json").exists()  # refused before anything was written


def test_a_second_tape_pretrain_on_the_same_out_is_refused_in_one_line(tmp_path, tiny_corpus):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, train={"max_steps": 100000, "save_every": 100000,
                                                                   "eval_every": 0, "log_every": 1000})
    out = tmp_path / "run"
    env = subprocess_env()
    first = subprocess.Popen(cli("pretrain", "--recipe", str(recipe), "--out", str(out)), cwd=REPO, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").exists():  # training has started (the claim came before any writing)
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # still running, holding its claim, but no longer taking a core
        second = CliRunner().invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(out)])  # in this process
    finally:
        first.kill()
        first.wait()
    line = one_line_error(second, 2)
    assert line.startswith(f"error: --out {out.resolve()}: in use by tape pretrain --recipe {recipe} --out {out}")
    assert f"(pid {first.pid} on {socket.gethostname()}, since " in line


def test_sweep_and_export_refuse_a_directory_in_use(tmp_path, holder):
    runner = CliRunner()
    sweep_out = tmp_path / "sweep"
    holder(sweep_out, "tape sweep --out sweep")
    result = runner.invoke(app, ["sweep", "--recipe", "selective-copy-smoke", "--pe", "rope", "--seeds", "0",
                                 "--out", str(sweep_out)])
    one_line_error(result, 2, f"--out {sweep_out.resolve()}: in use by tape sweep --out sweep")
    assert not (sweep_out / "sweep.json").exists()
