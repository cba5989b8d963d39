"""Phi-3 / Phi-3.5 / Phi-4-mini in and out, with LongRoPE. Tiny random Phi3ForCausalLM models built with transformers
and saved with `save_pretrained` (Phi-3-style LongRoPE, Phi-4-mini-style LongRoPE with a partial rotary of 0.75 and
tied embeddings, and one without rope_scaling) open through the door: logits equal transformers' in fp32 on inputs
shorter and longer than `original_max_position_embeddings` (the short and the long factors), greedy KV-cached
generation equals transformers' `generate` across the switch (its cache re-encoded as Phi3's generation does) and
from a prompt already past it, and the export (fused qkv_proj / gate_up_proj again) opens in transformers with the
same logits and in tape as the same model. LongRoPE itself is checked against transformers'
`_compute_longrope_parameters` in tests/model/test_rope_scaling.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tapecli.errors import TapeError
from tapecli.model.hf.export import export_hf
from tapecli.store.door import open_model

transformers = pytest.importorskip("transformers")
from hf_helpers import VOCAB, make_hf_model  # noqa: E402

ORIGINAL = 16  # original_max_position_embeddings: the switch from the short to the long factors
SHORT, LONG = 12, 40  # input lengths on each side of it (max_position_embeddings 64)
HEAD = 16  # head_dim of make_hf_model's models: hidden 64, 4 heads
CASES = {
    "phi3-longrope": dict(original_max_position_embeddings=ORIGINAL, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(HEAD // 2)],
        "long_factor": [1.0 + 0.75 * i for i in range(HEAD // 2)]}),
    "phi4-mini-partial": dict(original_max_position_embeddings=ORIGINAL, partial_rotary_factor=0.75,
                              tie_word_embeddings=True, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(6)],
        "long_factor": [2.0 + i for i in range(6)]}),
    "phi3-no-scaling": dict(),
}
EXPORTED_AS = {"phi3-longrope": "Phi3ForCausalLM", "phi4-mini-partial": "Phi3ForCausalLM",
               "phi3-no-scaling": "LlamaForCausalLM"}  # the same computation; Llama's class runs it


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_greedy(hf, prompt: torch.Tensor, n: int) -> torch.Tensor:
    hf.generation_config.eos_token_id = None
    return hf.generate(prompt, max_new_tokens=n, do_sample=False)


@pytest.fixture(scope="module")
def phi(tmp_path_factory):
    """name -> (the transformers model, its directory), each built once."""
    root = tmp_path_factory.mktemp("phi3")
    return {name: (make_hf_model(root / name, "Phi3ForCausalLM", **config), root / name)
            for name, config in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_logits_generation_and_export_equal_transformers(phi, tmp_path, name):
    hf, directory = phi[name]
    opened = open_model(str(directory), device="cpu")
    model = opened.model
    for length in (SHORT, LONG):
        x = tokens(2, length)
        with torch.no_grad():
            torch.testing.assert_close(model(x), hf(x).logits, rtol=0, atol=1e-4)
    # Greedy through the KV cache from a short prompt across the switch (10 + 20 > 16), and from a long prompt.
    for prompt in (tokens(2, 10, seed=2), tokens(1, 20, seed=3)):
        ours = model.generate(prompt, 20)
        assert torch.equal(ours, hf_greedy(hf, prompt, 20))
        assert torch.equal(ours, model.generate(prompt, 20, use_cache=False))
    export_hf(model, opened.tokenizer, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [EXPORTED_AS[name]]
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    for length in (SHORT, LONG):
        x = tokens(2, length)
        with torch.no_grad():
            assert torch.equal(again(x).logits, hf(x).logits)  # the same weights and RoPE: bit for bit
    if EXPORTED_AS[name] == "Phi3ForCausalLM":
        assert "qkv_proj" in json.dumps(sorted(again.state_dict())) and again.config.original_max_position_embeddings \
            == ORIGINAL
        assert torch.equal(hf_greedy(again, tokens(2, 10, seed=2), 20), model.generate(tokens(2, 10, seed=2), 20))
    reopened = open_model(str(tmp_path / "out"), device="cpu").model
    assert reopened.config.to_dict() == model.config.to_dict()


def test_what_tape_makes_of_phi_configs(phi):
    config = open_model(str(phi["phi4-mini-partial"][1]), device="cpu").model.config
    assert config.pe_args == {"theta": 1e4, "partial_rotary_factor": 0.75, "scaling": "longrope",
                              "original_max_len": ORIGINAL, "short_factor": CASES["phi4-mini-partial"][
                                  "rope_scaling"]["short_factor"], "long_factor": [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}
    growth = 64 / ORIGINAL  # max_position_embeddings / original: transformers' attention factor, computed the same
    pe = open_model(str(phi["phi4-mini-partial"][1]), device="cpu").model.model.pe
    assert pe.attention_factor == math.sqrt(1 + math.log(growth) / math.log(ORIGINAL))
    assert (config.tie_embeddings, config.window, config.block, config.qk_norm) == (True, None, {}, False)
    layer = open_model(str(phi["phi3-longrope"][1]), device="cpu").model.model.layers[0]
    assert layer.self_attn.q_proj.weight.shape == (64, 64) and layer.self_attn.k_proj.weight.shape == (32, 64)
    assert layer.mlp.gate_proj.weight.shape == layer.mlp.up_proj.weight.shape == (96, 64)


def test_a_sliding_window_and_legacy_rope_types_read_as_phi3config_reads_them(tmp_path):
    """Phi-3-mini-4k's sliding_window slides every layer (as Mistral's); a legacy rope_scaling type su (or yarn)
    is LongRoPE to Phi3Config, and its original length is the top-level key."""
    hf = make_hf_model(tmp_path / "w", "Phi3ForCausalLM", sliding_window=6)
    model = open_model(str(tmp_path / "w"), device="cpu").model
    assert model.config.window == 6
    x = tokens(2, 30)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, rtol=0, atol=1e-4)
    assert torch.equal(model.generate(tokens(1, 4), 16), hf_greedy(hf, tokens(1, 4), 16))
    export_hf(model, open_model(str(tmp_path / "w"), device="cpu").tokenizer, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]
    hf = make_hf_model(tmp_path / "su", "Phi3ForCausalLM", **CASES["phi3-longrope"])
    path = tmp_path / "su" / "config.json"
    written = json.loads(path.read_text())
    params = written.pop("rope_parameters")
    legacy = {"type": "su", "short_factor": params["short_factor"], "long_factor": params["long_factor"]}
    path.write_text(json.dumps({**written, "rope_scaling": legacy, "rope_theta": 1e4}))
    model = open_model(str(tmp_path / "su"), device="cpu").model
    assert model.config.pe_args["scaling"] == "longrope" and model.config.pe_args["original_max_len"] == ORIGINAL
    x = tokens(1, LONG)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["rope_parameters"].update(short_factor=[1.0, 1.0]),
     "config.json: rope_parameters.short_factor: expected a list of 8 numbers (one per rotary frequency"),
    (lambda c: c["rope_parameters"].update(long_factor=[1.0] * 7 + [0.0]),
     "config.json: rope_parameters.long_factor: every factor must be a finite number > 0, got 0.0"),
    (lambda c: c["rope_parameters"].pop("long_factor"), "config.json: missing key long_factor"),
    (lambda c: c.update(hidden_act="gelu_new"), "config.json: hidden_act='gelu_new' is not supported"),
])
def test_bad_phi_configs_are_one_line(tmp_path, edit, message):
    make_hf_model(tmp_path / "hf", "Phi3ForCausalLM", **CASES["phi3-longrope"])
    path = tmp_path / "hf" / "config.json"
    written = json.loads(path.read_text())
    edit(written)
    path.write_text(json.dumps(written))
    with pytest.raises(TapeError) as info:
        open_model(str(tmp_path / "hf"), device="cpu")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_fused_weight_of_the_wrong_size_names_its_file(tmp_path):
    from safetensors.torch import load_file, save_file

    make_hf_model(tmp_path / "hf", "Phi3ForCausalLM")
    file = tmp_path / "hf" / "model.safetensors"
    state = load_file(str(file))
    state["model.layers.1.self_attn.qkv_proj.weight"] = state["model.layers.1.self_attn.qkv_proj.weight"][:100]
    save_file(state, str(file), metadata={"format": "pt"})
    with pytest.raises(TapeError, match=r"model.safetensors: model.layers.1.self_attn.qkv_proj.weight has shape "
                                        r"\(100, 64\), config.json implies 128 rows \(64 \+ 32 \+ 32: q_proj, k_proj, "
                                        r"v_proj\)$"):
        open_model(str(tmp_path / "hf"), device="cpu")


def test_a_tape_trained_longrope_model_exports_as_phi3(tmp_path):
    """LongRoPE set in a recipe (not imported) exports as a Phi3 whose logits equal tape's on both sides of the
    switch, the default attention factor written out."""
    from tapecli.data.tokenizer import ByteTokenizer
    from tapecli.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, pe="rope", max_seq_len=48,
                                    pe_args={"scaling": "longrope", "original_max_len": 16,
                                             "short_factor": [1.0, 1.2, 1.5, 2.0, 1.0, 1.1, 1.0, 1.3],
                                             "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]})).eval()
    export_hf(model, ByteTokenizer(), tmp_path / "out")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf).__name__ == "Phi3ForCausalLM"
    assert hf.model.rotary_emb.attention_scaling == pytest.approx(math.sqrt(1 + math.log(3) / math.log(16)))
    for length in (10, 40):
        x = torch.randint(0, 259, (2, length), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(hf(x).logits, model(x), rtol=0, atol=1e-5)



@pytest.mark.parametrize("extra", [{}, {"factor": 8.0}, {"factor": 0.5}, {"attention_factor": 1.3},
                                   {"factor": 1.0, "attention_factor": 0.9}])
def test_longrope_attention_factor_is_transformers_for_every_way_config_json_gives_it(extra):
    """Config only: the attention factor tape's imported RoPE computes equals Phi3's rotary embedding's."""
    from tapecli.model import Transformer
    from tapecli.model.hf.load import hf_model_config

    rope = {**CASES["phi3-longrope"]["rope_scaling"], **extra}
    config = transformers.Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                     num_attention_heads=4, max_position_embeddings=64,
                                     original_max_position_embeddings=ORIGINAL, rope_scaling=rope, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2)
    theirs = transformers.Phi3ForCausalLM(config).model.rotary_emb.attention_scaling
    written = {**json.loads(config.to_json_string()), "architectures": ["Phi3ForCausalLM"]}
    with torch.device("meta"):
        ours = Transformer(hf_model_config(written)).model.pe.attention_factor
    assert ours == theirs
