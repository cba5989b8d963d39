"""The model-config merge rule (tapecli.model.merge), the recipe's record of which keys the user set, and the
regression: a fine-tuning recipe's model keys count even when they equal the schema default."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import weights, write_recipe
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.model import ModelConfig
from tapecli.model.merge import merge_model_config
from tapecli.recipe import load_recipe

runner = CliRunner()
SAVED = ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, max_seq_len=64, pe="rope",
                    pe_args={"theta": 500.0}, tie_embeddings=True).to_dict()


def test_recipe_records_the_keys_the_user_set(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("model:\n  pe: rope\n  tie_embeddings: false\ndata:\n  source: x.txt\n")
    recipe = load_recipe(str(path), ["train.lr=1e-3", "model.pe_args.theta=1e6"])
    assert recipe.set_keys == {"model.pe", "model.tie_embeddings", "data.source", "train.lr", "model.pe_args"}
    assert recipe.set_values("model") == {"pe": "rope", "tie_embeddings": False, "pe_args": {"theta": 1e6}}
    copy = load_recipe("selective-copy-smoke")  # the shipped file writes every eval key of its kind: all are set
    assert copy.set_values("eval") == copy.to_dict()["eval"] and copy.set_values("eval")["samples"] == 4
    assert load_recipe("c4-smoke").set_values("eval") == {}  # kind text has no eval section


def test_merge_keeps_unset_keys_and_applies_set_ones():
    config, grown = merge_model_config(SAVED, {"max_seq_len": 128, "norm_eps": 1e-6}, "ckpt")
    assert (config.max_seq_len, config.norm_eps, config.tie_embeddings, grown) == (128, 1e-6, True, False)
    config, _ = merge_model_config(SAVED, {"n_kv_heads": None, "ffn_dim": None, "vocab_size": None, "dim": 32}, "c")
    assert config.to_dict() == SAVED  # nulls mean what ModelConfig makes of them, which is what is saved


def test_pe_may_grow_from_rope_to_tape_keeping_rope_args():
    config, grown = merge_model_config(SAVED, {"pe": "tape", "pe_args": {"variant": "official"}}, "ckpt")
    assert grown and config.pe == "tape" and config.pe_args == {"theta": 500.0, "variant": "official"}


@pytest.mark.parametrize("requested, key", [
    ({"tie_embeddings": False}, "tie_embeddings"), ({"dim": 64}, "dim"), ({"n_kv_heads": 1}, "n_kv_heads"),
    ({"pe": "alibi"}, "pe"), ({"vocab_size": 300}, "vocab_size"),
])
def test_shape_changes_are_errors_naming_the_key(requested, key):
    with pytest.raises(TapeError, match=f"model.{key}: the recipe asks for"):
        merge_model_config(SAVED, requested, "ckpt")


def test_regression_finetune_recipe_keys_equal_to_defaults_are_not_ignored(tmp_path: Path, tiny_corpus: Path,
                                                                            trained):
    """The bug: `tie_embeddings: false` and `pe: tape` equal the schema defaults, so a RoPE checkpoint with tied
    weights used to be fine-tuned as RoPE with tied weights, silently."""
    base = trained("tiny", "model.tie_embeddings=true")  # RoPE, 2 steps
    ft = write_recipe(tmp_path / "ft.yaml", tiny_corpus, model={"pe": "tape", "tie_embeddings": False},
                      train={"max_steps": 1, "freeze": ["*"], "unfreeze": ["*.pe.*"], "warmup": 0})
    result = runner.invoke(app, ["finetune", "--checkpoint", str(base), "--recipe", str(ft), "--out",
                                 str(tmp_path / "ft")])
    assert result.exit_code == 2 and "model.tie_embeddings: the recipe asks for False" in result.output

    # Without the shape change the PE grows to TAPE, starts as the base model, and only TAPE's modules train.
    result = runner.invoke(app, ["finetune", "--checkpoint", str(base), "--recipe", str(ft), "--out",
                                 str(tmp_path / "ft"), "model.tie_embeddings=true", "train.lr=1e-2"])
    assert result.exit_code == 0, result.output
    before, after = weights(base), weights(tmp_path / "ft")
    assert {n for n in after if ".pe." in n} and all(torch.equal(before[n], after[n]) for n in before)
    assert any(not torch.equal(after[n], torch.zeros_like(after[n])) for n in after if "up_proj" in n and ".pe." in n)


def test_unmatched_freeze_pattern_is_an_error(tmp_path: Path, tiny_corpus: Path):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, train={"freeze": ["*"], "unfreeze": ["*.pe.*"]})
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "train.unfreeze: pattern '*.pe.*' matches no parameter" in result.output
