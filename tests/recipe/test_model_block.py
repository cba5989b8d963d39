"""`model.block` (the block's layout: norm placement, norm kind, q/k norm span, ...) and `model.sinks` are recipe keys:
every key and value checked, each mistake one line naming the key (from a recipe file or the command line, before
anything trains); shipped recipes spell them (test_recipes.py). Training with them and resuming: tests/train/
test_resume_designs.py; old run directories without them: test_legacy.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.recipe import load_recipe, recipe_text

BAD = [
    ("model.block.norms=serial", "model.block.norms: 'serial' is not one of pre, post, sandwich, parallel"),
    ("model.block.nrm=rms", "model.block.nrm: unknown key; allowed: norms, qk_norm, norm, norm_weight, activation, "
                            "embed_scale, query_pre_attn_scalar, logit_scale"),
    ("model.block.embed_scale=1", "model.block.embed_scale: expected true or false, got 1"),
    ("model.block.logit_scale=0", "model.block.logit_scale: expected a positive number, got 0"),
    ("model.block=3", "model.block: expected a mapping with string keys, got '3'"),
    ("model.sinks=maybe", "model.sinks: expected true or false, got 'maybe'"),
]


@pytest.mark.parametrize(("override", "message"), BAD)
def test_a_bad_block_or_sinks_value_is_one_line_naming_the_key(override, message):
    with pytest.raises(TapeError) as info:
        load_recipe("selective-copy-smoke", [override])
    assert str(info.value) == message


def test_block_keys_from_a_recipe_file_and_the_command_line(tmp_path: Path):
    text = recipe_text("selective-copy-smoke").replace("  sinks: false ", "  sinks: true  ").replace(
        "  # block:", "  block: {norms: post, qk_norm: projection}  #", 1)
    path = tmp_path / "r.yaml"
    path.write_text(text)
    recipe = load_recipe(str(path), ["model.block.norm=layernorm"])
    assert recipe.model.block == {"norms": "post", "qk_norm": "projection", "norm": "layernorm"}
    assert recipe.model.sinks is True
    path.write_text(text.replace("{norms: post,", "{norms: post, activation: relu,"))
    with pytest.raises(TapeError, match=r"^model.block.activation: 'relu' is not one of silu, gelu_tanh$"):
        load_recipe(str(path), [])


def test_the_cli_refuses_a_bad_block_before_training(tmp_path: Path):
    result = CliRunner().invoke(app, ["pretrain", "--recipe", "selective-copy-smoke", "--out", str(tmp_path / "run"),
                                      "model.block.norms=serial"])
    one_line_error(result, 2, "model.block.norms: 'serial' is not one of pre, post, sandwich, parallel")
    assert not (tmp_path / "run").exists()
