"""RULER training pairs (`tapecli.data.ruler.training`) and the CPU example's data (`tapecli.data.ruler.example`, run
by scripts/ruler_example.py): the real generator, a real tokenizer, rows the real `pairs` data kind turns into
examples whose loss is on the answer, and that fit the example's recipe (recipes/ruler-example.yaml)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tapecli.data.pairs import build_pair_datasets
from tapecli.data.ruler import example
from tapecli.data.ruler.tasks import generate
from tapecli.data.ruler.training import training_pairs, write_jsonl
from tapecli.data.text import IGNORE_INDEX
from tapecli.data.tokenizer import load_tokenizer
from tapecli.errors import TapeError
from tapecli.recipe import load_recipe

ROOT = Path(__file__).parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "ruler" / "tokenizer" / "tokenizer.json"


def test_training_pairs_are_rulers_prompts_with_the_answer_as_target(tmp_path):
    tok = load_tokenizer(str(TOKENIZER))
    count = lambda text: len(tok.encode(text))  # noqa: E731
    rows = training_pairs("niah_single_1", [1024, 2048], count, 3, seed=1000)
    assert [(r["length"], r["index"]) for r in rows] == [(n, i) for n in (1024, 2048) for i in range(3)]
    evaluation = {s.prompt for n in (1024, 2048) for s in generate("niah_single_1", n, count, 3)}  # seed 42
    for row in rows:
        number = row["target"][1:]
        assert re.fullmatch(r" \d{7}", row["target"])
        assert f" is: {number}." in row["prompt"] and row["prompt"].endswith(" mentioned in the provided text is")
        assert row["prompt"] not in evaluation
        assert count(row["prompt"]) + 128 <= row["length"]  # RULER's budget: prompt + tokens to generate
    # The first length's rows are the generator's own samples with seed 1000, the second's with seed 1001.
    assert rows[3]["prompt"] == generate("niah_single_1", 2048, count, 1, seed=1001)[0].prompt
    # Through the real `pairs` data kind: the loss is on the answer's tokens and EOS only.
    source = write_jsonl(rows, tmp_path / "train.jsonl")
    assert [json.loads(line) for line in source.read_text().splitlines()] == rows
    train, val = build_pair_datasets(str(source), tok, 2048, 0.0, 0)
    assert val is None and len(train) == 6
    for (ids, labels), row in zip(train, rows, strict=True):
        answer = tok.encode(row["target"]) + [tok.eos_id]
        assert labels[labels != IGNORE_INDEX].tolist() == answer
        assert ids[1 : 1 + count(row["prompt"])].tolist() == tok.encode(row["prompt"])
    with pytest.raises(TapeError, match="seed 42 is the evaluation's"):
        training_pairs("niah_single_1", [1024], count, 1, seed=42)


def test_the_examples_tokenizer_and_rows_fit_its_recipe(tmp_path, capsys):
    """The example's data command (what scripts/ruler_example.py runs): RULER's fixed phrases are single pieces of its
    tokenizer, so a noise line is 6 tokens, and the longest training row fits the recipe's data.seq_len (BOS + prompt
    + answer + EOS)."""
    recipe = load_recipe("ruler-example")
    example.main([str(tmp_path), "--rows-per-length", "4", "--lengths", f"224,{recipe.model.max_seq_len}"])
    assert "and 8 rows to" in capsys.readouterr().out
    tok = load_tokenizer(str(tmp_path / "tokenizer.model"))
    for symbol in example.SYMBOLS:
        assert len(tok.encode(symbol)) == 1, symbol
    noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
    assert len(tok.encode(noise)) == 6 and tok.decode(tok.encode(noise)) == noise
    count = lambda text: len(tok.encode(text))  # noqa: E731
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows == training_pairs(example.TASK, [224, recipe.model.max_seq_len], count, 4, seed=1000)
    longest = max(2 + count(r["prompt"]) + count(r["target"]) for r in rows)
    seq_len = recipe.data.seq_len
    assert seq_len - 10 < longest <= seq_len
    digits = rows[0]["target"][1:]
    assert tok.encode(rows[0]["target"]) == [*tok.encode(" "), *(tok.encode(d)[0] for d in digits)]  # one per digit
    train, _ = build_pair_datasets(str(tmp_path / "train.jsonl"), tok, seq_len, 0.0, 0)
    assert all(int(np.sum(labels.numpy() != IGNORE_INDEX)) == 9 for _, labels in train)  # space, 7 digits, EOS
