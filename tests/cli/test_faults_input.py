"""What a first run and the third fault campaign found (issues 37 and 38): every missing path named by a recipe key
or an option is one line naming that key and its fix; recipes that would hang or crash the parser, duplicate keys,
lm-eval task files with Python tags, a sweep into another command's output, non-finite or out-of-range option
values, a changed Hugging Face base, and a SIGTERM as a finished run ends.

Each case is one `error:` line (exit 2), no traceback, nothing written.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()
SOURCE_FIX = "(a text file, a folder of .txt/.jsonl/.json/.parquet files, a glob, or a Hugging Face dataset id)"
MODEL_FIX = "(a tape run directory, a checkpoint directory or a Hugging Face model directory or hub id)"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "words.txt"  # not corpus.txt: that is c4-smoke's placeholder
    path.write_text("a few words of text for a tiny corpus\n" * 20)
    return path


# ---------------------------------------------------------------------------------------------------------------
# Missing paths: the key (or option) that named them, and the fix (issue 37)


# (arguments, the whole error line); {t} is the test's folder, {c} its corpus
MISSING_PATHS = [
    (["pretrain", "--recipe", "c4-smoke", "--out", "{t}/run"],
     f"data.source: corpus.txt does not exist; pass data.source=PATH {SOURCE_FIX}"),
    (["pretrain", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={t}/nothing/*.txt"],
     f"data.source: no .txt, .jsonl, .json, .parquet files match {{t}}/nothing/*.txt; pass data.source=PATH "
     f"{SOURCE_FIX}"),
    (["pretrain", "--recipe", "c4", "--out", "{t}/run", "data.source={c}", "train.max_steps=1"],
     "data.tokenizer: tokenizer.model does not exist; make one from your corpus with `tape tokenizer train --data "
     "{c} --vocab-size 32000 --out tokenizer.model`, or pass data.tokenizer=DIR/tokenizer.model with the Llama-2 "
     "tokenizer (DIR: a download of meta-llama/Llama-2-7b-hf), or data.tokenizer=byte"),
    (["pretrain", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={c}", "data.tokenizer={t}/tok.json"],
     "data.tokenizer: {t}/tok.json does not exist; make one from your corpus with `tape tokenizer train --data {c} "
     "--vocab-size 32000 --out tokenizer.model` and pass data.tokenizer=tokenizer.model, or pass "
     "data.tokenizer=DIR/tokenizer.model with the Llama-2 tokenizer (DIR: a download of meta-llama/Llama-2-7b-hf), "
     "or data.tokenizer=byte"),
    (["pretrain", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={c}", "train.init_from={t}/gone"],
     f"train.init_from: {{t}}/gone does not exist; pass train.init_from=PATH {MODEL_FIX}"),
    (["pretrain", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={c}", "train.init_from=runs/gone"],
     "train.init_from: runs/gone is no directory here, and as a hub id not in the local Hugging Face cache, and the "
     "hub cannot be reached; pass train.init_from=DIR (a local Hugging Face model directory: config.json, "
     "*.safetensors, tokenizer)"),
    (["pretrain", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={c}", "--resume", "{t}/gone"],
     "--resume: {t}/gone does not exist; pass --resume auto (continue --out if it holds a checkpoint), never, or a "
     "run or checkpoint directory"),
    (["finetune", "--checkpoint", "{t}/gone", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={c}"],
     f"--checkpoint: {{t}}/gone does not exist; pass --checkpoint PATH {MODEL_FIX}"),
    (["finetune", "--recipe", "c4-smoke", "--out", "{t}/run", "data.source={c}", "train.init_from={t}/gone"],
     f"train.init_from: {{t}}/gone does not exist; pass train.init_from=PATH {MODEL_FIX}"),
    (["extend-context", "--base", "{t}/gone", "--recipe", "context-extension-smoke", "--out", "{t}/run",
      "data.source={c}"],
     "--base: {t}/gone does not exist; pass --base PATH (a Hugging Face model directory (config.json, "
     "*.safetensors, tokenizer), hub id or short name)"),
    (["extend-context", "--base", "smollm2-135m", "--recipe", "context-extension-smoke", "--out", "{t}/run",
      "data.source={c}"],
     "--base: smollm2-135m is not in the local Hugging Face cache, and the hub cannot be reached; pass --base DIR "
     "(a local Hugging Face model directory: config.json, *.safetensors, tokenizer)"),
    (["extend-context", "--base", "{t}", "--recipe", "context-extension-smoke", "--out", "{t}/run",
      "data.source={c}"],
     "--base: {t} has no config.json; pass --base DIR (a Hugging Face model directory (config.json, *.safetensors, "
     "tokenizer), hub id or short name)"),
    (["eval", "perplexity", "--model", "{t}/gone", "--data", "{c}", "--out", "{t}/run"],
     f"--model: {{t}}/gone does not exist; pass --model PATH {MODEL_FIX}"),
    (["perplexity", "--model", "{t}/gone", "--data", "{t}/none.txt", "--out", "{t}/run"],
     f"--data: {{t}}/none.txt does not exist; pass --data PATH {SOURCE_FIX}"),
    (["eval-addition", "--checkpoint", "{t}/gone", "--out", "{t}/run"],
     f"--model: {{t}}/gone does not exist; pass --model PATH {MODEL_FIX}"),
    (["export", "--checkpoint", "{t}/gone", "--out", "{t}/run"],
     f"--checkpoint: {{t}}/gone does not exist; pass --checkpoint PATH {MODEL_FIX}"),
    (["tokenizer", "train", "--data", "{t}/none.txt", "--vocab-size", "300", "--out", "{t}/run/tok.model"],
     f"--data: {{t}}/none.txt does not exist; pass --data PATH {SOURCE_FIX}"),
]


@pytest.mark.parametrize(("args", "line"), MISSING_PATHS, ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(MISSING_PATHS)])
def test_a_missing_path_names_its_key_and_the_fix(tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch,
                                                  args: list[str], line: str) -> None:
    monkeypatch.chdir(tmp_path)  # the recipes' placeholders (corpus.txt, tokenizer.model) are relative paths
    names = {"t": tmp_path, "c": corpus}
    result = runner.invoke(app, [a.format(**names) for a in args])
    assert one_line_error(result, 2) == "error: " + line.format(**names)
    assert not (tmp_path / "run").exists()


def test_the_tokenizer_line_in_the_message_is_a_command_that_works(tmp_path: Path, corpus: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The `tape tokenizer train ...` of the data.tokenizer message, run as printed (a smaller vocabulary: the
    corpus is tiny), makes the file the recipe names; the same pretrain then gets past the tokenizer."""
    monkeypatch.chdir(tmp_path)
    args = ["pretrain", "--recipe", "c4-smoke", "--out", str(tmp_path / "run"), f"data.source={corpus}",
            "data.tokenizer=tok.model", "train.max_steps=1", "train.warmup=0"]
    line = one_line_error(runner.invoke(app, args), 2)
    command = shlex.split(line.split("`")[1])
    assert command[:3] == ["tape", "tokenizer", "train"]
    command[command.index("--vocab-size") + 1] = "300"
    assert runner.invoke(app, command[1:]).exit_code == 0
    result = runner.invoke(app, [*args, "model.vocab_size=null"])
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------------------------
# Recipes that would hang or crash the parser; duplicate keys (issue 38, cases 2 and 3)


