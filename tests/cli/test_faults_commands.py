"""Faults in the newest commands (extend-context, export, every evaluation, demo, finetune, loggers).

- Stopped in the middle: each long command is interrupted at a fixed point (right after its first finished unit:
  a samples row, a cached lm-eval answer, a checkpoint, a weight shard) by SIGKILL, SIGTERM or Ctrl-C (SIGINT), in a
  real process (tests/interrupt_helpers.py). A stop request ends it with one `stopped:` line and 128 + the signal;
  the same command run again finishes with files byte-identical to an uninterrupted run (weights, samples,
  predictions; results.json without its timings).
- Nonsense option values and outputs that are files: one `error:` line, exit 2, nothing written.
(Corrupt or mismatched Hugging Face directories: tests/cli/test_faults.py; SIGTERM to a sharded run:
tests/train/test_fsdp.py.)
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import interrupt_helpers
import pytest
from cli_helpers import one_line_error
from shared_runs import ADDITION_RUN
from train_helpers import REPO, subprocess_env, write_recipe
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()
# Keys that differ between any two runs, interrupted or not (seconds: a sweep cell's training time).
TIMINGS = {"seconds_this_session", "elapsed", "train_seconds", "seconds", "tokens_per_s"}
# In process on one thread, as the interrupted subprocess (OMP_NUM_THREADS=1): the same floats, bit for bit.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, trained) -> dict[str, Path]:
    """A corpus, a tiny byte-level run, an addition run, a selective-copy run (TAPE), SCROLLS files, an lm-eval
    task. The runs are shared (`trained`): read-only."""
    from scrolls_helpers import write_scrolls_zip

    root = tmp_path_factory.mktemp("inputs")
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"doc{i}.txt").write_text(" ".join(f"word{(i * 7 + j) % 31} at {j};" for j in range(120)))
    recipe = write_recipe(root / "r.yaml", corpus, train={"max_steps": 2, "save_every": 2, "eval_every": 0})
    found = {"corpus": corpus, "recipe": recipe, "run": trained()}
    found["addition"] = trained(*ADDITION_RUN)
    found["copy"] = trained("selective-copy-smoke", "train.max_steps=2")
    found["scrolls"] = write_scrolls_zip(root / "scrolls").parent
    tasks = root / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"text": f"word{i} at {i}; " * (3 + i)}) + "\n"
                                              for i in range(4)))
    (tasks / "tiny_roll.yaml").write_text(
        f"task: tiny_roll\ndataset_path: json\ndataset_kwargs: {{data_files: {{test: {tasks / 'docs.jsonl'}}}}}\n"
        "test_split: test\nmetadata: {version: 1.0}\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list: [{metric: word_perplexity}, {metric: bits_per_byte}]\n")
    found["tasks"] = tasks
    return found


def interrupted(args: list[str], sig: int, hook: str, after: int = 1, setup: str = "") -> subprocess.CompletedProcess:
    """Run `tape ARGS` in a new process that sends itself `sig` right after the `after`-th call of `hook`."""
    proc = subprocess.run([sys.executable, *interrupt_helpers.argv(args, hook, sig, after, setup)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
    assert proc.returncode == expected, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    if sig != signal.SIGKILL:
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("stopped: "), proc.stderr[-3000:]
    return proc


def stable(value):
    """A results file's content without its timings."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def files(folder: Path, suffixes: tuple[str, ...] = (".json", ".jsonl", ".safetensors")) -> dict[str, object]:
    """Every file under `folder` with those suffixes: JSON without timings, the rest as bytes (PNG plots and logs of
    timings are left out)."""
    found: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix not in suffixes or "eval-harness" in path.parts:
            continue
        name = str(path.relative_to(folder))
        if path.name == "metrics.jsonl":
            found[name] = [stable(json.loads(line)) for line in path.read_text().splitlines()]
        elif path.suffix == ".json" and path.name != "run.json":  # run.json: the command line and start time
            found[name] = stable(json.loads(path.read_text()))
        elif path.suffix != ".json":
            found[name] = path.read_bytes()
    return found


def check_resumes_exactly(args: list[str], out: Path, sig: int, hook: str, after: int = 1, setup: str = "",
                          unfinished: str = "results.json") -> None:
    """Uninterrupted run into `out`; then, from scratch, the interrupted run and the same command again: the same
    files. `unfinished` must be missing after the interruption (the stop came before the end)."""
    whole = runner.invoke(app, args)
    assert whole.exit_code == 0, whole.output
    expected = files(out)
    shutil.rmtree(out)
    interrupted(args, sig, hook, after, setup)
    assert out.exists() and not list(out.rglob(unfinished)), "the interruption came too late to test anything"
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert files(out) == expected


