"""Odd command lines that used to be accepted in silence or named no file: comma-separated lists with an empty or
repeated entry (one parser, `tapecli.commas`), an empty `--lengths`, a binary `--qa-data` file, `--allow-pe` naming
a missing file or a directory, and a closed stdout (`tape ... | head`), which ends the command quietly. Each
refusal: exit 2, one `error:` line naming the option, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from train_helpers import REPO, subprocess_env
from typer.testing import CliRunner

from tapecli import trust
from tapecli.cli import app

runner = CliRunner()
EMPTY = "an empty entry (two commas in a row, or a comma at either end); separate the values by single commas"
SWEEP = ["sweep", "--recipe", "selective-copy-smoke", "--out", "OUT"]


@pytest.fixture(autouse=True)
def nothing_allowed(monkeypatch):
    monkeypatch.delenv(trust.ALLOW_ENV, raising=False)


@pytest.mark.parametrize(("args", "line"), [
    ([*SWEEP, "--pe", "rope,,nope"], f"--pe 'rope,,nope': {EMPTY}"),
    ([*SWEEP, "--pe", "rope,nope,rope"], "--pe 'rope,nope,rope': rope is given twice; give each value once"),
    ([*SWEEP, "--pe", "rope,"], f"--pe 'rope,': {EMPTY}"),
    ([*SWEEP, "--pe", "rope", "--grid", "train.lr=1e-3,,2e-3"], f"--grid train.lr '1e-3,,2e-3': {EMPTY}"),
    ([*SWEEP, "--pe", "rope", "--seeds", "0,,1"],
     f"Invalid value for '--seeds': '0,,1': {EMPTY} (see `tape sweep --help`)"),
    (["bench", "--hybrid", "irope,,rnope-swa"], f"--hybrid 'irope,,rnope-swa': {EMPTY}"),
    (["bench", "--hybrid", "irope,rnope-swa,irope"],
     "--hybrid 'irope,rnope-swa,irope': irope is given twice; give each value once"),
    (["bench", "--pe", ",alibi"], f"--pe ',alibi': {EMPTY}"),
    (["doctor", "--pe", "alibi,alibi"], "--pe 'alibi,alibi': alibi is given twice; give each value once"),
    (["demo", "--pe", "nope,,fire"], f"--pe 'nope,,fire': {EMPTY}"),
    (["eval", "babilong", "-m", "RUN", "--lengths", ""], "--lengths: give at least one value"),  # ran the defaults
    (["eval", "latent-list", "-m", "RUN", "--lengths", "1k,1024"],
     "--lengths '1k,1024': 1024 tokens are given twice; give each length once"),
    (["eval", "babilong", "-m", "RUN", "--lengths", "0,1k", "--base-lengths", ""],
     "--base-lengths: give at least one value"),
    (["eval", "ruler", "-m", "RUN", "--lengths", "1024,,2048"], f"--lengths '1024,,2048': {EMPTY}"),
    (["eval", "ruler", "-m", "RUN", "--lengths", "1024,1024"],
     "--lengths '1024,1024': 1024 is given twice; give each value once"),
    (["eval", "ruler", "-m", "RUN", "--tasks", "vt,vt"], "--tasks 'vt,vt': vt is given twice; give each value once"),
    (["eval", "synthetic", "-m", "RUN", "--splits", "test,"], f"--splits 'test,': {EMPTY}"),
    (["eval", "harness", "-m", "RUN", "--tasks", "a,,b"], f"--tasks 'a,,b': {EMPTY}"),
    (["eval", "ruler", "-m", "RUN", "--tasks", "qa_1", "--lengths", "64", "--qa-data", "DIR/binary.json"],
     "--qa-data DIR/binary.json: not UTF-8 text (invalid start byte at byte 1); give RULER's SQuAD or HotpotQA "
     ".json file"),  # named no file
    (["--allow-pe", "DIR/missing.py", "pe", "list"],
     "--allow-pe DIR/missing.py: DIR/missing.py does not exist; give the plugin's Python file (FILE.py or "
     "FILE.py:CLASS) or an importable module name"),
    (["--allow-pe", "DIR/", "pe", "list"],
     "--allow-pe DIR/: DIR is a directory; give the plugin's Python file (FILE.py or FILE.py:CLASS) or an "
     "importable module name"),
])
def test_a_list_with_an_empty_or_repeated_entry_and_a_missing_allowed_file_are_one_line(tmp_path: Path,
                                                                                        args: list[str],
                                                                                        line: str) -> None:
    def fill(text: str) -> str:
        return text.replace("RUN", str(tmp_path / "run")).replace("OUT", str(tmp_path / "out")).replace(
            "DIR", str(tmp_path))

    if "DIR/binary.json" in args:
        (tmp_path / "binary.json").write_bytes(b"{\xff\xfe binary")
    made = sorted(tmp_path.iterdir())
    result = runner.invoke(app, [fill(a) for a in args], prog_name="tape")
    assert one_line_error(result, 2) == "error: " + fill(line)
    assert sorted(tmp_path.iterdir()) == made


def test_a_closed_stdout_ends_the_command_quietly(tmp_path: Path) -> None:
    """`tape ... | head` once ended with `error: broken pipe`: a pipe whose reader is gone is no error to report."""
    read, write = os.pipe()
    os.close(read)  # the reader went away before tape wrote its line
    try:
        proc = subprocess.run([sys.executable, "-m", "tapecli", "pe", "new", "mine", "--out", str(tmp_path / "m.py")],
                              stdout=write, stderr=subprocess.PIPE, text=True, cwd=REPO, env=subprocess_env())
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (1, "")
    assert (tmp_path / "m.py").is_file()  # the work was done; only its report had nowhere to go
