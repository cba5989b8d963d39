"""Hugging Face hybrids in and out: Mistral, Qwen2 and Qwen3 with sliding windows, SmolLM3 with NoPE layers, Qwen3's
QK-norm, OLMo 2's post-norm block with QK-norm over the whole projections, OLMo 3's with sliding layers and YaRN on
its full layers only, Gemma 3's sandwich block with local and global RoPE per layer type, Cohere2's parallel block
on one LayerNorm with sliding RoPE and full NoPE layers, interleaved RoPE pairs and a logit scale, EXAONE 4's
post-norms with per-head QK-norm and sliding RoPE : full NoPE layers. Tiny models built with transformers' own
classes and `save_pretrained`, opened through the door: logits equal transformers' (fp32), greedy KV-cached
generation past the window equals transformers' `generate`, and the export opens in transformers with the same
logits and the same layer semantics in its config. Other architectures (each naming the nearest supported one) and
keys transformers would run differently are refused in one line naming them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tapecli.errors import TapeError
from tapecli.model.hf.export import export_hf
from tapecli.model.schedule import describe
from tapecli.store.door import open_model

transformers = pytest.importorskip("transformers")
from hf_helpers import VOCAB, make_hf_model  # noqa: E402

WINDOW = 6
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},  # as Gemma 3 4B's
               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
# name: (class, config keys, what tape makes of it: describe(layers))
CASES = {
    "mistral-window": ("MistralForCausalLM", dict(sliding_window=WINDOW), "rope (window 6)"),
    "qwen2-window-suffix": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                     max_window_layers=2), "rope x2 + rope x2 (window 6)"),
    "qwen2-no-window": ("Qwen2ForCausalLM", dict(), "rope"),
    "qwen2-layer-types": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, layer_types=[
        "sliding_attention", "full_attention"] * 2), "rope x2 (window 6) + rope x2"),
    "qwen2-without-layer-types": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                           max_window_layers=1, drop=("layer_types",)),
                                  "rope x1 + rope x3 (window 6)"),
    "qwen3-window": ("Qwen3ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=3,
                                              head_dim=32, tie_word_embeddings=True), "rope x3 + rope x1 (window 6)"),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16), "rope"),
    "smollm3": ("SmolLM3ForCausalLM", dict(), "rope x3 + nope x1"),
    "smollm3-no-rope-list": ("SmolLM3ForCausalLM", dict(no_rope_layers=[0, 1, 1, 0], tie_word_embeddings=True),
                             "nope x2 + rope x2"),
    "smollm3-window": ("SmolLM3ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                  no_rope_layer_interval=2), "rope x2 + nope x2 (window 6)"),
    "smollm3-layer-types": ("SmolLM3ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, layer_types=[
        "sliding_attention", "sliding_attention", "full_attention", "full_attention"]),
                            "rope x2 (window 6) + rope x1 + nope x1"),
    "olmo2": ("Olmo2ForCausalLM", dict(), "rope"),
    "olmo2-linear-tied": ("Olmo2ForCausalLM", dict(rope_parameters={"rope_type": "linear", "factor": 4.0,
                                                                    "rope_theta": 500.0},
                                                   tie_word_embeddings=True, num_key_value_heads=4), "rope"),
    "gemma3": ("Gemma3ForCausalLM", dict(num_hidden_layers=6, head_dim=16, sliding_window=WINDOW,
                                         query_pre_attn_scalar=24, rope_parameters=GEMMA3_ROPE),
               "rope x5 (window 6) + rope x1"),
    "gemma3-tied-all-sliding": ("Gemma3ForCausalLM", dict(head_dim=32, sliding_window=WINDOW,
                                                          tie_word_embeddings=True), "rope (window 6)"),
    "olmo3": ("Olmo3ForCausalLM", dict(sliding_window=WINDOW), "rope x3 (window 6) + rope x1"),
    "olmo3-yarn-on-full-layers": ("Olmo3ForCausalLM", dict(sliding_window=WINDOW, rope_parameters={
        "full_attention": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 5e5, "attention_factor": 1.2,
                           "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                           "truncate": True},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}}), "rope x3 (window 6) + rope x1"),
    "exaone4": ("Exaone4ForCausalLM", dict(sliding_window=WINDOW), "rope x3 (window 6) + nope x1"),
    "exaone4-no-window": ("Exaone4ForCausalLM", dict(sliding_window=None, layer_types=["full_attention"] * 4,
                                                     tie_word_embeddings=True), "rope"),
    "cohere2": ("Cohere2ForCausalLM", dict(sliding_window=WINDOW, logit_scale=0.25), "rope x3 (window 6) + nope x1"),
    "cohere2-tied-theta": ("Cohere2ForCausalLM", dict(sliding_window=WINDOW, tie_word_embeddings=True,
                                                      num_hidden_layers=8, rope_parameters={"rope_type": "default",
                                                                                            "rope_theta": 500.0}),
                           "rope x6 (window 6) + nope x2"),
}
LAYER_KEYS = ("layer_types", "sliding_window", "no_rope_layers", "num_key_value_heads", "use_sliding_window",
              "tie_word_embeddings")


def build(tmp_path: Path, name: str):
    arch, config, _ = CASES[name]
    config = dict(config)
    drop = config.pop("drop", ())
    return make_hf_model(tmp_path / name, arch, drop=drop, **config)


def hf_greedy(hf, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """transformers' greedy `generate` of exactly n tokens (no stop at EOS: tape's generate stops only when asked)."""
    hf.generation_config.eos_token_id = None
    return hf.generate(prompt, max_new_tokens=n, do_sample=False)


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CASES))
def test_logits_generation_and_export_equal_transformers(tmp_path, name):
    hf = build(tmp_path, name)
    opened = open_model(str(tmp_path / name), device="cpu")
    model = opened.model
    assert describe(model.config.layers()) == CASES[name][2]
    x = tokens(2, 40)
    with torch.no_grad():
        expected = hf(x).logits
        torch.testing.assert_close(model(x), expected, rtol=0, atol=2e-5)
    # Greedy decoding through the KV cache, 20 tokens past a 4-token prompt: far past the window of 6.
    prompt = tokens(2, 4, seed=2)
    ours = model.generate(prompt, 20)
    theirs = hf_greedy(hf, prompt, 20)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours, model.generate(prompt, 20, use_cache=False))
    export_hf(model, opened.tokenizer, tmp_path / "out")
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(again) is type(hf)
    with torch.no_grad():
        assert torch.equal(again(x).logits, expected)  # the same weights in the same class: bit for bit
    source = transformers.AutoConfig.from_pretrained(tmp_path / name)
    exported = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    for key in LAYER_KEYS:
        assert getattr(exported, key, None) == getattr(source, key, None), key
    reopened = open_model(str(tmp_path / "out"), device="cpu").model  # and tape imports its own export
    assert reopened.config.to_dict() == model.config.to_dict()


def test_layouts_read_as_schedules(tmp_path):
    build(tmp_path, "smollm3-window")
    config = open_model(str(tmp_path / "smollm3-window"), device="cpu").model.config
    assert (config.pe, config.window) == ("rope", None)
    assert config.schedule == {"layers": ["global", "nope_local", "global", "nope_local"],
                               "kinds": {"global": {}, "nope_local": {"pe": "nope", "window": WINDOW}}}
    build(tmp_path, "mistral-window")
    config = open_model(str(tmp_path / "mistral-window"), device="cpu").model.config
    assert (config.window, config.schedule, config.qk_norm, config.qkv_bias) == (WINDOW, {}, False, False)
    build(tmp_path, "qwen3")
    model = open_model(str(tmp_path / "qwen3"), device="cpu").model
    assert (model.config.qk_norm, model.config.qkv_bias) == (True, False)
    assert model.model.layers[0].self_attn.q_norm.weight.shape == (16,)
    build(tmp_path, "olmo2")
    model = open_model(str(tmp_path / "olmo2"), device="cpu").model
    assert (model.config.qk_norm, model.config.block) == (True, {"norms": "post", "qk_norm": "projection"})
    layer = model.model.layers[0]
    assert (layer.self_attn.q_norm.weight.shape, layer.self_attn.k_norm.weight.shape) == ((64,), (32,))
    assert not hasattr(layer, "input_layernorm") and layer.post_feedforward_layernorm.weight.shape == (64,)
    build(tmp_path, "gemma3")
    config = open_model(str(tmp_path / "gemma3"), device="cpu").model.config
    assert (config.pe_args, config.qk_norm) == ({"theta": 1e4}, True)
    assert config.schedule == {"layers": ["local"] * 5 + ["global"], "kinds": {
        "local": {"window": WINDOW},
        "global": {"pe_args": {"theta": 1e6, "scaling": "linear", "factor": 8.0, "original_max_len": 64}}}}
    assert config.block == {"norms": "sandwich", "norm_weight": "1+w", "activation": "gelu_tanh", "embed_scale": True,
                            "query_pre_attn_scalar": 24}


def test_mistral_without_window_exports_as_llama(tmp_path):
    hf = make_hf_model(tmp_path / "m", "MistralForCausalLM", sliding_window=None)
    opened = open_model(str(tmp_path / "m"), device="cpu")
    export_hf(opened.model, opened.tokenizer, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    x = tokens(1, 24)
    with torch.no_grad():
        again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        assert torch.equal(again(x).logits, hf(x).logits)


def test_prefill_in_chunks_past_the_window_equals_transformers(tmp_path):
    hf = build(tmp_path, "smollm3-window")
    model = open_model(str(tmp_path / "smollm3-window"), device="cpu").model
    prompt = tokens(1, 17, seed=3)
    theirs = hf_greedy(hf, prompt, 8)
    assert torch.equal(model.generate(prompt, 8, prefill_chunk=5), theirs)


@pytest.mark.parametrize("arch, config, edit, message", [
    ("Gemma3ForCausalLM", dict(head_dim=16, sliding_window=WINDOW, final_logit_softcapping=30.0), {},
     "final_logit_softcapping=30.0 is not supported for Gemma3ForCausalLM"),
    ("Gemma3ForCausalLM", dict(head_dim=16, sliding_window=WINDOW), {"hidden_activation": "gelu"},
     "hidden_activation='gelu' is not supported for Gemma3ForCausalLM"),
    ("Olmo3ForCausalLM", dict(sliding_window=WINDOW, attention_bias=True), {},
     "attention_bias=True is not supported for Olmo3ForCausalLM"),
    ("Olmo2ForCausalLM", dict(attention_bias=True), {}, "attention_bias=True is not supported for Olmo2ForCausalLM"),
    ("Olmo2ForCausalLM", dict(), {"sliding_window": 4}, "sliding_window=4 is not supported for Olmo2ForCausalLM"),
    ("Cohere2ForCausalLM", dict(sliding_window=WINDOW, attention_bias=True), {},
     "attention_bias=True is not supported for Cohere2ForCausalLM"),
    ("Qwen3ForCausalLM", dict(attention_bias=True), {}, "attention_bias=True is not supported for Qwen3ForCausalLM"),
    ("SmolLM3ForCausalLM", dict(mlp_bias=True), {}, "mlp_bias=True is not supported for SmolLM3ForCausalLM"),
    ("Qwen2ForCausalLM", dict(), {"layer_types": ["sliding_attention"] * 4},
     "layer_types names sliding_attention layers but sliding_window is null (use_sliding_window is false)"),
    ("SmolLM3ForCausalLM", dict(sliding_window=WINDOW), {"layer_types": ["sliding_attention"] * 4},
     "layer_types names sliding_attention layers but use_sliding_window is false"),
    ("MistralForCausalLM", dict(sliding_window=WINDOW), {"layer_types": ["full_attention"] * 4},
     "layer_types disagrees with sliding_window=6"),
    ("SmolLM3ForCausalLM", dict(), {"no_rope_layers": [1, 0]}, "no_rope_layers must list 1 (RoPE) or 0 (NoPE) for "
                                                               "each of the 4 layers"),
    ("Qwen2ForCausalLM", dict(), {"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
])
def test_unsupported_is_one_line_naming_the_key(tmp_path, arch, config, edit, message):
    make_hf_model(tmp_path / "hf", arch, **config)
    if edit:
        path = tmp_path / "hf" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(TapeError) as info:
        open_model(str(tmp_path / "hf"), device="cpu")
    assert message in str(info.value) and "config.json" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("keys, message", [
    (dict(temperature=0.9), "model.temperature: attention temperatures and length scales do not export"),
    (dict(schedule={"layers": ["a", "b"], "kinds": {"a": {"window": 4}, "b": {"window": 8}}}),
     "model.schedule: windows of 2 sizes (4, 8)"),
    (dict(schedule={"pattern": ["rope", "nope"]}, qk_norm=True), "NoPE layers with qk_norm or qkv_bias"),
    (dict(schedule={"pattern": ["rope", "local"], "kinds": {"local": {"pe_args": {"theta": 100.0}}}}),
     "RoPE layers with different pe_args"),
    (dict(schedule={"pattern": ["rope", "alibi"]}), "pe 'alibi' has no Hugging Face Llama equivalent"),
    (dict(qk_norm=True, block={"qk_norm": "projection"}), "is the block of no supported Hugging Face architecture"),
    (dict(block={"norms": "post", "qk_norm": "projection"}), "Olmo2ForCausalLM runs it with QK-norm"),
    (dict(block={"norms": "parallel", "norm": "layernorm"}, schedule={"pattern": ["rope", "nope"]}),
     "Cohere2ForCausalLM runs it with RoPE in the sliding layers and NoPE in the full ones"),
    (dict(qk_norm=True, schedule={"pattern": ["rope", "nope"]}, block={"norms": "post", "qk_norm": "projection"}),
     "Olmo2ForCausalLM runs it with QK-norm, without q/k/v biases, NoPE layers or windows only"),
    (dict(qk_norm=True, schedule={"pattern": ["local", "nope"], "kinds": {"local": {"window": 4}}},
          block={"norms": "post", "qk_norm": "projection"}),
     "Olmo3ForCausalLM runs it with QK-norm, without q/k/v biases or NoPE layers only"),
    (dict(pe_args={"scaling": "yarn", "factor": 2.0, "partial_rotary_factor": 0.5}),
     "model.pe_args.scaling: 'yarn' with partial_rotary_factor exports to no supported class"),
    (dict(pe_args={"partial_rotary_factor": 0.5}, qk_norm=True),
     "model.pe_args: partial_rotary_factor exports only as a Phi3"),
    (dict(pe_args={"scaling": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
                   "original_max_len": 16}, schedule={"pattern": ["rope", "nope"]}),
     "model.pe_args: scaling longrope exports only as a Phi3"),
])
def test_layouts_no_class_runs_are_refused_in_one_line(tmp_path, keys, message):
    from tapecli.data.tokenizer import ByteTokenizer
    from tapecli.model import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, pe="rope", **keys))
    with pytest.raises(TapeError) as info:
        export_hf(model, ByteTokenizer(), tmp_path / "out")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_tape_model_with_a_schedule_exports_as_smollm3(tmp_path):
    """A model trained in tape with NoPE layers and windowed layers runs in transformers as a SmolLM3."""
    from tapecli.data.tokenizer import ByteTokenizer
    from tapecli.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=4, n_heads=2, pe="rope", pe_args={"theta": 500.0},
                                    schedule={"pattern": ["local", "local", "local", "nope"],
                                              "kinds": {"local": {"window": 5}}})).eval()
    from typer.testing import CliRunner

    from tapecli.cli import app
    from tapecli.store.checkpoint import save_model

    save_model(model, ByteTokenizer(), tmp_path / "ckpt")
    result = CliRunner().invoke(app, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0 and "wrote a Hugging Face SmolLM3 (SmolLM3ForCausalLM) to" in result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf).__name__ == "SmolLM3ForCausalLM"
    assert hf.config.no_rope_layers == [1, 1, 1, 0] and hf.config.sliding_window == 5
    x = torch.randint(0, 259, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x), rtol=0, atol=2e-5)


GRID = [dict(use_sliding_window=use, sliding_window=window, max_window_layers=first)
        for use in (False, True) for window in (None, 3) for first in (0, 2, 5)]


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "SmolLM3ForCausalLM"])
@pytest.mark.parametrize("drop_layer_types", [False, True], ids=["as-written", "without-layer_types"])
def test_every_window_layout_transformers_writes_reads_as_its_modeling_code_runs_it(arch, drop_layer_types):
    """Configs only (no weights): for each use_sliding_window x sliding_window x max_window_layers (and, for SmolLM3,
    NoPE intervals), the config.json transformers writes -- and the same without layer_types, as 4.x wrote it --
    gives each layer the window and RoPE that transformers' modeling code gives it (its `layer_types`, its
    `sliding_window`, SmolLM3's `no_rope_layers`)."""
    from tapecli.model.hf.load import hf_model_config

    cls = getattr(transformers, arch).config_class
    grid = GRID if arch != "SmolLM3ForCausalLM" else [
        {**keys, "no_rope_layer_interval": interval} for keys in GRID for interval in (2, 4)]
    for keys in grid:
        config = cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, **keys)
        written = {**json.loads(config.to_json_string()), "architectures": [arch]}
        if drop_layer_types:
            written.pop("layer_types")
        expected_windows = [config.sliding_window if kind == "sliding_attention" else None
                            for kind in config.layer_types]
        expected_rope = [bool(r) for r in getattr(config, "no_rope_layers", [1] * 4)]
        if "sliding_attention" in config.layer_types and config.sliding_window is None:
            continue  # transformers cannot build such a model (its cache needs the window): refused, tested above
        layers = hf_model_config(written).layers()
        assert [spec.window for spec in layers] == expected_windows, keys
        assert [spec.pe == "rope" for spec in layers] == expected_rope, keys


