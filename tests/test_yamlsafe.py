"""tapecli.yamlsafe: PyYAML's safe loader with limits, no duplicate keys and no tags beyond the standard ones."""

from __future__ import annotations

import pytest

from tapecli.errors import TapeError
from tapecli.recipe.values import parse_value
from tapecli.yamlsafe import MAX_DEPTH, load


def test_plain_yaml_reads_as_pyyaml_reads_it() -> None:
    import yaml

    text = "a: &a {x: 1, y: [1, 2]}\nb:\n  <<: *a\n  x: 3\nc: *a\nd: 2001-12-14\ne: !!str 5\n"
    assert load(text, "t") == yaml.safe_load(text)  # merge keys override, aliases share, standard tags work
    assert load("", "t") is None


def test_limits_hold_at_their_edge() -> None:
    load("a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1), "t")
    with pytest.raises(TapeError, match="nested more than 100 levels deep"):
        load("a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH, "t")
    ten = "[" + ", ".join(["*a"] * 10) + "]"
    load(f"a: &a [{', '.join(['x'] * 100)}]\nb: &b {ten}\nc: [{', '.join(['*b'] * 90)}]\n", "t")  # ~91,000 values
    with pytest.raises(TapeError, match=r"^t: line 1: its aliases expand to 1[0-9,]+ values \(more than 100,000"):
        load(f"a: &a [{', '.join(['x'] * 100)}]\nb: &b {ten}\nc: [{', '.join(['*b'] * 110)}]\n", "t")


def test_tags_are_refused_unless_allowed() -> None:
    with pytest.raises(TapeError, match=r"^t: line 2: the tag !!python/object:os.system is refused"):
        load("a: 1\nb: !!python/object:os.system {}\n", "t")
    with pytest.raises(TapeError, match="the tag !function is refused"):
        load("f: !function utils.f\n", "t")
    assert load("f: !function utils.f\n", "t", tags={"!function"}) == {"f": "utils.f"}


def test_command_line_values_keep_text_that_is_not_yaml_but_refuse_what_yaml_refuses() -> None:
    assert parse_value("*.pe.*") == "*.pe.*" and parse_value("[1, 2") == "[1, 2" and parse_value("1e-3") == 0.001
    with pytest.raises(TapeError, match=r"^train.x: line 1: key 'a' is given twice"):
        parse_value("{a: 1, a: 2}", "train.x")
