"""Importing Hugging Face Llama checkpoints: logits equal transformers', tokenizers are the model's own, unsupported
configs fail in one line, hub ids fail offline with a sentence, and loading keeps one copy of the weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tapecli.data.tokenizer import load_tokenizer_dir
from tapecli.errors import TapeError
from tapecli.model.hf.hub import is_hf_source
from tapecli.store.door import open_model

transformers = pytest.importorskip("transformers")
from hf_helpers import make_hf_llama, sample_text  # noqa: E402

CASES = {
    "mha-untied": dict(),
    "gqa-tied": dict(n_kv_heads=2, tie=True),
    "gqa-head-dim": dict(n_kv_heads=2, head_dim=32),  # 4 heads x 32 != hidden 64
    "linear": dict(rope={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    "dynamic": dict(rope={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
    "yarn": dict(rope={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                       "original_max_position_embeddings": 16}),
    "llama3": dict(rope={"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, tokenizer="sp"),
    # transformers' Llama ignores partial_rotary_factor with rope_type default: every dim rotates, in tape too.
    "partial-ignored": dict(rope={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "legacy-theta": dict(legacy={"rope_theta": 50000.0}),
    "legacy-linear": dict(legacy={"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}}),
    "legacy-yarn": dict(legacy={"rope_theta": 10000.0, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_logits_equal_transformers(tmp_path, name):
    hf = make_hf_llama(tmp_path / "hf", **CASES[name])
    shards = list((tmp_path / "hf").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    model = open_model(str(tmp_path / "hf"), device="cpu").model
    x = torch.randint(0, 320, (2, 48), generator=torch.Generator().manual_seed(1))  # past max_pos=32: dynamic NTK
    with torch.no_grad():
        assert torch.equal(model(x), hf(x).logits)
    assert model.lm_head.weight is model.model.embed_tokens.weight if CASES[name].get("tie") else True


def test_bf16_load_and_gqa_shapes(tmp_path):
    make_hf_llama(tmp_path / "hf", n_kv_heads=2, tie=True)
    model = open_model(str(tmp_path / "hf"), device="cpu", dtype="bf16").model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (32, 64)
    assert not any(p.is_meta for p in model.parameters())
    assert model.model.pe.inv_freq.dtype == torch.float32  # frequencies are never rounded to bf16


def test_tokenizer_json_is_the_models_own(tmp_path):
    make_hf_llama(tmp_path / "hf")
    tok = open_model(str(tmp_path / "hf"), device="cpu").tokenizer
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = sample_text(3, seed=5)
    assert tok.encode(text) == fast.encode(text, add_special_tokens=False)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id)
    assert tok.decode(tok.encode(text)) == text
    tok.save(tmp_path / "saved")
    again = load_tokenizer_dir(tmp_path / "saved")
    assert (again.bos_id, again.eos_id, again.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)


def test_sentencepiece_tokenizer_and_config_ids(tmp_path):
    import sentencepiece as spm

    make_hf_llama(tmp_path / "hf", tokenizer="sp", extra={"bos_token_id": 1, "eos_token_id": [2, 3]})
    tok = open_model(str(tmp_path / "hf"), device="cpu").tokenizer
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "hf" / "tokenizer.model"))
    text = sample_text(2, seed=3)
    assert tok.encode(text) == sp.encode(text)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)  # no pad piece: pad = eos; first of several eos ids


@pytest.mark.parametrize("extra, key", [
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"sliding_window": 4096}, "sliding_window"),
    ({"architectures": ["PhiForCausalLM"]}, "architectures"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope' is not supported for "
                                                                         "LlamaForCausalLM"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters.factor is required for "
                                                                      "rope_type 'yarn'"),  # transformers refuses it
    # transformers' Llama cannot run these (its linear frequencies cover half a head, its rotation all of it)
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
])
def test_unsupported_config_is_one_line_naming_the_key(tmp_path, extra, key):
    make_hf_llama(tmp_path / "hf", tokenizer="none", extra=extra)
    with pytest.raises(TapeError, match=key) as info:
        open_model(str(tmp_path / "hf"), device="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("source", ["meta-llama/Llama-2-7b-hf", "llama2-7b"])
def test_hub_id_offline_says_to_pass_a_directory(source):
    with pytest.raises(TapeError, match=r"the hub cannot be reached; pass --model DIR \(a local Hugging Face model "
                                        r"directory"):
        open_model(source, device="cpu")


def test_is_hf_source(tmp_path):
    make_hf_llama(tmp_path / "hf", tokenizer="none")
    assert is_hf_source(str(tmp_path / "hf"))
    assert is_hf_source("meta-llama/Llama-2-7b-hf") and is_hf_source("llama2-7b") and is_hf_source("TinyLlama")
    (tmp_path / "hf" / "model_config.json").write_text("{}")  # a tape checkpoint is not a HF source
    assert not is_hf_source(str(tmp_path / "hf"))
    assert not is_hf_source(str(tmp_path)) and not is_hf_source("byte")
    (tmp_path / "some.yaml").write_text("")
    assert not is_hf_source(str(tmp_path / "some.yaml"))


_PEAK_SCRIPT = """
import sys, torch
from tapecli.store.door import open_model
import tapecli.model.transformer, safetensors.torch, tokenizers

def status(key):  # kB values of /proc/self/status
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":")) * 1024

from tapecli.model.hf.load import build_on_meta, hf_model_config, read_hf_config
from pathlib import Path
build_on_meta(hf_model_config(read_hf_config(Path(sys.argv[1]))))  # warm up: code pages, not weights
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current resident size
before = status("VmRSS")
model = open_model(sys.argv[1], device="cpu", dtype={"float32": "fp32", "bfloat16": "bf16"}[sys.argv[2]]).model
size = sum(p.numel() * p.element_size() for p in model.parameters())
print(status("VmHWM") - before, size)
"""


@pytest.fixture(scope="module")
def larger_hf_llama(tmp_path_factory) -> Path:
    """~34M parameters (135 MB in fp32) in 20 MB shards, saved once for both dtypes; read-only."""
    directory = tmp_path_factory.mktemp("larger") / "hf"
    make_hf_llama(directory, dim=512, n_layers=8, ffn=1376, vocab=8192, tokenizer="json", shard="20MB")
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_peak_memory_of_loading_is_one_copy(larger_hf_llama, dtype):
    # A second full copy of the weights would double the growth.
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(larger_hf_llama), dtype], check=True,
                         capture_output=True, text=True).stdout.split()
    grown, size = int(out[0]), int(out[1])
    print(f"loading a {size / 2**20:.0f} MiB {dtype} model grew peak RSS by {grown / 2**20:.0f} MiB")
    assert grown < size + 30 * 2**20  # the model itself + one 20 MB shard mapped while it is read


def test_weights_must_fit_config(tmp_path):
    make_hf_llama(tmp_path / "hf", tokenizer="json")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["intermediate_size"] = 128
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(TapeError, match="mlp.*shape"):
        open_model(str(tmp_path / "hf"), device="cpu")


def test_every_short_name_is_in_the_help():
    from tapecli.cli.train import _BASE_HELP
    from tapecli.model.hf.hub import SHORT_NAMES

    assert all(f" {name}," in _BASE_HELP or f" {name}." in _BASE_HELP for name in SHORT_NAMES)
