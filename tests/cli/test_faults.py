"""Fault injection through the CLI: corrupt and truncated files of every kind tape reads, unwritable outputs, a full
disk, out of memory, SIGTERM then resume, a kill during pruning, a recipe that would change what a checkpoint means.

Each fault must give one line (`error: ...` naming the file or key), the right exit code (2 bad input, 1 failed run),
no traceback, and leave every file written before byte-identical.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error
from shared_runs import ADDITION_RUN
from train_helpers import REPO, assert_same_weights, cli, subprocess_env, weights, write_recipe
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import list_checkpoints
from tapecli.store.run import read_metrics
from tapecli.train import engine

runner = CliRunner()
STEP2 = Path("checkpoints") / "step-00000002"


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(6):
        (root / f"doc{i}.txt").write_text(" ".join(f"Word{(i * 7 + j) % 97} sits at place {j * 13 % 101}; "
                                                   f"the {['quick', 'lazy', 'brown', 'tall'][j % 4]} one moves."
                                                   for j in range(80)))
    return root


@pytest.fixture(scope="module")
def base_run(trained) -> Path:
    """A finished 2-step run (one checkpoint, step-00000002) of the tiny recipe, shared; tests work on copies."""
    return trained()


@pytest.fixture
def run_copy(base_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(base_run, copy)
    return copy


def resume(run: Path, *overrides: str):
    """Continue `run` (a copy of base_run) to step 4 with its own resolved recipe."""
    return runner.invoke(app, ["pretrain", "--recipe", str(run / "recipe.yaml"), "--out", str(run),
                               "train.max_steps=4", *overrides])


# ---------------------------------------------------------------------------------------------------------------
# Corrupt and truncated files


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00garbage\xff" * 8)


@pytest.mark.parametrize("damage", [_truncate, _garbage], ids=["truncated", "garbage"])
@pytest.mark.parametrize("name", ["model.safetensors", "model_config.json", "train_state.pt",
                                  "tokenizer/tokenizer_meta.json", "../../run.json"])
def test_corrupt_run_files_are_one_line_and_nothing_is_rewritten(run_copy: Path, name: str, damage) -> None:
    bad = (run_copy / STEP2 / name).resolve()
    damage(bad)
    before = snapshot(run_copy)
    named = bad.parent if bad.parent.name == "tokenizer" else bad  # a saved tokenizer is named by its folder
    line = one_line_error(resume(run_copy), 2, str(named))
    assert re.search(r"is corrupt or truncated \(.+\)|is not UTF-8 text", line), line
    assert snapshot(run_copy) == before


def test_corrupt_checkpoint_is_one_line_for_evaluation_too(run_copy: Path, tmp_path: Path) -> None:
    _truncate(run_copy / STEP2 / "model.safetensors")
    result = runner.invoke(app, ["eval", "addition", "--checkpoint", str(run_copy), "--max-len", "2",
                                 "--out", str(tmp_path / "eval")])
    one_line_error(result, 2, str(run_copy / STEP2 / "model.safetensors"), "corrupt or truncated")


def test_recipe_that_is_not_utf8(tmp_path: Path) -> None:
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("model:\n  pe: rope  # café\n".encode("latin-1"))
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run")])
    one_line_error(result, 2, str(recipe), "is not UTF-8 text")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content", [b"", b"not a sentencepiece model"], ids=["empty", "garbage"])
def test_corrupt_sentencepiece_model(tmp_path: Path, corpus: Path, content: bytes) -> None:
    model = tmp_path / "tok.model"
    model.write_bytes(content)
    recipe = write_recipe(tmp_path / "r.yaml", corpus, data={"tokenizer": str(model)})
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run")])
    one_line_error(result, 2, str(model), "corrupt or truncated")
    assert not (tmp_path / "run").exists()


def test_truncated_sentencepiece_model_in_a_checkpoint(tmp_path: Path, corpus: Path) -> None:
    from tapecli.data.tokenizer import train_tokenizer

    train_tokenizer(str(corpus), 300, str(tmp_path / "tok.model"))
    recipe = write_recipe(tmp_path / "r.yaml", corpus, data={"tokenizer": str(tmp_path / "tok.model")},
                          train={"max_steps": 1, "save_every": 1, "warmup": 0})
    run = engine.pretrain(load_recipe(str(recipe)), tmp_path / "sp")
    saved = run / "checkpoints" / "step-00000001" / "tokenizer" / "tokenizer.model"
    _truncate(saved)
    result = runner.invoke(app, ["finetune", "--checkpoint", str(run), "--recipe", str(recipe),
                                 "--out", str(tmp_path / "ft")])
    one_line_error(result, 2, str(saved.parent), "corrupt or truncated")


def test_corrupt_evaluation_settings(tmp_path: Path, trained) -> None:
    run = trained(*ADDITION_RUN)
    args = ["eval", "addition", "--checkpoint", str(run), "--max-len", "2", "--samples", "1",
            "--out", str(tmp_path / "eval")]
    assert runner.invoke(app, args).exit_code == 0
    settings = tmp_path / "eval" / "settings.json"
    _truncate(settings)
    before = snapshot(tmp_path / "eval")
    one_line_error(runner.invoke(app, args), 2, str(settings), "corrupt or truncated")
    assert snapshot(tmp_path / "eval") == before
    one_line_error(runner.invoke(app, [*args[:-2], "--batch-size", "0"]), 2, "--batch-size",
                   "greater than or equal to 1")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions (these tests run as root "
                                               "in some sandboxes)")
def test_unreadable_checkpoint_file(run_copy: Path) -> None:
    weights_file = run_copy / STEP2 / "model.safetensors"
    weights_file.chmod(0)
    try:
        one_line_error(resume(run_copy), 2, str(weights_file), "permission denied")
    finally:
        weights_file.chmod(0o644)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into read-only directories")
def test_read_only_out_fails_before_any_work(tmp_path: Path, corpus: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        result = runner.invoke(app, ["tokenizer", "train", "--data", str(corpus), "--vocab-size", "300",
                                     "--out", str(locked / "tok.model")])
        one_line_error(result, 2, str(locked), "cannot write")
    finally:
        locked.chmod(0o755)


# ---------------------------------------------------------------------------------------------------------------
# Outputs checked before the work starts


@pytest.mark.parametrize(("args", "fragment"), [
    (["bench", "--out", "{tmp}"], "is a directory"),
    (["tokenizer", "train", "--data", "{corpus}", "--vocab-size", "300", "--out", "{tmp}/dir.model"],
     "is a directory"),
    (["pretrain", "--recipe", "c4-smoke", "--out", "{tmp}/file.txt", "data.source={corpus}"], "is a file"),
    (["eval", "addition", "--checkpoint", "{tmp}", "--out", "{tmp}/file.txt"], "is a file"),
])
def test_unusable_out_fails_at_once(tmp_path: Path, corpus: Path, args: list[str], fragment: str) -> None:
    (tmp_path / "dir.model").mkdir()
    (tmp_path / "file.txt").write_text("keep me\n")
    started = time.perf_counter()
    result = runner.invoke(app, [a.format(tmp=tmp_path, corpus=corpus) for a in args])
    one_line_error(result, 2, "--out", fragment)
    assert time.perf_counter() - started < 5  # nothing was benchmarked or trained first
    assert (tmp_path / "file.txt").read_text() == "keep me\n"


# ---------------------------------------------------------------------------------------------------------------
# Disk full


def with_tmpfs(mount: Path, options: str, script: str) -> subprocess.CompletedProcess:
    """Run `script` (sh) with a fresh tmpfs mounted at `mount` (in a user namespace: no root needed where the
    kernel allows them); skip the test where it cannot be mounted. Exit codes 98/99 are reserved."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a tmpfs")
    mount.mkdir(exist_ok=True)
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o {options} tmpfs {mount} || exit 99; "
                           + script], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    if proc.returncode in (98, 99) or proc.stderr.startswith("unshare:"):
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {proc.stderr.strip()[:200]}")
    return proc