def _bomb(levels: int = 9) -> str:
    """A "billion laughs" under model.pe_args: 10^levels values from a few lines."""
    lines = ["    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "model:\n  pe: rope\n  pe_args:\n" + "\n".join(lines) + "\n"


RECIPES = [
    ("alias-bomb", _bomb(), "line 1: its aliases expand to 1,234,567,915 values (more than 100,000: an alias bomb?); "
                            "write the values out"),
    ("deep", "model:\n  pe_args:\n    a: " + "{b: " * 1000 + "1" + "}" * 1000 + "\n",
     "line 3: nested more than 100 levels deep; flatten it"),
    ("deep-block", "model:\n  pe_args:\n" + "".join("  " * (i + 2) + f"k{i}:\n" for i in range(1000)) + "  x: 1\n",
     "line 100: nested more than 100 levels deep; flatten it"),
    ("duplicate", "train:\n  max_steps: 4\n  lr: 0.001\n  max_steps: 9\n",
     "line 4: key 'max_steps' is given twice (lines 2 and 4); keep one"),
    ("duplicate-flow", "train: {max_steps: 4, max_steps: 9}\n", "line 1: key 'max_steps' is given twice on line 1"),
    ("duplicate-section", "train: {max_steps: 4}\nmodel: {pe: rope}\ntrain: {lr: 0.1}\n",
     "line 3: key 'train' is given twice (lines 1 and 3)"),
    ("python-tag", "model:\n  pe: !!python/object/apply:os.system ['touch {t}/payload']\n",
     "line 2: the tag !!python/object/apply:os.system is refused"),
]


@pytest.mark.parametrize(("text", "fragment"), [row[1:] for row in RECIPES], ids=[row[0] for row in RECIPES])
def test_a_recipe_that_would_hang_or_crash_the_reader_is_one_line_at_once(tmp_path: Path, corpus: Path, text: str,
                                                                          fragment: str) -> None:
    import time

    from tapecli.errors import TapeError
    from tapecli.recipe import load_recipe

    recipe = tmp_path / "r.yaml"
    recipe.write_text(text.replace("{t}", str(tmp_path)))
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"),
                                 f"data.source={corpus}"])
    one_line_error(result, 2, f"{recipe}: {fragment.format(t=tmp_path)}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.yaml", "words.txt"]  # no run, no payload
    started = time.perf_counter()  # the reading itself, imports done: the bomb hung for minutes
    with pytest.raises(TapeError):
        load_recipe(str(recipe))
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize(("override", "line"), [
    ("train.max_steps=1e30", "train.max_steps: 1e+30 is out of range (at most 9,223,372,036,854,775,807 in size)"),
    ("train.batch_size=1e30", "train.batch_size: 1e+30 is out of range (at most 9,223,372,036,854,775,807 in size)"),
    ("train.max_steps=1e8", "train.max_steps: 100,000,000 is more than 99,999,999 (checkpoints are named by 8 "
                            "digits, step-XXXXXXXX)"),
    ("model.pe_args={a: 1, a: 2}", "model.pe_args: line 1: key 'a' is given twice on line 1; keep one"),
    ("model.pe_args.a=" + "[" * 1000 + "]" * 1000, "model.pe_args.a: line 1: nested more than 100 levels deep"),
])
def test_an_override_out_of_range_or_with_a_duplicate_is_one_line(tmp_path: Path, corpus: Path, override: str,
                                                                  line: str) -> None:
    result = runner.invoke(app, ["pretrain", "--recipe", "c4-smoke", "--out", str(tmp_path / "run"),
                                 f"data.source={corpus}", override])
    assert one_line_error(result, 2).startswith("error: " + line)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("grid", "line"), [
    (["train.lr=1e-3,3e-3", "train.warmup=0", "train.lr=1e-2"],
     "--grid train.lr: given twice (--grid number 1 and 3); give every value in one --grid train.lr=A,B"),
    (["train.lr=1e-3,0.001"], "--grid train.lr: 1e-3 and 0.001 are the same value (two cells would train the same "
                              "run); give each value once"),
])
def test_a_grid_key_or_value_given_twice_is_one_line(tmp_path: Path, grid: list[str], line: str) -> None:
    args = ["sweep", "--recipe", "selective-copy-smoke", "--pe", "rope", "--out", str(tmp_path / "sweep")]
    result = runner.invoke(app, [*args, *(a for g in grid for a in ("--grid", g))])
    assert one_line_error(result, 2) == "error: " + line
    assert not (tmp_path / "sweep").exists()


