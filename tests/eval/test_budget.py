"""The long-context prompt budget (tapecli.eval.budget): the memory estimate term by term against a hand count, a
windowed layer's KV cache cut to its window, and the parameter count equal to the built model's."""

from __future__ import annotations

from tapecli.eval.budget import ATTENTION_BYTES, PROMPT_BYTES, estimate, parameters
from tapecli.model import ModelConfig, Transformer


def test_the_estimate_counts_what_generation_holds():
    config = ModelConfig(vocab_size=259, dim=32, n_layers=4, n_heads=4, n_kv_heads=2, max_seq_len=32,
                         schedule={"pattern": ["local", "global"], "kinds": {"local": {"window": 8}, "global": {}}})
    assert parameters(config) == sum(p.numel() for p in Transformer(config).parameters())
    got = estimate(config, tokens=1000, batch_size=3, dtype="bf16")
    per_token_layer = 2 * 2 * 8  # keys and values of 2 KV heads of width 8
    assert got["kv cache"] == 3 * 2 * (2 * per_token_layer * 8 + 2 * per_token_layer * 1000)  # 2 local, 2 global
    assert got["activations"] == 3 * 1000 * (8 * 32 + 4 * config.ffn_dim) * 2 + ATTENTION_BYTES
    assert got["prompt"] == 3 * 1000 * PROMPT_BYTES and got["weights"] == parameters(config) * 2