def test_full_disk_while_saving_keeps_the_previous_checkpoint(base_run: Path, tmp_path: Path) -> None:
    """A real out-of-space file system: a tmpfs just big enough for the run so far."""
    mount, out = tmp_path / "mnt", tmp_path / "after"
    size_kb = sum(len(b) for b in snapshot(base_run).values()) // 1024 + 200  # < one more checkpoint (~630 KB)
    proc = with_tmpfs(mount, f"size={size_kb}k", f"cp -a {base_run} {mount}/run || exit 98; "
                      f"{sys.executable} -m tapecli.cli pretrain --recipe {mount}/run/recipe.yaml --out {mount}/run "
                      f"train.max_steps=4; rc=$?; cp -a {mount}/run {out}; exit $rc")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (f"error: no space left on device while writing "
                                                    f"{mount}/run/checkpoints/step-00000004")
    assert snapshot(out / STEP2) == snapshot(base_run / STEP2)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000002"]  # no partial save left


def test_read_only_file_system_fails_before_any_work(tmp_path: Path, corpus: Path) -> None:
    mount = tmp_path / "ro"
    proc = with_tmpfs(mount, "ro", f"{sys.executable} -m tapecli.cli tokenizer train --data {corpus} "
                      f"--vocab-size 300 --out {mount}/tok.model; echo rc=$?; {sys.executable} -m tapecli.cli bench "
                      f"--out {mount}/bench.json --dim 8 --n-heads 2 --n-layers 1 --seq-len 4 --rounds 1 --steps 1")
    lines = proc.stderr.strip().splitlines()
    assert proc.stdout.strip() == "rc=2" and proc.returncode == 2 and "Traceback" not in proc.stderr
    assert lines == [f"error: --out {mount}/tok.model: cannot write in {mount} (read-only file system)",
                     f"error: --out {mount}/bench.json: cannot write in {mount} (read-only file system)"]