# ---------------------------------------------------------------------------------------------------------------
# lm-eval task files passed through tape (issue 38, cases 3 and 4)


TASK = "task: tiny\ndataset_path: json\noutput_type: loglikelihood_rolling\n"


@pytest.mark.parametrize("how", ["tasks-file", "include-path"])
@pytest.mark.parametrize(("body", "fragment"), [
    ("extra: !!python/object/apply:os.system ['touch {t}/payload']\n",
     "line 4: the tag !!python/object/apply:os.system is refused"),
    ("process: !!python/name:os.system\n", "line 4: the tag !!python/name:os.system is refused"),
    ("output_type: generate_until\n", "line 4: key 'output_type' is given twice (lines 3 and 4); keep one"),
])
def test_a_task_file_with_a_python_tag_or_a_duplicate_key_is_one_line(tmp_path: Path, how: str, body: str,
                                                                      fragment: str) -> None:
    folder = tmp_path / "tasks"
    folder.mkdir()
    task = folder / "tiny.yaml"
    task.write_text(TASK + body.replace("{t}", str(tmp_path)))
    where = ["--tasks", str(task)] if how == "tasks-file" else ["--tasks", "tiny", "--include-path", str(folder)]
    result = runner.invoke(app, ["eval", "harness", "--model", str(tmp_path / "no-model"), *where,
                                 "--out", str(tmp_path / "out")])
    one_line_error(result, 2, f"{task}: {fragment}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks"]  # nothing ran, nothing was written