SAMPLES_ROW = "tapecli.files:JsonlLog.append"  # the resumable log every evaluation appends its finished units to
CHECKPOINT = "tapecli.train.engine:save_checkpoint"


# ---------------------------------------------------------------------------------------------------------------
# Every evaluation


# (command, the signal, its arguments after --out OUT); every evaluation logs its finished units to samples.jsonl
EVALS = [
    ("addition", signal.SIGKILL, ["-c", "{addition}", "--max-len", "3", "--samples", "4"]),
    ("perplexity", signal.SIGTERM, ["-m", "{run}", "--data", "{corpus}", "--seq-len", "16,32", "--stride", "64",
                                    "--max-tokens", "1200"]),
    ("passkey", signal.SIGINT, ["-m", "{run}", "--budgets", "40,80", "--trials", "3"]),
    ("synthetic", signal.SIGTERM, ["-m", "{copy}", "--samples", "8", "--batch-size", "4"]),
    ("scrolls", signal.SIGKILL, ["--model", "{run}", "--task", "qasper", "--data", "{scrolls}", "--seq-len", "48",
                                 "--batch-size", "1"]),
]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "sig", "args"), EVALS, ids=[f"{c}-{signal.Signals(s).name}" for c, s, _ in EVALS])
def test_evaluation_resumes_exactly_after_a_stop(inputs: dict[str, Path], tmp_path: Path, command: str, sig: int,
                                                 args: list[str]) -> None:
    out = tmp_path / "out"
    names = {name: str(path) for name, path in inputs.items()}
    check_resumes_exactly(["eval", command, *[a.format(**names) for a in args], "--out", str(out), "--device", "cpu"],
                          out, sig, SAMPLES_ROW)


@pytest.mark.slow
def test_eval_harness_after_ctrl_c(inputs: dict[str, Path], tmp_path: Path) -> None:
    """lm-eval's request cache keeps every answer as it is computed; samples and scores come out the same."""
    out = tmp_path / "out"
    args = ["eval", "harness", "-m", str(inputs["run"]), "--tasks", "tiny_roll", "--include-path",
            str(inputs["tasks"]), "--out", str(out), "--log-samples", "--bootstrap-iters", "0", "--device", "cpu"]
    whole = runner.invoke(app, args)
    assert whole.exit_code == 0, whole.output
    expected = json.loads((out / "results.json").read_text())
    samples = (out / "samples_tiny_roll.jsonl").read_bytes()
    shutil.rmtree(out)
    interrupted(args, signal.SIGINT, "lm_eval.api.model:CacheHook.add_partial", after=2)
    assert not (out / "results.json").exists()
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    got = json.loads((out / "results.json").read_text())
    for key in ("results", "n-samples", "configs", "versions", "config"):
        assert got[key] == expected[key], key
    assert (out / "samples_tiny_roll.jsonl").read_bytes() == samples


# ---------------------------------------------------------------------------------------------------------------
# Training commands, export


@pytest.mark.slow
def test_finetune_after_ctrl_c(inputs: dict[str, Path], tmp_path: Path) -> None:
    """The first Ctrl-C saves a checkpoint after the step and stops; the same command continues it exactly."""
    out = tmp_path / "ft"
    args = ["finetune", "--checkpoint", str(inputs["run"]), "--recipe", str(inputs["recipe"]), "--out", str(out),
            "train.max_steps=4", "train.save_every=1", "train.eval_every=2", "train.keep_last=0"]
    check_resumes_exactly(args, out, signal.SIGINT, CHECKPOINT, unfinished="step-00000004")