def test_full_disk_while_writing_a_tokenizer_keeps_the_old_one(tmp_path: Path, corpus: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC injected at the write: half the bytes land, then the OS error."""
    out = tmp_path / "tok.model"
    assert runner.invoke(app, ["tokenizer", "train", "--data", str(corpus), "--vocab-size", "300",
                               "--out", str(out)]).exit_code == 0
    good = out.read_bytes()

    def copy_until_full(src: str, dst: str) -> None:
        Path(dst).write_bytes(Path(src).read_bytes()[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("tapecli.data.tokenizer.shutil.copyfile", copy_until_full)
    result = runner.invoke(app, ["tokenizer", "train", "--data", str(corpus), "--vocab-size", "320",
                                 "--out", str(out)])
    one_line_error(result, 1, f"no space left on device while writing {out}")
    assert out.read_bytes() == good and os.listdir(tmp_path) == ["tok.model"]  # no partial file either


# ---------------------------------------------------------------------------------------------------------------
# Out of memory, bugs, --debug


def test_out_of_memory_is_one_line_with_size_and_hint(run_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity "
                                     "of 79.11 GiB of which 1.2 GiB is free.")

    monkeypatch.setattr(engine, "_loss_sum", no_memory)
    line = one_line_error(resume(run_copy), 1, "out of GPU memory allocating 2.50 GiB",
                          "lower train.micro_batch_size or data.seq_len")
    assert re.search(r"for a [\d,]+-parameter model \(2 x 32 tokens per micro-batch\)", line), line


def test_real_bugs_keep_their_traceback_and_debug_shows_every_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(**kwargs):
        return 1 / 0

    monkeypatch.setattr("tapecli.experiments.bench.run_bench", bug)
    assert isinstance(runner.invoke(app, ["bench"]).exception, ZeroDivisionError)
    monkeypatch.undo()
    one_line_error(runner.invoke(app, ["bench", "--n-heads", "3"]), 2, "--n-heads 3 does not divide --dim 256")
    from tapecli.errors import TapeError

    assert isinstance(runner.invoke(app, ["--debug", "bench", "--n-heads", "3"]).exception, TapeError)
    assert isinstance(runner.invoke(app, ["bench", "--n-heads", "3"], env={"TAPE_DEBUG": "1"}).exception, TapeError)
    proc = subprocess.run(cli("bench", "--n-heads", "3"), env={**subprocess_env(), "TAPE_DEBUG": "1"}, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "does not divide --dim" in proc.stderr


# ---------------------------------------------------------------------------------------------------------------
# Nothing already written is damaged


@pytest.mark.parametrize(("overrides", "fragment"), [
    (["model.max_seq_len=128"], "model.max_seq_len: the recipe asks for 128"),
    (["model.pe_args.theta=500"], "model.pe_args"),
])
def test_continuing_with_a_recipe_that_changes_the_checkpoint_is_refused(run_copy: Path, overrides: list[str],
                                                                          fragment: str) -> None:
    before = snapshot(run_copy)
    one_line_error(resume(run_copy, *overrides), 2, fragment)
    assert snapshot(run_copy) == before


def test_continuing_with_another_data_kind_is_refused(run_copy: Path, tmp_path: Path) -> None:
    addition = tmp_path / "addition.yaml"  # a recipe holds only its kind's keys: another kind is another file
    addition.write_text("model: {pe: rope}\ndata: {kind: addition, max_digits: 3, seq_len: 32}\n")
    before = snapshot(run_copy)
    one_line_error(runner.invoke(app, ["pretrain", "--recipe", str(addition), "--out", str(run_copy),
                                       "train.max_steps=4"]), 2, "data.kind: the recipe says 'addition'")
    assert snapshot(run_copy) == before


def test_continuing_with_another_tokenizer_is_refused(run_copy: Path, tmp_path: Path, corpus: Path) -> None:
    from tapecli.data.tokenizer import train_tokenizer

    tok = train_tokenizer(str(corpus), 320, str(tmp_path / "tok.model"))
    before = snapshot(run_copy)
    one_line_error(resume(run_copy, f"data.tokenizer={tok}", "model.vocab_size=null"), 2,
                   f"data.tokenizer: '{tok}' is not the tokenizer")
    assert snapshot(run_copy) == before


def test_half_written_metrics_line_is_skipped_on_resume(run_copy: Path) -> None:
    complete = read_metrics(run_copy)
    with (run_copy / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 5.1')  # killed mid-write
    assert read_metrics(run_copy) == complete
    assert resume(run_copy).exit_code == 0
    assert [r["step"] for r in read_metrics(run_copy)] == [1, 2, 2, 3, 4, 4]


def test_too_small_corpus_leaves_nothing_behind(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_text("too short\n" * 3)
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "tiny.txt")
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run")])
    one_line_error(result, 2, "fewer than seq_len + 1")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_kill_during_pruning_leaves_only_complete_checkpoints(tmp_path: Path, corpus: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import tapecli.store.checkpoint as checkpoint

    recipe = write_recipe(tmp_path / "r.yaml", corpus, train={"max_steps": 3, "save_every": 1, "keep_last": 1})
    real_rmtree = shutil.rmtree

    def killed_half_way(path, *args, **kwargs):
        if Path(path).name.startswith(".tmp-deleted-"):
            (Path(path) / "model.safetensors").unlink()
            raise KeyboardInterrupt  # the process dies half-way through the deletion
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        engine.pretrain(load_recipe(str(recipe)), tmp_path / "run")
    monkeypatch.undo()
    root = tmp_path / "run" / "checkpoints"
    steps = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
    assert steps == ["step-00000002"] and [p.name for p in list_checkpoints(root)] == steps
    assert any(p.name.startswith(".tmp-deleted-step-00000001") for p in root.iterdir())
    engine.pretrain(load_recipe(str(recipe)), tmp_path / "run")  # resumes and sweeps the leftover away
    assert sorted(p.name for p in root.iterdir()) == ["step-00000003"]


# ---------------------------------------------------------------------------------------------------------------
# Preemption


@pytest.mark.slow
def test_sigterm_saves_says_how_to_resume_and_resuming_is_exact(tmp_path: Path, corpus: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", corpus, model={"pe": "randpe"},
                          train={"max_steps": 16, "save_every": 1000, "eval_every": 0, "log_every": 1})
    whole = engine.pretrain(load_recipe(str(recipe)), tmp_path / "whole")

    out = tmp_path / "stopped"
    proc = subprocess.Popen(cli("pretrain", "--recipe", str(recipe), "--out", str(out)), cwd=REPO,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # plain log lines: "step 3/40 | loss ..."
        if line.startswith("step 2/"):
            proc.send_signal(signal.SIGTERM)
            break
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    match = re.search(r"stopped: SIGTERM after step (\d+); saved (\S+); resume with: (.+)", stderr)
    assert match and "Traceback" not in stderr, stderr
    step = int(match.group(1))
    assert 2 <= step < 16 and Path(match.group(2)) == out / "checkpoints" / f"step-{step:08d}"
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [f"step-{step:08d}"]

    command = shlex.split(match.group(3))
    assert command[:2] == ["tape", "pretrain"] and "--resume" in command and "auto" in command
    resumed = runner.invoke(app, command[1:])  # the command it printed, here in this process (one thread too)
    assert resumed.exit_code == 0, resumed.output
    assert_same_weights(weights(whole), weights(out))


def test_second_ctrl_c_stops_at_once() -> None:
    from tapecli.train.preemption import StopSignal

    # Python's own Ctrl-C handler as the one to restore (a library imported by an earlier test may have replaced it).
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopSignal() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert stop.requested(None) and stop.signal_number == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, outer)


# ---------------------------------------------------------------------------------------------------------------
# Input checks


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "0"], "Invalid value for '--steps': Input should be greater than or equal to 1"),
    (["--rounds", "-1"], "Invalid value for '--rounds': Input should be greater than or equal to 1"),
    (["--dim", "0"], "Invalid value for '--dim': Input should be greater than or equal to 1"),
    (["--dim", "30", "--n-heads", "4"], "--n-heads 4 does not divide --dim 30"),
    (["--seq-len", "0"], "--seq-len: 0 must be at least 1"),
    (["--batch-size", "-2"], "Invalid value for '--batch-size': Input should be greater than or equal to 1"),
    (["--decode", "--prompt-len", "0"], "Invalid value for '--prompt-len': Input should be greater than or equal to 1"),
    (["--decode", "--new-tokens", "-2"], "Invalid value for '--new-tokens': Input should be greater than or equal "
                                         "to 1"),
])
def test_bench_options_are_checked(args: list[str], message: str) -> None:
    one_line_error(runner.invoke(app, ["bench", *args]), 2, message)


@pytest.mark.parametrize("pe", ["tape", "fire"])
@pytest.mark.parametrize("hidden", ["0", "-4"])
def test_pe_hidden_must_be_positive(tmp_path: Path, corpus: Path, pe: str, hidden: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", corpus)
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"), f"model.pe={pe}",
                                 f"model.pe_args.hidden={hidden}"])
    one_line_error(result, 2, f"model.pe_args.hidden: must be a positive integer, got {hidden}")
    assert not (tmp_path / "run").exists()


def test_tokenizer_vocab_size_zero(tmp_path: Path, corpus: Path) -> None:
    result = runner.invoke(app, ["tokenizer", "train", "--data", str(corpus), "--vocab-size", "0",
                                 "--out", str(tmp_path / "t.model")])
    one_line_error(result, 2, "Invalid value for '--vocab-size': Input should be greater than or equal to 1")


def test_faults_are_explained_and_bugs_are_not() -> None:
    from tapecli.faults import explain

    assert explain(PermissionError(errno.EACCES, "Permission denied", "/data/x.txt")) == (
        "/data/x.txt: permission denied", 2, "error")
    assert explain(IsADirectoryError(errno.EISDIR, "Is a directory", "out.json")) == (
        "out.json: is a directory", 2, "error")
    assert explain(OSError(errno.ENOSPC, "No space left on device", "/runs/a/metrics.jsonl")) == (
        "no space left on device while writing /runs/a/metrics.jsonl", 1, "error")
    assert explain(OSError(errno.EROFS, "Read-only file system", "/mnt/x")) == ("/mnt/x: read-only file system", 2,
                                                                               "error")
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert explain(rust) == ("no space left on device (Error while serializing: I/O error: No space left on device "
                             "(os error 28))", 1, "error")
    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)")
    message, code, _ = explain(cpu)
    assert code == 1 and message.startswith("out of CPU memory allocating 1.00 GiB")
    for bug in (ZeroDivisionError(), KeyError("x"), RuntimeError("shape mismatch"), ValueError("bad")):
        assert explain(bug) is None


# ---------------------------------------------------------------------------------------------------------------
# Broken Hugging Face directories (issue 19, and issue 18's Hugging Face rows)
#
# Tiny Llamas saved by transformers' save_pretrained, then damaged the way downloads and hand edits damage them.
# Every command that opens one reads it through the importer's one file boundary (tapecli.model.hf.files), so each
# damage is one line naming the file and the problem, exit code 2, no traceback, and no --out left behind.


@pytest.fixture(scope="module")
def hf_llamas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/sharded: 12 shards + index, tokenizer.json; ROOT/single: model.safetensors, SentencePiece tokenizer.model
    (vocabulary 60); ROOT/corpus.txt. Tests damage copies."""
    pytest.importorskip("transformers")
    from hf_helpers import make_hf_llama, sample_text

    root = tmp_path_factory.mktemp("hf")
    make_hf_llama(root / "sharded", n_kv_heads=2, max_position_embeddings=32)
    make_hf_llama(root / "single", n_kv_heads=2, max_position_embeddings=32, shard="10GB", tokenizer="sp", vocab=60)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    (root / "docs.jsonl").write_text('{"text": "the model reads a long sequence"}\n')
    (root / "tiny_ppl.yaml").write_text(  # a local lm-eval task: no indexing of lm-eval's built-in tasks
        f"task: tiny_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'docs.jsonl'}\n"
        'test_split: test\nmetadata: {version: 1.0}\noutput_type: loglikelihood_rolling\ndoc_to_text: ""\n'
        'doc_to_target: "{{text}}"\nmetric_list: [{metric: word_perplexity}]\n')
    return root


def _edit_json(path: Path, edit) -> None:
    import json

    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def _edit_tensors(path: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _dangling(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent / "blobs" / "deleted")


def _without(*keys: str):
    return lambda config: {k: v for k, v in config.items() if k not in keys}


def _with(**values):
    return lambda config: {**config, **values}


# (id, base, damage(directory), fragments of the one line; {d} is the damaged directory)
HF_DAMAGE = [
    ("config-is-a-list", "sharded", lambda d: _edit_json(d / "config.json", list),
     ["{d}/config.json is not a JSON object", "JSON list"]),
    ("index-truncated", "sharded", lambda d: _truncate(d / "model.safetensors.index.json"),
     ["{d}/model.safetensors.index.json is corrupt or truncated"]),
    ("shard-garbage", "sharded", lambda d: _garbage(d / "model-00003-of-00012.safetensors"),
     ["{d}/model-00003-of-00012.safetensors is corrupt or truncated", "header too large"]),
    ("weights-truncated", "single", lambda d: _truncate(d / "model.safetensors"),
     ["{d}/model.safetensors is corrupt or truncated", "incomplete metadata"]),
    ("weights-empty", "single", lambda d: (d / "model.safetensors").write_bytes(b""),
     ["{d}/model.safetensors is corrupt or truncated", "header too small"]),
    ("weights-garbage", "single", lambda d: _garbage(d / "model.safetensors"),
     ["{d}/model.safetensors is corrupt or truncated", "header too large"]),
    ("weight-integer", "single", lambda d: _edit_tensors(d / "model.safetensors", lambda t: t.update(
        {"model.layers.0.mlp.up_proj.weight": t["model.layers.0.mlp.up_proj.weight"].to(torch.int64)})),
     ["{d}/model.safetensors: model.layers.0.mlp.up_proj.weight is stored as int64"]),
    ("weight-shape", "single", lambda d: _edit_tensors(d / "model.safetensors", lambda t: t.update(
        {"lm_head.weight": t["lm_head.weight"][:-1].clone()})),
     ["{d}/model.safetensors: lm_head.weight has shape (59, 64), {d}/config.json implies (60, 64)"]),
    ("sentencepiece-corrupt", "single", lambda d: _garbage(d / "tokenizer.model"),
     ["{d}/tokenizer.model is corrupt or truncated", "could not parse ModelProto"]),
    ("tokenizer-config-corrupt", "sharded", lambda d: _truncate(d / "tokenizer_config.json"),
     ["{d}/tokenizer_config.json is corrupt or truncated"]),
    ("no-architecture", "sharded", lambda d: _edit_json(d / "config.json", _without("architectures", "model_type")),
     ["{d}/config.json names no architecture", "add \"architectures\": [\"LlamaForCausalLM\"]"]),
    ("unsupported-architecture", "sharded", lambda d: _edit_json(d / "config.json",
                                                                 _with(architectures=["PhiForCausalLM"])),
     ["{d}/config.json: architectures ['PhiForCausalLM'] is not supported; the nearest supported is "
      "Phi3ForCausalLM"]),
    ("unsupported-config-key", "sharded", lambda d: _edit_json(d / "config.json", _with(attention_bias=True)),
     ["{d}/config.json: attention_bias=True is not supported"]),
    ("config-size-not-a-number", "sharded", lambda d: _edit_json(d / "config.json", _with(hidden_size="64")),
     ["{d}/config.json: hidden_size must be a positive integer, got '64'"]),
    ("unexpected-tensor", "single", lambda d: _edit_tensors(d / "model.safetensors", lambda t: t.update(
        {"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)})),
     ["{d}/model.safetensors: unexpected tensor model.layers.0.self_attn.q_proj.bias"]),
    ("missing-tensor", "single", lambda d: _edit_tensors(d / "model.safetensors",
                                                         lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
     ["{d}: the weights lack model.layers.1.mlp.up_proj.weight"]),
    ("missing-shard", "sharded", lambda d: (d / "model-00005-of-00012.safetensors").unlink(),
     ["{d}/model.safetensors.index.json lists the shard model-00005-of-00012.safetensors, which is not in {d}"]),
    ("index-names-absent-file", "sharded", lambda d: (d / "model.safetensors.index.json").write_text(
        (d / "model.safetensors.index.json").read_text().replace("model-00007-of-00012", "model-7-of-12")),
     ["{d}/model.safetensors.index.json lists the shard model-7-of-12.safetensors, which is not in {d}"]),
    ("no-weights", "single", lambda d: (d / "model.safetensors").unlink(), ["{d} has no model.safetensors"]),
    ("weights-dangling-symlink", "single", lambda d: _dangling(d / "model.safetensors"),  # a hub cache's lost blob
     ["{d}/model.safetensors: no such file or directory"]),
    ("no-tokenizer", "sharded", lambda d: (d / "tokenizer.json").unlink(), ["{d} has no tokenizer"]),
    ("no-config", "sharded", lambda d: (d / "config.json").unlink(), ["{d} has no config.json"]),
]


def _damaged(hf_llamas: Path, tmp_path: Path, base: str, damage) -> Path:
    copy = tmp_path / "hf"
    shutil.copytree(hf_llamas / base, copy)
    damage(copy)
    return copy


def _extend(base: Path | str, out: Path, corpus: Path, *extra: str) -> list[str]:
    return ["extend-context", "--base", str(base), "--recipe", "context-extension-smoke", "--out", str(out),
            "model.max_seq_len=64", f"data.source={corpus}", "train.max_steps=1", "train.warmup=0",
            "train.eval_every=0", *extra]


@pytest.mark.parametrize(("base", "damage", "fragments"), [row[1:] for row in HF_DAMAGE],
                         ids=[row[0] for row in HF_DAMAGE])
def test_damaged_hf_base_is_one_line_and_writes_no_out(hf_llamas: Path, tmp_path: Path, base: str, damage,
                                                       fragments: list[str]) -> None:
    directory = _damaged(hf_llamas, tmp_path, base, damage)
    out = tmp_path / "run"
    result = runner.invoke(app, _extend(directory, out, hf_llamas / "corpus.txt"))
    one_line_error(result, 2, *(f.format(d=directory) for f in fragments))
    assert not out.exists()


# Every other command that opens a Hugging Face directory, with a damaged weight file and with a missing tokenizer
# (the tokenizer is read at a different place when training and when evaluating).
HF_COMMANDS = {
    "eval-addition": ["eval", "addition", "--model", "{d}", "--max-len", "2", "--samples", "1"],
    "eval-perplexity": ["eval", "perplexity", "--model", "{d}", "--data", "{corpus}", "--seq-len", "16",
                        "--max-windows", "1"],
    "eval-passkey": ["eval", "passkey", "--model", "{d}", "--max-tokens", "64", "--trials", "1"],
    "eval-scrolls": ["eval", "scrolls", "--model", "{d}", "--task", "qasper", "--data", "{corpus}", "--limit", "1"],
    "eval-harness": ["eval", "harness", "--model", "{d}", "--tasks", "{root}/tiny_ppl.yaml", "--limit", "1"],
    "train-init-from": ["pretrain", "--recipe", "context-extension-smoke", "train.init_from={d}",
                        "data.source={corpus}", "train.max_steps=1", "train.warmup=0"],
}


@pytest.mark.parametrize("command", list(HF_COMMANDS))
@pytest.mark.parametrize(("damage", "fragment"), [
    (lambda d: _garbage(d / "model-00002-of-00012.safetensors"),
     "{d}/model-00002-of-00012.safetensors is corrupt or truncated"),
    (lambda d: (d / "tokenizer.json").unlink(), "{d} has no tokenizer"),
], ids=["garbage-shard", "no-tokenizer"])
def test_every_command_opening_a_hf_directory_goes_through_the_boundary(hf_llamas: Path, tmp_path: Path,
                                                                        command: str, damage, fragment: str) -> None:
    directory = _damaged(hf_llamas, tmp_path, "sharded", damage)
    out = tmp_path / "out" / "nested"
    args = [a.format(d=directory, corpus=hf_llamas / "corpus.txt", root=hf_llamas) for a in HF_COMMANDS[command]]
    one_line_error(runner.invoke(app, [*args, "--out", str(out)]), 2, fragment.format(d=directory))
    assert not (tmp_path / "out").exists()  # not even the parent the command would have created


def test_eval_synthetic_refuses_a_hf_model_before_opening_it(hf_llamas: Path, tmp_path: Path) -> None:
    """`tape eval synthetic` needs a run trained on a synthetic task (its recipe gives the splits): a Hugging Face
    directory, damaged or not, is refused before any of its files is read."""
    directory = _damaged(hf_llamas, tmp_path, "sharded", lambda d: _garbage(d / "model-00002-of-00012.safetensors"))
    out = tmp_path / "out" / "nested"
    one_line_error(runner.invoke(app, ["eval", "synthetic", "--model", str(directory), "--out", str(out)]), 2,
                   f"{directory} is not from a run trained on a synthetic task")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def trained_extension(hf_llamas: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a LoRA extension trained one step on a copy of the sharded base, that copy)."""
    root = tmp_path_factory.mktemp("extended")
    base, run = root / "base", root / "run"
    shutil.copytree(hf_llamas / "sharded", base)
    result = runner.invoke(app, [*_extend(base, run, hf_llamas / "corpus.txt"), "--method", "lora"])
    assert result.exit_code == 0, result.output
    return run, base


@pytest.fixture
def extended_run(trained_extension: tuple[Path, Path], hf_llamas: Path) -> Iterator[tuple[Path, Path]]:
    """`trained_extension`, its base put back intact after the test (which damages it)."""
    yield trained_extension
    shutil.rmtree(trained_extension[1], ignore_errors=True)
    shutil.copytree(hf_llamas / "sharded", trained_extension[1])


@pytest.mark.parametrize(("damage", "fragment"), [
    (lambda d: _garbage(d / "model-00004-of-00012.safetensors"),
     "{d}/model-00004-of-00012.safetensors is corrupt or truncated"),
    (lambda d: (d / "config.json").unlink(), "{d}: the Hugging Face base this checkpoint was trained on has no "
                                             "config.json"),
    (lambda d: shutil.rmtree(d), "{d}: the Hugging Face base this checkpoint was trained on is gone"),
], ids=["garbage-shard", "no-config", "base-gone"])
def test_export_of_an_extended_run_whose_base_was_damaged(extended_run: tuple[Path, Path], tmp_path: Path, damage,
                                                          fragment: str) -> None:
    run, base = extended_run
    damage(base)
    before = snapshot(run)
    one_line_error(runner.invoke(app, ["export", "--checkpoint", str(run), "--out", str(tmp_path / "exported")]), 2,
                   fragment.format(d=base))
    assert not (tmp_path / "exported").exists() and snapshot(run) == before


# ---------------------------------------------------------------------------------------------------------------
# A changed base (issue 38, case 1): an extension run keeps only its own tensors and re-reads the frozen base from
# the directory it recorded; base_model.json holds the base's fingerprint, checked whenever the run is opened.


def _other_base(directory: Path) -> None:
    """The same architecture and shapes, other weights (another seed), in place of the base."""
    from hf_helpers import make_hf_llama

    shutil.rmtree(directory)
    make_hf_llama(directory, n_kv_heads=2, max_position_embeddings=32, seed=7)


def _base_line(run: Path, base: Path) -> str:
    import json

    from tapecli.model.hf.files import fingerprint

    recorded = json.loads((run / "checkpoints" / "step-00000001" / "base_model.json").read_text())["fingerprint"]
    now = fingerprint(base)
    assert recorded["revision"] is None and now["files"].keys() == recorded["files"].keys()  # same files, same sizes
    assert all(now["files"][f]["bytes"] == recorded["files"][f]["bytes"] for f in now["files"])
    return (f"error: {base}: not the Hugging Face base this checkpoint was trained on (trained on weights "
            f"{recorded['sha256'][:12]} (12 files); found weights {now['sha256'][:12]} (12 files)); put that base "
            "back there (base_model.json records where it was and its fingerprint)")


def test_an_extension_run_refuses_a_base_with_other_weights_wherever_it_is_opened(
        extended_run: tuple[Path, Path], hf_llamas: Path, tmp_path: Path) -> None:
    run, base = extended_run
    corpus = hf_llamas / "corpus.txt"
    args = ["eval", "perplexity", "--model", str(run), "--data", str(corpus), "--seq-len", "16", "--max-windows", "1"]
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "before")]).exit_code == 0
    _other_base(base)
    line = _base_line(run, base)
    before = snapshot(run)
    for command in ([*args, "--out", str(tmp_path / "eval")],
                    ["export", "--checkpoint", str(run), "--out", str(tmp_path / "export")],
                    ["finetune", "--checkpoint", str(run), "--recipe", "c4-smoke", "--out", str(tmp_path / "ft"),
                     f"data.source={corpus}", "train.max_steps=1"],
                    _extend(base, run, corpus, "--method", "lora", "train.max_steps=2")):  # resume the run
        result = runner.invoke(app, command)
        assert one_line_error(result, 2) == line, command
    assert snapshot(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["before"]


def test_an_extension_run_refuses_another_hub_revision(hf_llamas: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A base given as a hub id, read from the local hub cache: a newer revision there (the old snapshot gone) is
    refused naming both commits."""
    from hf_helpers import make_hf_llama

    cache = tmp_path / "hub"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    repo = cache / "models--tiny--llama"
    first, second = "a" * 40, "b" * 40
    make_hf_llama(repo / "snapshots" / first, n_kv_heads=2, max_position_embeddings=32, shard="10GB")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(first)
    run = tmp_path / "run"
    assert runner.invoke(app, [*_extend("tiny/llama", run, hf_llamas / "corpus.txt"), "--method", "lora"]
                         ).exit_code == 0
    shutil.rmtree(repo / "snapshots" / first)
    make_hf_llama(repo / "snapshots" / second, n_kv_heads=2, max_position_embeddings=32, shard="10GB", seed=3)
    (repo / "refs" / "main").write_text(second)
    line = one_line_error(runner.invoke(app, ["export", "--checkpoint", str(run), "--out", str(tmp_path / "x")]), 2)
    assert line.startswith(f"error: {repo / 'snapshots' / second}: not the Hugging Face base this checkpoint was "
                           f"trained on (trained on revision {first[:12]}, weights ")
    assert f"; found revision {second[:12]}, weights " in line and line.count(" (1 file)") == 2
    assert not (tmp_path / "x").exists()


def test_the_base_check_reads_a_few_kilobytes_per_weight_file(hf_llamas: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """What the check costs, counted rather than timed: the header and 16 x 4 KiB of each file, whatever its size
    (docs/context-extension.md gives the time it took on a 7B-sized base)."""
    from tapecli.model.hf import files as hf_files

    single = hf_llamas / "single" / "model.safetensors"
    header = int.from_bytes(single.read_bytes()[:8], "little")
    read = []
    real_open = Path.open

    def counting_open(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        if "b" in mode:
            real_read = handle.read
            handle.read = lambda n=-1: read.append(len(chunk := real_read(n))) or chunk
        return handle

    monkeypatch.setattr(Path, "open", counting_open)
    print_ = hf_files.fingerprint(hf_llamas / "single")
    assert 8 + header < sum(read) <= 8 + header + hf_files.SAMPLES * hf_files.SAMPLE_BYTES < single.stat().st_size
    assert print_["files"]["model.safetensors"]["bytes"] == single.stat().st_size and print_["revision"] is None


def test_tape_run_where_a_hf_directory_belongs(base_run: Path, hf_llamas: Path,
                                                               tmp_path: Path) -> None:
    corpus, out = hf_llamas / "corpus.txt", tmp_path / "out"
    one_line_error(runner.invoke(app, _extend(base_run, out, corpus)), 2,
                   f"{base_run} is a tape run directory, not a Hugging Face model directory")
    one_line_error(runner.invoke(app, _extend(base_run / STEP2, out, corpus)), 2,
                   f"{base_run / STEP2} is a tape checkpoint, not a Hugging Face model directory")
    assert not out.exists()


def test_config_without_architectures_is_read_as_its_model_type_and_says_so(hf_llamas: Path, tmp_path: Path) -> None:
    directory = _damaged(hf_llamas, tmp_path, "sharded", lambda d: _edit_json(d / "config.json",
                                                                              _without("architectures")))
    result = runner.invoke(app, ["eval", "perplexity", "--model", str(directory), "--data",
                                 str(hf_llamas / "corpus.txt"), "--seq-len", "16", "--max-windows", "1",
                                 "--out", str(tmp_path / "ppl")])
    assert result.exit_code == 0, result.output
    assert f"note: {directory}/config.json has no architectures; read as LlamaForCausalLM, as transformers does " \
           "for model_type 'llama'" in result.stderr


def test_longlora_without_interpolation_is_refused(hf_llamas: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(app, [*_extend(hf_llamas / "sharded", out, hf_llamas / "corpus.txt"), "--method",
                                 "longlora", "--scaling", "none"])
    one_line_error(result, 2, "extend.scaling: none with method longlora is not LongLoRA",
                   "pass --scaling pi", "--method lora --scaling none")
    assert not out.exists()