def test_a_task_file_may_use_lm_evals_function_tag(tmp_path: Path) -> None:
    from tapecli.eval.harness import resolve_task_files

    (tmp_path / "base.yaml").write_text(TASK)
    task = tmp_path / "t.yaml"
    task.write_text("include: base.yaml\ntask: t\nprocess_docs: !function utils.process\n")
    assert resolve_task_files([str(task)], None) == (["t"], [str(tmp_path)])
    (tmp_path / "base.yaml").write_text(TASK + "task: other\n")  # what t.yaml includes is checked too
    with pytest.raises(Exception, match="base.yaml: line 4: key 'task' is given twice"):
        resolve_task_files([str(task)], None)


# ---------------------------------------------------------------------------------------------------------------
# A sweep into another command's output (issue 38, case 5)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished 1-step RoPE run, an evaluation of it and its Hugging Face export, each made by its command."""
    from train_helpers import write_recipe

    root = tmp_path_factory.mktemp("outputs")
    (root / "words.txt").write_text("a few words of text for a tiny corpus\n" * 40)
    recipe = write_recipe(root / "r.yaml", root / "words.txt", train={"max_steps": 1, "save_every": 1, "warmup": 0,
                                                                      "eval_every": 0})
    made = {"run": root / "run", "evaluation": root / "eval", "export": root / "export"}
    for args in (["pretrain", "--recipe", str(recipe), "--out", str(made["run"])],
                 ["eval", "passkey", "-m", str(made["run"]), "--budgets", "40", "--trials", "1", "--out",
                  str(made["evaluation"])],
                 ["export", "-c", str(made["run"]), "--out", str(made["export"])]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return made


@pytest.mark.parametrize(("name", "kind"), [("run", "a tape run directory"), ("evaluation", "an evaluation's output"),
                                            ("export", "a Hugging Face model directory")])
def test_a_sweep_into_another_commands_output_is_refused(outputs: dict[str, Path], name: str, kind: str) -> None:
    def snapshot(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    folder = outputs[name]
    before = snapshot(folder)
    result = runner.invoke(app, ["sweep", "--recipe", "selective-copy-smoke", "--pe", "rope", "--out", str(folder),
                                 "train.max_steps=1"])
    line = (f"error: --out {folder} is a tape run directory, which only its training writes into; pass a new --out"
            if name == "run" else  # every command's check (tapecli.store.run.check_output)
            f"error: --out {folder} is {kind}; a sweep writes its cells into a directory of its own: pass a new --out "
            "(or a directory this sweep wrote)")
    assert one_line_error(result, 2) == line
    assert snapshot(folder) == before


# ---------------------------------------------------------------------------------------------------------------
# Numbers out of range, nan and inf (issue 38, case 7); every int and float option declares its range
# (tests/cli/test_cli.py checks that), these check the lines they give


@pytest.mark.parametrize(("args", "line"), [
    (["eval", "ruler", "-m", "RUN", "--threshold", "nan"],
     "Invalid value for '--threshold': expected a finite number, got nan (see `tape eval ruler --help`)"),
    (["eval", "ruler", "-m", "RUN", "--threshold", "inf"],
     "Invalid value for '--threshold': expected a finite number, got inf (see `tape eval ruler --help`)"),
    (["eval", "ruler", "-m", "RUN", "--threshold", "101"],
     "Invalid value for '--threshold': must be at least 0 and at most 100, got 101 (see `tape eval ruler --help`)"),
    (["eval", "harness", "-m", "RUN", "--tasks", "t", "--limit", "nan"],
     "Invalid value for '--limit': expected a finite number, got nan (see `tape eval harness --help`)"),
    (["bench", "--decode", "--prompt-len", "0"],
     "Invalid value for '--prompt-len': Input should be greater than or equal to 1 (see `tape bench --help`)"),
    (["bench", "--decode", "--new-tokens", "-2"],
     "Invalid value for '--new-tokens': Input should be greater than or equal to 1 (see `tape bench --help`)"),
    (["bench", "--dim", str(2**64)],
     "Invalid value for '--dim': 18446744073709551616 does not fit in 64 bits (see `tape bench --help`)"),
    (["eval", "passkey", "-m", "RUN", "--depths", "0,nan"], "--depths: nan is not a finite number"),
    (["eval", "passkey", "-m", "RUN", "--depths", "0,1.5"], "--depths: 1.5 must be at most 1"),
    (["eval", "ruler", "-m", "RUN", "--lengths", "1024,-1"], "--lengths: -1 must be at least 1"),
    (["eval", "addition", "-m", "RUN", "--seed", "-1"],
     "Invalid value for '--seed': Input should be greater than or equal to 0 (see `tape eval addition --help`)"),
    (["sweep", "--recipe", "selective-copy-smoke", "--pe", "rope", "--out", "OUT", "--jobs", "0"],
     "Invalid value for '--jobs': Input should be greater than or equal to 1 (see `tape sweep --help`)"),
])
def test_a_number_out_of_range_or_not_finite_is_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    result = runner.invoke(app, [a.replace("RUN", str(tmp_path / "run")).replace("OUT", str(tmp_path / "out"))
                                 for a in args], prog_name="tape")
    assert one_line_error(result, 2) == "error: " + line
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# A stop request as a finished run ends (issue 38, case 8)


# Where the signal arrives, all after the run's last checkpoint: right after it is saved (inside the training loop),
# after the process group is torn down (the loop's handler gone), after the command returned, and after the root
# group returned (the fault boundary gone: the interpreter is about to exit).
AFTER_THE_LAST_CHECKPOINT = [("tapecli.train.engine:save_checkpoint", 2), ("tapecli.train.distributed:teardown", 1),
                             ("tapecli.train.engine:pretrain", 1), ("tapecli.cli.app:_Guarded.invoke", 1)]


CASES = [(hook, after, signal.SIGTERM) for hook, after in AFTER_THE_LAST_CHECKPOINT] + [
    ("tapecli.train.distributed:teardown", 1, signal.SIGINT)]


@pytest.mark.slow  # five real processes, each a tiny run (a few seconds each on an idle 2-core CPU)
@pytest.mark.parametrize(("hook", "after", "sig"), CASES, ids=[f"{h.split(':')[1]}-{signal.Signals(s).name}"
                                                               for h, _, s in CASES])
def test_a_stop_after_the_last_checkpoint_ends_the_run_with_exit_0(tmp_path: Path, corpus: Path, hook: str,
                                                                   after: int, sig: int) -> None:
    """The run saves at step 2 and step 4 (its last); the signal comes right after the hooked call returns."""
    import subprocess
    import sys

    import interrupt_helpers
    from train_helpers import REPO, subprocess_env, write_recipe

    recipe = write_recipe(tmp_path / "r.yaml", corpus, train={"max_steps": 4, "save_every": 2, "eval_every": 0})
    args = ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run")]
    proc = subprocess.run([sys.executable, *interrupt_helpers.argv(args, hook, sig, after)], cwd=REPO,
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "stopped:" not in proc.stderr, proc.stderr  # (a signal during the last save may still say it was seen)
    assert "done: 4 steps" in proc.stdout
    assert (tmp_path / "run" / "checkpoints" / "step-00000004").is_dir()


def test_a_stop_between_two_runs_of_one_command_still_stops_it() -> None:
    """Only a command that is one run ignores a late stop: a sweep's cell finishing does not finish the sweep."""
    import typer

    from tapecli import stops

    with pytest.raises(typer.Exit) as stopped, stops.boundary():
        stops.run_finished()  # a cell of a sweep: the command never said it is one run
        assert not stops.finished()
        signal.raise_signal(signal.SIGINT)
    assert stopped.value.exit_code == 130


def test_a_finished_command_leaves_stops_working_for_the_next_one() -> None:
    """In one process that runs several commands (a notebook, these tests), a run that finished in one command does
    not make the next training ignore Ctrl-C."""
    from tapecli import stops
    from tapecli.train.preemption import StopSignal

    with stops.boundary():
        stops.single_run()
        stops.run_finished()
        assert stops.finished()
    assert not stops.finished()
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopSignal() as stop:
            signal.raise_signal(signal.SIGINT)
            assert stop.requested(None) and stop.signal_number == signal.SIGINT
    finally:
        signal.signal(signal.SIGINT, outer)
