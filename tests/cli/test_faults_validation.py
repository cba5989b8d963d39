"""One text file is one document, and the validation split is a choice of whole documents: such a run has no
validation split. Training says so at its start (naming data.source and the fix); `tape sweep`, which judges a text
sweep by the validation perplexity, refuses it before training any cell (it used to train every cell and then
guess `data.val_fraction 0?`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.text import TextData

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ("data.tokenizer=byte", "model.vocab_size=259", "model.n_layers=1", "model.dim=32", "model.n_heads=2",
        "data.seq_len=16", "train.max_steps=1")
ONE = ("holds one document, and the validation split is a choice of whole documents (data.val_fraction of them, "
       "never all): give two or more (several .txt files, or a .jsonl or .json with one document per row)")


@pytest.fixture
def one_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("a few words of text for a tiny corpus\n" * 40)
    return path


def test_training_on_one_document_says_there_is_no_validation_split(tmp_path: Path, one_file: Path) -> None:
    result = runner.invoke(app, ["pretrain", "--recipe", "c4-smoke", "--out", str(tmp_path / "run"),
                                 f"data.source={one_file}", *TINY])
    assert result.exit_code == 0, result.output
    assert (f"note: no validation split, so no validation loss is logged: data.source {one_file} {ONE}"
            in result.output)
    assert not any("val_loss" in line for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())


def test_a_sweep_without_validation_is_refused_before_training(tmp_path: Path, one_file: Path) -> None:
    result = runner.invoke(app, ["sweep", "--recipe", "c4-smoke", "--pe", "rope,alibi", "--out", str(tmp_path / "sw"),
                                 f"data.source={one_file}", *TINY])
    assert one_line_error(result, 2) == (f"error: cell rope-seed0: no validation split, and a sweep over data.kind "
                                         f"'text' reports the validation perplexity: data.source {one_file} {ONE}")
    assert not (tmp_path / "sw").exists()


def test_why_a_text_source_has_no_validation_split(tmp_path: Path, one_file: Path) -> None:
    assert TextData(source=str(one_file), val_fraction=0.0).no_validation() == (
        "data.val_fraction is 0 (pass data.val_fraction=0.01 to hold out 1% of the documents)")
    (tmp_path / "second.txt").write_text("another document\n")
    assert TextData(source=str(tmp_path), val_fraction=0.1).no_validation() is None  # two files: two documents
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "one"}\n{"text": "two"}\n')
    assert TextData(source=str(rows)).no_validation() is None
