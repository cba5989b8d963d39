"""Faults in the commands added since the last campaign: `tape pe check/new`, plugins named as FILE.py:CLASS,
`tape analyze position-loss/attention`, `tape eval babilong/kv-retrieval/latent-list/scrolls`, the attention keys
of a recipe (model.window, model.temperature, model.schedule), data.train_size and train.epochs, `tape bench
--window`, `tape sweep --pe NAME:KEY=VALUE`.

Each case: exit code != 0, exactly one `error:` line naming the option, key or file, no traceback, and nothing
written (the --out folder does not appear; a file in the way of --out is kept: test_faults_commands.py's
FILE_OUTS holds these commands too). Read-only outputs run on a real read-only tmpfs (tests/cli/test_faults.py's
`with_tmpfs`). The model is the shared tiny run (`trained()`: 2 layers, dim 32, byte tokenizer, 32 tokens); the
synthetic-data recipe cases use the selective-copy smoke recipe (refused before any training).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from plugin_helpers import write_plugin
from scrolls_helpers import qa_rows, write_scrolls_zip
from test_faults import with_tmpfs
from train_helpers import REPO, subprocess_env
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, trained, shared_corpus: Path) -> dict[str, Path]:
    """The shared tiny run and its recipe, the shared corpus, plugin files (good, missing, syntax error, no PE
    class), a malformed jsonl, an empty text file, SCROLLS files whose `input` is a number or whose validation
    member is empty."""
    root = tmp_path_factory.mktemp("new_inputs")
    pe = root / "pe"
    write_plugin(pe)
    (pe / "syntax.py").write_text("def broken(:\n")
    (pe / "noclass.py").write_text("X = 1\n")
    (root / "bad.jsonl").write_text("not json\n")
    (root / "empty.txt").write_text("")
    numbers = {"train": qa_rows("train"), "validation": [{**row, "input": 5} for row in qa_rows("validation")]}
    write_scrolls_zip(root / "scrolls_numbers", rows=numbers)
    write_scrolls_zip(root / "scrolls_empty", rows={"train": qa_rows("train"), "validation": []})
    return {"run": trained(), "recipe": Path(trained.recipe()), "corpus": shared_corpus, "pe": pe, "root": root}


def fill(args: list[str], inputs: dict[str, Path], out: Path) -> list[str]:
    return [a.format(out=out, **{name: str(path) for name, path in inputs.items()}) for a in args]


PE = "{pe}"
LOSS = ["analyze", "position-loss", "-m", "{run}", "--data", "{corpus}", "--samples", "1", "--device", "cpu"]
ATTENTION = ["analyze", "attention", "-m", "{run}", "--data", "{corpus}", "--samples", "1", "--device", "cpu"]
BABILONG = ["eval", "babilong", "-m", "{run}", "--lengths", "0", "--samples", "1", "--device", "cpu"]
KV = ["eval", "kv-retrieval", "-m", "{run}", "--keys", "2", "--samples", "1", "--device", "cpu"]
LATENT = ["eval", "latent-list", "-m", "{run}", "--lengths", "1k", "--samples", "1", "--device", "cpu"]
SCROLLS = ["eval", "scrolls", "--model", "{run}", "--task", "qasper", "--seq-len", "48"]

COMMANDS = [
    # tape pe check / new
    (["pe", "check", "bogus", "--no-speed"], "model.pe: unknown positional encoding 'bogus'"),
    (["pe", "check", f"{PE}/missing.py", "--no-speed"], f"{PE}/missing.py is not a file"),
    (["pe", "check", f"{PE}/syntax.py", "--no-speed"], "importing {pe}/syntax.py failed: SyntaxError"),
    (["pe", "check", f"{PE}/noclass.py", "--no-speed"], "defines 0 PositionalEncoding classes"),
    (["pe", "check", f"{PE}/learned_alibi.py:Nope", "--no-speed"], "defines no Nope"),
    (["pe", "check", f"{PE}/learned_alibi.py:SlopeLayer", "--no-speed"], "not a subclass of tapecli.pe.Positional"),
    (["pe", "check", f"{PE}/learned_alibi.py", "--pe-arg", "init=x", "--no-speed"], "model.pe_args.init: expected a"),
    (["pe", "check", f"{PE}/learned_alibi.py", "--pe-arg", "bogus=1", "--no-speed"], "model.pe_args.bogus: not an"),
    (["pe", "check", "rope", "--pe-arg", "noequals", "--no-speed"], "--pe-arg 'noequals' must look like key=value"),
    (["pe", "check", "nosuchmodule_xyz:Cls", "--no-speed"], "No module named 'nosuchmodule_xyz'"),
    (["pe", "check", "rope", "--speed-len", "0"], "--speed-len: 0 must be at least 1"),
    (["pe", "new", "1bad", "--out", "{out}"], "NAME '1bad': use letters, digits and _"),
    (["pe", "new", "my-pe", "--out", "{out}"], "NAME 'my-pe'"),
    (["pe", "new", "ok", "--kind", "bogus", "--out", "{out}"], "--kind: expected one of bias, rotary"),
    # tape analyze
    ([*LOSS, "--seq-len", "0", "--out", "{out}"], "Invalid value for '--seq-len': Input should be greater than"),
    ([*LOSS, "--seq-len", "1", "--out", "{out}"], "--seq-len must be at least 2, got 1"),
    ([*LOSS, "--seq-len", "100000000000", "--out", "{out}"], "too few for one sequence of --seq-len 100000000000"),
    ([*LOSS, "--seq-len", "48", "--samples", "0", "--out", "{out}"], "Invalid value for '--samples'"),
    ([*LOSS, "--seq-len", "48", "--bins-per-octave", "0", "--out", "{out}"], "Invalid value for '--bins-per-octave'"),
    ([*LOSS, "--seq-len", "48", "--dtype", "fp64", "--out", "{out}"], "--dtype: unknown dtype 'fp64'"),
    ([*LOSS, "--seq-len", "48", "--pe-arg", "bogus=1", "--out", "{out}"], "bogus: not an argument of pe 'rope'"),
    (["analyze", "position-loss", "-m", "{root}/nope", "--data", "{corpus}", "--seq-len", "48", "--out", "{out}"],
     "--model: {root}/nope does not exist; pass --model PATH"),
    (["analyze", "position-loss", "-m", "{corpus}", "--data", "{corpus}", "--seq-len", "48", "--out", "{out}"],
     "holds no tape checkpoint"),
    (["analyze", "position-loss", "-m", "{run}", "--data", "{root}/nope.txt", "--seq-len", "48", "--out", "{out}"],
     "--data: {root}/nope.txt does not exist; pass --data PATH"),
    (["analyze", "position-loss", "-m", "{run}", "--data", "{root}/empty.txt", "--seq-len", "48", "--out", "{out}"],
     "too few for one sequence"),
    (["analyze", "position-loss", "-m", "{run}", "--data", "selective-copy", "--seq-len", "48", "--out", "{out}"],
     "is not from a run trained on a synthetic task"),
    ([*ATTENTION, "--seq-len", "0", "--out", "{out}"], "Invalid value for '--seq-len'"),
    ([*ATTENTION, "--seq-len", "1", "--out", "{out}"], "--seq-len must be at least 2, got 1"),
    ([*ATTENTION, "--seq-len", "100000000000", "--out", "{out}"], "too few for one sequence"),
    ([*ATTENTION, "--seq-len", "48", "--window", "48", "--out", "{out}"], "--window must be between 1 and"),
    ([*ATTENTION, "--seq-len", "48", "--sink", "-1", "--out", "{out}"], "Invalid value for '--sink'"),
    ([*ATTENTION, "--seq-len", "48", "--maps-max", "-1", "--out", "{out}"], "Invalid value for '--maps-max'"),
    (["analyze", "attention", "-m", "{run}", "--data", "{root}/bad.jsonl", "--seq-len", "48", "--out", "{out}"],
     "{root}/bad.jsonl could not be read: JSON parse error"),
    # the new evaluations
    ([*BABILONG, "--tasks", "qa9", "--out", "{out}"], "--tasks: unknown task qa9"),
    (["eval", "babilong", "-m", "{run}", "--lengths", "-1", "--out", "{out}"], "--lengths: -1 must be at least 0"),
    (["eval", "babilong", "-m", "{run}", "--lengths", "10000000000k", "--out", "{out}"],
     "--lengths: 10240000000000 must be at most 16,777,216"),
    ([*BABILONG, "--depths", "nan", "--out", "{out}"], "--depths: nan is not a finite number"),
    ([*BABILONG, "--depth-window", "0", "--out", "{out}"], "--depth-window must be in (0, 1]"),
    ([*BABILONG, "--prompt", "bogus", "--out", "{out}"], "--prompt: expected one of full, no-examples, bare"),
    ([*BABILONG, "--haystack", "{root}/nope.txt", "--out", "{out}"], "--haystack {root}/nope.txt: no such file"),
    ([*BABILONG, "--haystack", "{root}/empty.txt", "--out", "{out}"], "the haystack text is empty"),
    ([*BABILONG, "--data", "{corpus}", "--out", "{out}"], "--data {corpus}: no file for qa1 at 0k"),
    ([*BABILONG, "--threshold", "nan", "--out", "{out}"], "expected a finite number, got nan"),
    (["eval", "babilong", "-m", "{root}/nope", "--out", "{out}"], "--model: {root}/nope does not exist"),
    ([*KV[:4], "--keys", "0", "--out", "{out}"], "--keys: 0 must be at least 1"),
    ([*KV, "--positions", "0", "--out", "{out}"], "Invalid value for '--positions'"),
    ([*KV, "--positions", "50", "--out", "{out}"], "--positions: between 1 and the number of pairs (2), got 50"),
    ([*KV, "--threshold", "-1", "--out", "{out}"], "Invalid value for '--threshold'"),
    ([*LATENT[:4], "--lengths", "0", "--out", "{out}"], "--lengths: positive token counts, got [0]"),
    ([*LATENT, "--relevant-ops", "-1", "--out", "{out}"], "--relevant-ops: counts of 0 or more, got [-1]"),
    ([*LATENT, "--base-lengths", "2k", "--out", "{out}"], "--base-lengths: 2048 is not among the lengths"),
    ([*LATENT, "--threshold", "101", "--out", "{out}"], "Invalid value for '--threshold'"),
    # issue 34: a SCROLLS `input` that is a number (was a traceback), an empty member (was "generator raised ...")
    ([*SCROLLS, "--data", "{root}/scrolls_numbers", "--out", "{out}"],
     "validation.jsonl in {root}/scrolls_numbers has field 'input' of type int64, expected text"),
    ([*SCROLLS, "--data", "{root}/scrolls_empty", "--out", "{out}"],
     "validation.jsonl in {root}/scrolls_empty is empty (no rows)"),
    # tape bench, tape sweep
    (["bench", "--window", "0", "--out", "{out}"], "Invalid value for '--window'"),
    (["bench", "--window", "-1", "--out", "{out}"], "Invalid value for '--window'"),
    (["bench", "--pe", "rope:hope=maybe", "--out", "{out}"], "model.pe_args.hope: expected true or false"),
    (["bench", "--pe", "rope:hope", "--out", "{out}"], "--pe 'rope:hope': each pe_args entry must look like key=value"),
    (["sweep", "--recipe", "{recipe}", "--pe", "rope:hope=maybe", "--out", "{out}"],
     "--pe 'rope:hope=maybe': model.pe_args.hope: expected true or false, got 'maybe'"),
    (["sweep", "--recipe", "{recipe}", "--pe", f"{PE}/syntax.py:X", "--out", "{out}"], "SyntaxError"),
    (["sweep", "--recipe", "{recipe}", "--pe", "rope", "--grid", "model.window=0,4", "--out", "{out}"],
     "model.window: expected a positive number of keys"),
]


@pytest.mark.parametrize(("args", "fragment"), COMMANDS, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in
                                                              enumerate(COMMANDS)])
def test_bad_options_and_inputs_are_one_line(inputs: dict[str, Path], tmp_path: Path, args: list[str],
                                             fragment: str) -> None:
    out = tmp_path / "out"
    line = one_line_error(runner.invoke(app, fill(args, inputs, out)), 2)
    assert fill([fragment], inputs, out)[0] in line, line
    assert not out.exists()


PRETRAIN = ["pretrain", "--recipe", "{recipe}", "--out", "{out}"]
COPY = ["pretrain", "--recipe", "selective-copy-smoke", "--out", "{out}", "train.max_steps=null", "train.epochs=1"]
RECIPES = [
    ("model.pe={pe}/missing.py:X", "model.pe: {pe}/missing.py (from {pe}/missing.py:X) is not a file"),
    ("model.pe={pe}/syntax.py:X", "model.pe: importing {pe}/syntax.py failed: SyntaxError"),
    ("model.pe={pe}/noclass.py", "model.pe: unknown positional encoding '{pe}/noclass.py'"),
    ("model.pe={pe}/learned_alibi.py:Nope", "model.pe: {pe}/learned_alibi.py defines no Nope"),
    ("model.window=0", "model.window: expected a positive number of keys or null (global), got 0"),
    ("model.window=-3", "model.window: expected a positive number of keys or null (global), got -3"),
    ("model.window=nan", "model.window: expected an integer or null, got nan"),
    ("model.window=1.5", "model.window: expected an integer or null, got 1.5"),
    ("model.window=true", "model.window: expected an integer or null, got True"),
    ("model.window=100000000000000000000000", "model.window: 100000000000000000000000 is out of range"),
    ("model.temperature=0", "model.temperature: the attention temperature must be a number > 0"),
    ("model.temperature=-1", "model.temperature: the attention temperature must be a number > 0"),
    ("model.temperature=nan", "model.temperature: expected a number, got nan"),
    ("model.temperature=inf", "model.temperature: expected a number, got inf"),
    ("model.temperature=[1]", "model.temperature: expected a number, got [1]"),
    ("model.schedule=abc", "model.schedule: expected a mapping with string keys"),
    ("model.schedule.pattern=rope+bogus", "layer name 'bogus' is neither one of model.schedule.kinds"),
    ("model.schedule.pattern=[]", "model.schedule.pattern: expected a non-empty list"),
    ("model.schedule.layers=[rope]", "model.schedule.layers: names 1 layers, the model has model.n_layers=2"),
    ("model.schedule.every.n=0", "model.schedule.every.n: expected a positive integer, got 0"),
    ("model.schedule.every.n=nan", "model.schedule.every.n: expected a positive integer, got nan"),
    ("model.schedule.bogus=1", "model.schedule.bogus: not a key of a schedule"),
    ("model.schedule.kinds.local.window=0", "model.schedule.kinds.local.window: expected a positive number"),
    ("model.schedule.kinds.local.temperature=nan", "model.schedule.kinds.local.temperature: the attention"),
    ("model.schedule.kinds.local.bogus=1", "model.schedule.kinds.local.bogus: not a layer key"),
    ("model.schedule.kinds.local.pe=bogus", "model.schedule.kinds.local.pe: unknown positional encoding 'bogus'"),
    ("model.schedule.kinds=5", "model.schedule.kinds: expected a mapping of names, got 5"),
    ("train.seed=100000000000000000000", "train.seed: 100000000000000000000 is out of range"),
    ("train.epochs=2", "train.epochs: counts passes over a fixed training set of data.train_size sequences"),
    ("train.max_steps=null", "train.max_steps: null needs train.epochs"),
    ("data.train_size=8", "data.train_size is not a key of kind text"),
]
SCHEDULE_KINDS = ("model.schedule.pattern=[local,global]",)  # the kinds.local cases name a pattern using them
EVERY = ("model.schedule.every.kind=nope", "model.schedule.every.others=rope")
SYNTHETIC = [
    ("data.train_size=0", "data.train_size: must be a positive integer, got 0"),
    ("data.train_size=-5", "data.train_size: must be a positive integer, got -5"),
    ("data.train_size=nan", "data.train_size: expected an integer or null, got nan"),
    ("data.train_size=abc", "data.train_size: expected an integer or null, got 'abc'"),
    ("data.train_size=3000000000", "data.train_size: at most 2,147,483,648 sequences"),  # was a traceback
    ("data.train_size=100000000000000000000", "data.train_size: 100000000000000000000 is out of range"),
    ("train.epochs=0", "train.epochs: must be a positive integer, got 0"),
    ("train.epochs=1.5", "train.epochs: expected an integer or null, got 1.5"),
    ("train.epochs=inf", "train.epochs: expected an integer or null, got inf"),
    ("train.max_steps=7", "train.max_steps: 7 disagrees with train.epochs=1"),
]


@pytest.mark.parametrize(("override", "fragment"), [*RECIPES, *[(f"data.train_size=8 {o}", f) if "epochs" in o or
                                                                 "max_steps" in o else (o, f) for o, f in SYNTHETIC]],
                         ids=[o for o, _ in RECIPES] + [f"copy {o}" for o, _ in SYNTHETIC])
def test_bad_recipe_values_are_one_line(inputs: dict[str, Path], tmp_path: Path, override: str,
                                        fragment: str) -> None:
    out = tmp_path / "out"
    synthetic = any(override.endswith(o) for o, _ in SYNTHETIC)
    overrides = override.split()
    if "kinds.local" in override:
        overrides += SCHEDULE_KINDS
    if "every.n" in override:
        overrides += EVERY
    args = [*(COPY if synthetic else PRETRAIN), *overrides]
    line = one_line_error(runner.invoke(app, fill(args, inputs, out)), 2)
    assert fill([fragment], inputs, out)[0] in line, line
    assert not out.exists()


def test_pe_new_keeps_an_existing_file(inputs: dict[str, Path], tmp_path: Path) -> None:
    existing = tmp_path / "mine.py"
    existing.write_text("keep me\n")
    one_line_error(runner.invoke(app, ["pe", "new", "mine", "--out", str(existing)]), 2, f"--out {existing} already")
    # a file in the way of the folder: the line names --out, not the temporary file it would have written first
    one_line_error(runner.invoke(app, ["pe", "new", "mine", "--out", str(existing / "mine.py")]), 2,
                   f"--out {existing}/mine.py: {existing} is a file, not a directory")
    assert existing.read_text() == "keep me\n" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.py"]


def test_read_only_outputs(inputs: dict[str, Path], tmp_path: Path) -> None:
    """A real read-only file system under --out: one line each, before any work."""
    mount = tmp_path / "ro"
    names = {name: str(path) for name, path in inputs.items()}
    commands = [
        ["analyze", "position-loss", "-m", names["run"], "--data", names["corpus"], "--seq-len", "48", "--samples",
         "1", "--device", "cpu", "--out", f"{mount}/loss"],
        ["eval", "kv-retrieval", "-m", names["run"], "--keys", "2", "--samples", "1", "--device", "cpu", "--out",
         f"{mount}/kv"],
        ["pe", "new", "mine", "--out", f"{mount}/mine.py"],
    ]
    script = "; ".join(f"{sys.executable} -m tapecli.cli {' '.join(c)}; echo rc=$?" for c in commands)
    proc = with_tmpfs(mount, "ro", script)
    codes = [line for line in proc.stdout.splitlines() if line.startswith("rc=")]  # stdout: startup lines too
    assert codes == ["rc=2"] * 3 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") and str(mount) in line for line in lines), lines
    assert all("read-only file system" in line and line.startswith(f"error: --out {mount}/") for line in lines), lines


def test_a_malformed_jsonl_is_one_line_on_the_real_stderr(inputs: dict[str, Path]) -> None:
    """datasets' json reader logs the error before raising it: that logged copy was a second line (the in-process
    runner cannot see it: datasets' log handler holds the stderr of the process)."""
    proc = subprocess.run([sys.executable, "-m", "tapecli.cli", "analyze", "position-loss", "-m", str(inputs["run"]),
                           "--data", str(inputs["root"] / "bad.jsonl"), "--seq-len", "48", "--device", "cpu", "--out",
                           str(inputs["root"] / "never")], cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {inputs['root'] / 'bad.jsonl'} could not be read: JSON parse error: Invalid value. in row 0"]
    assert not (inputs["root"] / "never").exists()


def test_an_eta_beyond_timedelta_is_no_crash(capsys: pytest.CaptureFixture) -> None:
    """train.epochs=1e18 (or train.max_steps=1e18) over a small set: the first log line crashed computing the ETA."""
    from tapecli.train.progress import TrainProgress

    progress = TrainProgress(0, 10**18, 1, enabled=True)
    progress.step(1, 2.5, 1e-3, 100.0)
    assert "step 1/1000000000000000000 | loss 2.5000" in capsys.readouterr().out
