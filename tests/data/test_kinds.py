"""The data kinds: one static table, each kind owning its `data:` and `eval:` keys, their checks and its datasets."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest

from tapecli.data.arithmetic import AdditionData, AdditionDataset
from tapecli.data.build import KINDS, build_datasets
from tapecli.data.counting import CountingData
from tapecli.data.flipflop import FlipFlopData
from tapecli.data.schema import DataSchema
from tapecli.data.synthetic import GridData, SelectiveCopyData, SyntheticDataset
from tapecli.data.text import PackedDataset, TextData
from tapecli.errors import TapeError
from tapecli.recipe import load_recipe
from tapecli.recipe.schema import ExtendSection, ModelSection, TrainSection

DOCS = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
SCHEMAS = sorted({*KINDS.values(), *(k.Eval for k in KINDS.values() if k.Eval)}, key=lambda c: c.__name__)


def test_the_table_names_every_kind_and_each_schema_its_own():
    assert list(KINDS) == ["text", "pairs", "addition", "scrolls", "selective-copy", "grid-1d", "grid-2d",
                           "flip-flop", "counting", "babilong"]
    for kind, schema in KINDS.items():
        assert issubclass(schema, DataSchema) and dataclasses.is_dataclass(schema)
        first = dataclasses.fields(schema)[0]
        assert first.name == "kind" and kind in typing.get_args(typing.get_type_hints(schema)["kind"])
        assert "seq_len" in {f.name for f in dataclasses.fields(schema)}
    assert [k for k, s in KINDS.items() if s.Eval is None] == ["text", "pairs", "scrolls"]


@pytest.mark.parametrize("schema", [*SCHEMAS, ModelSection, TrainSection, ExtendSection], ids=lambda c: c.__name__)
def test_every_key_has_a_default_and_a_one_line_comment(schema):
    source = inspect.getsource(schema)
    for f in dataclasses.fields(schema):
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, f.name
        line = next(ln for ln in source.splitlines() if re.match(rf"\s+{f.name}: ", ln))
        assert re.search(r"#\s*\S", line), f"{schema.__name__}.{f.name} has no comment"


def test_kinds_with_their_own_tokenizer_have_no_tokenizer_key():
    for schema, name in [(AdditionData, "addition"), (SelectiveCopyData, "synthetic"), (GridData, "synthetic"),
                         (FlipFlopData, "flip-flop"), (CountingData, "counting")]:
        assert "tokenizer" not in {f.name for f in dataclasses.fields(schema)} and schema().tokenizer == name
    recipe = load_recipe("arithmetic-smoke")
    assert recipe.data.tokenizer == "addition" and "tokenizer" not in recipe.to_dict()["data"]
    assert TextData(source="x").tokenizer == "byte"


@pytest.mark.parametrize(("recipe", "overrides", "message"), [
    ("c4-smoke", ["data.blanks=3"], "data.blanks is not a key of kind text"),
    ("c4-smoke", ["data.text_feild=body"], "data.text_feild is not a key of kind text (did you mean "
                                            "'data.text_field'?)"),
    ("c4-smoke", ["eval.samples=3"], "eval.samples is not a key of kind text (kind text has no eval keys)"),
    ("arithmetic-smoke", ["data.tokenizer=byte"], "data.tokenizer is not a key of kind addition (kind addition "
                                                  "brings its own tokenizer)"),
    ("arithmetic-smoke", ["data.val_fraction=0.1"], "data.val_fraction is not a key of kind addition"),
    ("arithmetic-smoke", ["eval.dense_blanks=3"], "eval.dense_blanks is not a key of kind addition"),
    ("selective-copy-smoke", ["eval.dense_grid=[8, 4, 0.2]"], "eval.dense_grid is not a key of kind "
                                                               "selective-copy"),
    ("grid-1d-smoke", ["data.blanks=3"], "data.blanks is not a key of kind grid-1d"),
    ("scrolls-smoke", ["data.prompt_field=input"], "data.prompt_field is not a key of kind scrolls"),
    ("c4-smoke", ["data.seq_len.x=1"], "data.seq_len.x is not a key of kind text (did you mean 'data.seq_len'?)"),
])
def test_a_key_the_kind_does_not_use_is_one_typed_line(recipe, overrides, message):
    with pytest.raises(TapeError) as info:
        load_recipe(recipe, overrides)
    assert str(info.value) == message


def test_a_file_error_names_the_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("data:\n  kind: pairs\n  source: rows.jsonl\n  text_field: body\n")
    with pytest.raises(TapeError, match=rf"^{re.escape(str(path))}: data.text_field is not a key of kind pairs$"):
        load_recipe(str(path))


def test_data_kind_chooses_the_schema(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model: {pe: rope, max_seq_len: 64}\ndata: {source: rows.jsonl, seq_len: 32}\n")
    assert type(load_recipe(str(path)).data) is TextData  # no kind: text
    pairs = load_recipe(str(path), ["data.kind=pairs", "data.prompt_field=question"])
    assert (pairs.data.kind, pairs.data.prompt_field, pairs.data.target_field) == ("pairs", "question", "target")
    assert "data.kind" in pairs.set_keys and "data.kind" not in load_recipe(str(path)).set_keys
    with pytest.raises(TapeError, match=rf"^{re.escape(str(path))}: data.source is not a key of kind grid-2d$"):
        load_recipe(str(path), ["data.kind=grid-2d"])  # the file was written for a kind that reads files
    with pytest.raises(TapeError, match=r"^data.kind: expected one of text, pairs, addition, scrolls, selective-copy, "
                                        r"grid-1d, grid-2d, flip-flop, counting, babilong; got 'images'$"):
        load_recipe(str(path), ["data.kind=images"])


@pytest.mark.parametrize(("recipe", "overrides", "message"), [
    ("arithmetic-smoke", ["data.min_digits=6"], "data.min_digits: 6 exceeds data.max_digits (5)"),
    ("arithmetic-smoke", ["data.max_digits=0"], "data.max_digits: must be a positive integer, got 0"),
    ("arithmetic-smoke", ["eval.max_len=0"], "eval.max_len: must be a positive integer, got 0"),
    ("arithmetic", ["data.max_digits=80"], "data.seq_len: 128 is too short for 80-digit addition (needs 244 "
                                           "tokens)"),
    ("c4-smoke", ["data.val_fraction=1"], "data.val_fraction: must be in [0, 1), got 1.0"),
    ("c4-smoke", ["data.tokenizer=addition"], "data.tokenizer: 'addition' is the tokenizer of generated data"),
    ("scrolls-smoke", ["data.task=qa"], "data.task: unknown SCROLLS task 'qa'"),
    ("selective-copy-smoke", ["data.seq_len=12"], "data.seq_len: 12 is too short for selective copy"),
    ("selective-copy-smoke", ["eval.sparse_blanks=-1"], "eval.sparse_blanks: must be >= 0, got -1"),
    ("grid-2d-smoke", ["data.p_empty=1.5"], "data.p_empty: must be in [0, 1], got 1.5"),
    ("grid-2d-smoke", ["eval.sparse_grid=[8.5, 4, 0.2]"], "eval.sparse_grid: expected [length, width, p_empty]"),
    ("grid-2d-smoke", ["eval.samples=0"], "eval.samples: must be a positive integer, got 0"),
])
def test_each_kind_checks_its_keys(recipe, overrides, message):
    with pytest.raises(TapeError) as info:
        load_recipe(recipe, overrides)
    assert str(info.value).startswith(message)


def test_the_table_builds_each_kind_s_datasets(tmp_path, tiny_corpus):
    from tapecli.data.tokenizer import load_tokenizer

    byte = load_tokenizer("byte")
    built = {
        "text": build_datasets(load_recipe("c4-smoke", [f"data.source={tiny_corpus}"]), byte, tmp_path / "cache"),
        "addition": build_datasets(load_recipe("arithmetic-smoke"), None, tmp_path),
        "selective-copy": build_datasets(load_recipe("selective-copy-smoke"), None, tmp_path),
        "grid-2d": build_datasets(load_recipe("grid-2d-smoke"), None, tmp_path),
    }
    assert isinstance(built["text"][0], PackedDataset) and built["text"][0][0][0].shape == (64,)
    assert isinstance(built["addition"][0], AdditionDataset) and len(built["addition"][1]) == 2048
    for kind in ("selective-copy", "grid-2d"):
        train, val = built[kind]
        assert isinstance(train, SyntheticDataset) and (train.task, train.split, val.split) == (kind, "train", "val")
    assert built["grid-2d"][0].spec.width == 4  # data.grid_width of grid-2d-smoke


def test_docs_list_every_key_of_every_kind():
    text = DOCS.read_text()
    for kind, schema in KINDS.items():
        heading = next(h for h in re.findall(r"^### (.+)$", text, re.M) if kind in h.split(", "))
        body = text.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
        documented = set(re.findall(r"^\| `(\w+)` \|", body, re.M))
        keys = {f.name for f in dataclasses.fields(schema)} - {"kind"}
        eval_keys = {f.name for f in dataclasses.fields(schema.Eval)} if schema.Eval else set()
        assert documented == keys | eval_keys, kind
