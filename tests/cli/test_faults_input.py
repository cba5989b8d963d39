"""What a first run and the third fault campaign found (issues 37 and 38): every missing path named by a recipe key
or an option is one line naming that key and its fix; recipes that would hang or crash the parser, duplicate keys,
lm-eval task files with Python tags, a sweep into another command's output, non-finite or out-of-range option
values, a changed Hugging Face base, and a SIGTERM as a finished run ends.

Each case is one `error:` line (exit 2), no traceback, nothing written.
"""

from __future__ import annotations

import shlex
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
