"""The PEs and attention options added with the 2026 designs (attention sinks among them, also in a hybrid's local
layers), and a block layout other than Llama's (`model.block`) set in the recipe, train, checkpoint and resume bit for
bit: 4 steps in one go equal 2 steps, a crash right after the step-2 checkpoint, and `resume="auto"` (the recipe's
model keys and every new parameter saved and restored). Every built-in PE also trains in test_train.py (PE_NAMES)."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import Interrupted, assert_same_weights, crash_after_checkpoint, weights, write_recipe

from tapecli.recipe import load_recipe
from tapecli.store.door import open_model
from tapecli.train import engine

DESIGNS = {
    "clipped-rope": {"pe": "clipped-rope", "pe_args": {"clip_low_n": 3}},
    "output-gate": {"pe": "alibi", "output_gate": "elementwise"},
    "grape": {"pe": "grape", "pe_args": {"share_across_heads": False}},
    "grape-contextual": {"pe": "grape", "pe_args": {"contextual": True, "ctx_per_head": True}},
    "grape-noncommuting": {"pe": "grape", "pe_args": {"generators": "noncommuting", "learned_planes": True,
                                                      "share_across_heads": False}},
    "grape-ap": {"pe": "grape-ap", "pe_args": {"p_head_dim": 4}},
    "grape-a-gated": {"pe": "grape-ap", "pe_args": {"potential": "querykeygated"}},
    "liere": {"pe": "liere", "pe_args": {"per_head": True}},
    "comrope": {"pe": "comrope", "pe_args": {"variant": "ld", "block_size": 4}},
    "dape": {"pe": "dape", "pe_args": {"base": "alibi"}},
    "sinks": {"pe": "alibi", "sinks": True},
    "sinks-hybrid": {"pe": "rope", "schedule": {"pattern": ["local", "global"], "kinds": {
        "local": {"window": 8, "sinks": True}, "global": {"pe": "tape"}}}},
    "block": {"pe": "rope", "qk_norm": True, "block": {"norms": "sandwich", "norm": "layernorm",
                                                       "qk_norm": "projection", "activation": "gelu_tanh",
                                                       "embed_scale": True}},
    "dape-v2": {"pe": "dape", "pe_args": {"version": 2, "base": "fire"}},
}


@pytest.mark.parametrize("design", list(DESIGNS))
def test_trains_and_resumes_exactly(design: str, tmp_path: Path, tiny_corpus: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, model=DESIGNS[design],
                          train={"max_steps": 4, "save_every": 2, "eval_every": 0})
    whole = engine.pretrain(load_recipe(str(recipe)), tmp_path / "whole")
    crash_after_checkpoint(monkeypatch, 2)
    with pytest.raises(Interrupted):
        engine.pretrain(load_recipe(str(recipe)), tmp_path / "split")
    monkeypatch.undo()
    engine.pretrain(load_recipe(str(recipe)), tmp_path / "split", resume="auto")
    assert_same_weights(weights(whole), weights(tmp_path / "split"))
    model = open_model(whole).model
    for key, value in DESIGNS[design].items():
        assert getattr(model.config, key) == value
    names = {name for name, _ in model.named_parameters()}
    assert ("model.layers.0.self_attn.sinks" in names) == design.startswith("sinks")
    assert ("model.layers.0.pre_feedforward_layernorm.weight" in names) == (design == "block")  # sandwich norms
