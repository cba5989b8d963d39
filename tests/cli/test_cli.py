"""The `tape` entry point: fast help, real commands, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()


def test_help_lists_the_commands_and_imports_nothing_heavy():
    code = ("import sys, tapecli.cli as c; "
            "heavy = [m for m in ('torch', 'datasets', 'matplotlib', 'lm_eval', 'transformers') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("pretrain", "finetune", "eval", "bench", "recipes", "tokenizer", "extend-context", "export"):
        assert command in result.output


def test_bench_runs_and_reports_ratios(tmp_path):
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--pe", "rope,alibi,tape,cope,path", "--n-layers", "1", "--dim", "32",
                                 "--seq-len", "16", "--batch-size", "2", "--steps", "1", "--warmup", "0",
                                 "--rounds", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["ratio_to_rope"]["rope"] == 1.0
    assert set(data["ratio_to_rope"]) == {"rope", "alibi", "cope", "path", "tape (separate)", "tape (concat)"}
    assert all(v > 0 for v in data["median_step_s"].values())


def test_bench_rejects_unknown_pe():
    result = runner.invoke(app, ["bench", "--pe", "rotary"])
    assert result.exit_code == 2
    assert "unknown positional encoding 'rotary'" in result.output and "Traceback" not in result.output


def test_recipes_lists_and_shows():
    listing = runner.invoke(app, ["recipes"])
    assert listing.exit_code == 0 and "arithmetic" in listing.output and "c4-smoke" in listing.output
    shown = runner.invoke(app, ["recipes", "c4"])
    assert shown.exit_code == 0 and "model:" in shown.output and "#" in shown.output
    missing = runner.invoke(app, ["recipes", "c5"])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_bad_pe_args_are_one_line_errors_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["pretrain", "--recipe", "c4-smoke", "--out", str(out), f"data.source={tmp_path}",
                                 "model.pe=rope", "model.pe_args.scaling=ntk"])
    assert result.exit_code == 2, result.output
    assert "model.pe_args.scaling: unknown RoPE scaling 'ntk'" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_tokenizer_train_command_writes_a_lossless_model(tmp_path, tiny_corpus):
    from tapecli.data.tokenizer import load_tokenizer

    out = tmp_path / "tok.model"
    result = runner.invoke(app, ["tokenizer", "train", "--data", str(tiny_corpus), "--vocab-size", "400",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = (tiny_corpus / "doc00.txt").read_text()
    tok = load_tokenizer(str(out))
    assert tok.vocab_size == 400 and tok.decode(tok.encode(text)) == text
    bad = runner.invoke(app, ["tokenizer", "train", "--data", str(tmp_path / "missing"), "--vocab-size", "300",
                              "--out", str(out)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
