"""The addition data: McLeish et al. format, bucket lengths, determinism, loss masking, named tokenizer."""

from __future__ import annotations

from collections import Counter

import pytest

from tapecli.data.arithmetic import (
    IGNORE_INDEX,
    AdditionDataset,
    build_addition_datasets,
    eval_problems,
    prompt_text,
)
from tapecli.data.tokenizer import CharTokenizer, load_tokenizer, load_tokenizer_dir
from tapecli.errors import TapeError
from tapecli.recipe import load_recipe


def dataset(seed: int = 0, min_digits: int = 1, max_digits: int = 6, split: str = "train") -> AdditionDataset:
    return AdditionDataset(seed=seed, min_digits=min_digits, max_digits=max_digits, seq_len=3 * max_digits + 4,
                           length=10_000, split=split)


def test_tokenizer_is_named_and_round_trips(tmp_path):
    tok = load_tokenizer("addition")
    assert isinstance(tok, CharTokenizer) and tok.kind == "addition"
    assert len({tok.pad_id, tok.bos_id, tok.eos_id, *tok.digit_ids}) == 13 and tok.pad_id == 0
    assert tok.decode(tok.encode("0123+987=") + [tok.eos_id, tok.pad_id]) == "0123+987="
    tok.save(tmp_path / "tok")
    assert load_tokenizer_dir(tmp_path / "tok").kind == "addition"
    with pytest.raises(TapeError, match="no token for 'x'"):
        tok.encode("1x2")


def test_examples_are_true_reversed_sums_with_eos():
    ds = dataset()
    tok = ds.tokenizer
    for index in range(200):
        a, b = ds.problem(index)
        input_ids, labels = ds[index]
        assert input_ids.shape == labels.shape == (ds.seq_len,)
        # The inputs hold the whole example but its final EOS (the last label), then padding.
        first, rest = tok.decode(input_ids.tolist()).split("+")
        second, answer = rest.split("=")
        assert (int(first[::-1]), int(second[::-1])) == (a, b)  # operands written least-significant digit first
        assert answer == str(a + b)[::-1]  # the true sum, reversed
        assert [y for y in labels.tolist() if y != IGNORE_INDEX][-1] == tok.eos_id


def test_labels_cover_only_the_answer_and_eos():
    ds = dataset()
    tok = ds.tokenizer
    for index in range(50):
        a, b = ds.problem(index)
        input_ids, labels = ds[index]
        prompt_len = len(prompt_text(a, b))
        answer = tok.encode(str(a + b)[::-1]) + [tok.eos_id]
        ids, ys = input_ids.tolist(), labels.tolist()
        # The label at position t is the token after t: the answer starts after the `=` (position prompt_len - 1).
        assert ys[: prompt_len - 1] == [IGNORE_INDEX] * (prompt_len - 1)
        assert ys[prompt_len - 1 : prompt_len - 1 + len(answer)] == answer
        assert set(ys[prompt_len - 1 + len(answer) :]) <= {IGNORE_INDEX}
        assert ids[1 : prompt_len + len(answer) - 1] == (tok.encode(prompt_text(a, b)) + answer)[1:-1]
        assert set(ids[prompt_len + len(answer) - 1 :]) <= {tok.pad_id}


def test_stream_is_deterministic_random_access_and_seeded():
    a, b = dataset(seed=3), dataset(seed=3)
    forward = [a[i][0].tolist() for i in range(20)]
    backward = [b[i][0].tolist() for i in reversed(range(20))][::-1]
    assert forward == backward
    assert forward != [dataset(seed=4)[i][0].tolist() for i in range(20)]
    assert forward != [dataset(seed=3, split="val")[i][0].tolist() for i in range(20)]


def test_bucket_lengths_are_uniform_per_operand_and_have_no_leading_zero():
    ds = dataset(min_digits=2, max_digits=5)
    problems = [ds.problem(i) for i in range(4000)]
    for operand in (0, 1):
        counts = Counter(len(str(p[operand])) for p in problems)
        assert set(counts) == {2, 3, 4, 5}
        assert min(counts.values()) > 850  # ~1000 each
    # Independent lengths: the two operands do not always have the same length.
    assert sum(len(str(x)) != len(str(y)) for x, y in problems) > 2500


def test_eval_problems_have_exact_lengths_and_are_prefix_stable():
    for i, j in [(1, 1), (1, 7), (12, 3)]:
        problems = eval_problems(i, j, samples=30, seed=5)
        assert all(len(str(a)) == i and len(str(b)) == j for a, b in problems)
        assert eval_problems(i, j, samples=10, seed=5) == problems[:10]
        assert eval_problems(i, j, samples=30, seed=6) != problems
    assert eval_problems(3, 4, 5, seed=5) != eval_problems(4, 3, 5, seed=5)


def test_seq_len_too_short_is_a_tape_error():
    with pytest.raises(TapeError, match="data.seq_len"):
        AdditionDataset(seed=0, min_digits=1, max_digits=10, seq_len=20, length=10)


def test_build_from_the_smoke_recipe():
    data = load_recipe("arithmetic-smoke").data
    train, val, tok = build_addition_datasets(data, seed=0)
    assert tok.kind == "addition"
    assert len(train) == 2**31 and len(val) > 0
    assert train[len(train) - 1][0].shape == (data.seq_len,)
    assert max(max(len(str(a)), len(str(b))) for a, b in map(train.problem, range(500))) == data.max_digits