@pytest.mark.parametrize("arch, nearest", [
    ("Gemma3nForCausalLM", "Gemma3ForCausalLM"), ("OlmoForCausalLM", "Olmo2ForCausalLM"),
    ("PhiForCausalLM", "Phi3ForCausalLM"), ("PhimoeForCausalLM", "Phi3ForCausalLM"),
    ("Qwen3MoeForCausalLM", "Qwen3ForCausalLM"), ("GptOssForCausalLM", "MistralForCausalLM"),
    ("Llama4ForCausalLM", "LlamaForCausalLM"),
])
def test_unmapped_families_are_refused_naming_the_nearest_supported(arch, nearest):
    """The config.json transformers writes for each family tape does not map: one line naming the nearest one."""
    from tapecli.model.hf.load import hf_model_config

    cls = getattr(transformers, arch).config_class
    written = {**json.loads(cls(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                                num_key_value_heads=2).to_json_string()), "architectures": [arch]}
    with pytest.raises(TapeError) as info:
        hf_model_config(written)
    message = str(info.value)
    assert f"architectures ['{arch}'] is not supported; the nearest supported is {nearest}" in message
    assert "\n" not in message


@pytest.mark.parametrize("block, message", [
    ({"norm_kind": "post"}, "model.block.norm_kind: unknown key; allowed: norms, qk_norm, norm, norm_weight"),
    ({"norms": "serial"}, "model.block.norms: 'serial' is not one of pre, post, sandwich, parallel"),
    ({"embed_scale": 1}, "model.block.embed_scale: expected true or false, got 1"),
    ({"query_pre_attn_scalar": 0}, "model.block.query_pre_attn_scalar: expected a positive number or null, got 0"),
    ({"norm": "rms_norm"}, "model.block.norm: 'rms_norm' is not one of rms, layernorm"),
    ({"logit_scale": -1}, "model.block.logit_scale: expected a positive number, got -1"),
    ({"qk_norm": "heads"}, "model.block.qk_norm: 'heads' is not one of head, projection"),
])
def test_block_keys_are_checked(block, message):
    from tapecli.model import ModelConfig

    with pytest.raises(ValueError, match=message):
        ModelConfig(vocab_size=64, dim=32, n_layers=1, n_heads=2, block=block)