@pytest.mark.slow
def test_pretrain_with_tensorboard_after_sigkill(inputs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def curves(run: Path) -> dict[str, list[tuple[int, float]]]:
        events = EventAccumulator(str(run / "tensorboard"))
        events.Reload()
        # by step: two sessions within one second may come back file by file in either order
        return {tag: sorted((e.step, e.value) for e in events.Scalars(tag)) for tag in events.Tags()["scalars"]
                if tag.rpartition("/")[2] not in TIMINGS}

    out = tmp_path / "run"
    args = ["pretrain", "--recipe", str(inputs["recipe"]), "--out", str(out), "train.max_steps=4",
            "train.save_every=2", "train.eval_every=2", "train.loggers=[jsonl,tensorboard]"]
    whole = runner.invoke(app, args)
    assert whole.exit_code == 0, whole.output
    expected, expected_curves = files(out), curves(out)
    shutil.rmtree(out)
    interrupted(args, signal.SIGKILL, CHECKPOINT)
    assert runner.invoke(app, args).exit_code == 0
    assert files(out) == expected
    assert curves(out) == expected_curves  # each step once: what followed the checkpoint was purged


SHRUNK_DEMO = ("model.n_layers=1", "model.dim=16", "model.n_heads=2", "model.max_seq_len=24", "data.copy_tokens=4",
               "data.blanks=4", "data.seq_len=13", "eval.dense_blanks=3", "eval.sparse_blanks=5", "train.batch_size=4",
               "train.micro_batch_size=4", "train.max_steps=4", "train.warmup=0", "train.save_every=2",
               "train.eval_every=0", "train.log_every=1")


@pytest.mark.slow
def test_demo_after_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tape demo` (shrunk): stopped in its second PE's training, the same command finishes every PE exactly."""
    import dataclasses

    import tapecli.experiments.demo_synthetic as demo

    monkeypatch.setitem(demo.BUDGETS, "selective-copy", dataclasses.replace(
        demo.BUDGETS["selective-copy"], samples=8, overrides=SHRUNK_DEMO))
    setup = ("import dataclasses, tapecli.experiments.demo_synthetic as d\n"
             f"d.BUDGETS['selective-copy'] = dataclasses.replace(d.BUDGETS['selective-copy'], samples=8, "
             f"overrides={SHRUNK_DEMO!r})\n")
    out = tmp_path / "demo"
    check_resumes_exactly(["demo", "--out", str(out)], out, signal.SIGTERM, CHECKPOINT, after=3, setup=setup,
                          unfinished="alibi-seed0")  # the third cell, not started


@pytest.mark.slow
def test_extend_context_after_sigterm(tmp_path: Path, tiny_hf_llama: Path) -> None:
    from hf_helpers import sample_text

    (tmp_path / "corpus.txt").write_text(sample_text(200, seed=1))
    out = tmp_path / "ext"
    args = ["extend-context", "--base", str(tiny_hf_llama), "--method", "tape", "--recipe",
            "context-extension-smoke", "--out", str(out), "model.max_seq_len=64", f"data.source={tmp_path}/corpus.txt",
            "train.max_steps=4", "train.save_every=1", "train.eval_every=0", "train.keep_last=0"]
    check_resumes_exactly(args, out, signal.SIGTERM, CHECKPOINT, unfinished="step-00000004")


@pytest.mark.slow
def test_export_after_sigkill(inputs: dict[str, Path], tmp_path: Path) -> None:
    """Killed between two weight shards: nothing at --out; the same command writes what an uninterrupted one does."""
    out = tmp_path / "hf"
    setup = "import tapecli.model.hf.export as e\ne.SHARD_BYTES = 20_000\n"
    args = ["export", "-c", str(inputs["run"]), "--out", str(out)]
    import tapecli.model.hf.export as export

    original = export.SHARD_BYTES
    export.SHARD_BYTES = 20_000
    try:
        assert runner.invoke(app, args).exit_code == 0
        expected = files(out)
        assert sum(name.endswith(".safetensors") for name in expected) > 1
        shutil.rmtree(out)
        interrupted(args, signal.SIGKILL, "safetensors.torch:save_file", setup=setup)
        assert not out.exists()  # the partial export lies in a temporary directory
        assert runner.invoke(app, args).exit_code == 0
        assert files(out) == expected and not list(tmp_path.glob(".tmp-*"))
    finally:
        export.SHARD_BYTES = original


# ---------------------------------------------------------------------------------------------------------------
# Nonsense option values, outputs that are files


SCROLLS = ["eval", "scrolls", "--model", "{run}", "--task", "qasper", "--data", "{scrolls}"]
HARNESS = ["eval", "harness", "-m", "{run}", "--tasks", "tiny_roll", "--include-path", "{tasks}"]
NONSENSE = [
    (["eval", "synthetic", "-m", "{copy}", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    (["eval", "synthetic", "-m", "{copy}", "--splits", "bogus"], "--splits: unknown split bogus"),
    ([*SCROLLS, "--batch-size", "0"], "Invalid value for '--batch-size'"),
    ([*SCROLLS, "--limit", "-1"], "Invalid value for '--limit'"),
    ([*SCROLLS, "--seq-len", "0"], "Invalid value for '--seq-len'"),
    ([*HARNESS, "--max-length", "0"], "Invalid value for '--max-length'"),
    ([*HARNESS, "--limit", "0"], "--limit must be positive"),
    ([*HARNESS, "--num-fewshot", "-1"], "Invalid value for '--num-fewshot'"),
    ([*HARNESS, "--bootstrap-iters", "-1"], "Invalid value for '--bootstrap-iters'"),
    ([*HARNESS, "--batch-size", "x"], "Invalid value for '--batch-size'"),
    (["eval", "passkey", "-m", "{run}", "--budgets", "0", "--out", "{out}"], "--budgets: 0 must be between 1 and"),
    (["eval", "perplexity", "-m", "{run}", "--data", "{corpus}", "--seq-len", "0"], "--seq-len"),
    (["export", "-c", "{run}", "--out", "{out}", "--dtype", "fp64"], "--dtype: expected float32 or bfloat16"),
    (["export", "-c", "{copy}", "--out", "{out}"], "pe 'tape' has no Hugging Face Llama equivalent"),
    (["demo", "--task", "bogus"], "--task: unknown demo task 'bogus'"),
    (["demo", "--pe", "bogus"], "--pe: unknown positional encoding 'bogus'"),
    (["extend-context", "--base", "{run}", "--recipe", "context-extension-smoke", "--out", "{out}",
      "data.source={corpus}"], "is a tape run directory, not a Hugging Face model directory"),
    (["extend-context", "--base", "{run}", "--method", "bogus", "--out", "{out}"], "extend.method: expected one of"),
    (["finetune", "--checkpoint", "{run}", "--recipe", "{recipe}", "--out", "{out}", "train.loggers=[bogus]"],
     "train.loggers: expected one of jsonl, tensorboard, wandb"),
    (["finetune", "--checkpoint", "{run}", "--recipe", "{recipe}", "--out", "{out}", "train.parallel=sharded"],
     "train.parallel: expected one of ddp, fsdp"),
]


@pytest.mark.parametrize(("args", "fragment"), NONSENSE, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in
                                                               enumerate(NONSENSE)])
def test_nonsense_option_values_are_one_line(inputs: dict[str, Path], tmp_path: Path, args: list[str],
                                             fragment: str) -> None:
    names = {name: str(path) for name, path in inputs.items()}
    result = runner.invoke(app, [a.format(out=tmp_path / "out", **names) for a in args])
    one_line_error(result, 2, fragment)
    assert not (tmp_path / "out").exists()


FILE_OUTS = [
    ["eval", "perplexity", "-m", "{run}", "--data", "{corpus}", "--seq-len", "16", "--out", "{out}"],
    ["eval", "passkey", "-m", "{run}", "--budgets", "40", "--out", "{out}"],
    ["eval", "synthetic", "-m", "{copy}", "--out", "{out}"],
    [*SCROLLS, "--out", "{out}"],
    [*HARNESS, "--out", "{out}"],
    ["eval", "addition", "-c", "{addition}", "--out", "{out}"],
    ["export", "-c", "{run}", "--out", "{out}"],
    ["finetune", "--checkpoint", "{run}", "--recipe", "{recipe}", "--out", "{out}"],
    ["demo", "--out", "{out}"],
    # the commands of the second campaign (tests/cli/test_faults_new.py)
    ["analyze", "position-loss", "-m", "{run}", "--data", "{corpus}", "--seq-len", "48", "--out", "{out}"],
    ["analyze", "attention", "-m", "{run}", "--data", "{corpus}", "--seq-len", "48", "--out", "{out}"],
    ["eval", "babilong", "-m", "{run}", "--lengths", "0", "--samples", "1", "--out", "{out}"],
    ["eval", "kv-retrieval", "-m", "{run}", "--keys", "2", "--samples", "1", "--out", "{out}"],
    ["eval", "latent-list", "-m", "{run}", "--lengths", "1k", "--samples", "1", "--out", "{out}"],
]


@pytest.mark.parametrize("inside", [False, True], ids=["out-is-a-file", "out-inside-a-file"])
@pytest.mark.parametrize("args", FILE_OUTS, ids=[" ".join(a[:2]) for a in FILE_OUTS])
def test_an_output_that_is_a_file_is_one_line_and_kept(inputs: dict[str, Path], tmp_path: Path, args: list[str],
                                                       inside: bool) -> None:
    blocking = tmp_path / "results.txt"
    blocking.write_text("keep me\n")
    out = blocking / "sub" if inside else blocking
    names = {name: str(path) for name, path in inputs.items()}
    line = one_line_error(runner.invoke(app, [a.format(out=out, **names) for a in args]), 2, str(blocking))
    assert "is a file" in line or "not empty" in line, line
    assert blocking.read_text() == "keep me\n" and sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]
