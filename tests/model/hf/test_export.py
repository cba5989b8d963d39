"""`tape export`: Hugging Face Llama directories that transformers opens with the same logits as tape (every RoPE
scaling, LoRA merged, tied or untied, with the tokenizer), and a one-line refusal for PEs transformers lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.tokenizer import ByteTokenizer
from tapecli.model import ModelConfig, Transformer
from tapecli.model.hf.export import export_hf
from tapecli.store.checkpoint import save_model
from tapecli.store.door import open_model

transformers = pytest.importorskip("transformers")
from hf_helpers import extended_checkpoint, make_hf_llama  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def base(tiny_hf_llama) -> Path:
    return tiny_hf_llama  # 2 KV heads, 32 positions; shared, read-only


def hf_logits(directory: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("scaling", ["pi", "yarn", "dynamic", "theta", "none"])
def test_lora_extension_exports_merged_with_equal_logits(base, tmp_path, scaling):
    checkpoint = extended_checkpoint(base, tmp_path / "ckpt", "lora", scaling)
    result = runner.invoke(app, ["export", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    opened = open_model(str(checkpoint), device="cpu")
    ours, tokenizer = opened.model, opened.tokenizer
    x = torch.randint(0, tokenizer.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = ours(x)
    assert torch.equal(hf_logits(tmp_path / "hf", x), expected)
    fast = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert fast.encode("the model reads", add_special_tokens=False) == tokenizer.encode("the model reads")
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == (tokenizer.bos_id, tokenizer.eos_id,
                                                                         tokenizer.pad_id)
    again = open_model(str(tmp_path / "hf"), device="cpu").model  # and tape imports its own export
    with torch.no_grad():
        assert torch.equal(again(x), expected)


@pytest.mark.parametrize("rope", [{"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                                  {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4, "beta_fast": 16.0,
                                   "original_max_position_embeddings": 8}])
def test_import_export_round_trip_keeps_the_scaling(tmp_path, rope):
    original = make_hf_llama(tmp_path / "a", rope=rope, tie=True, tokenizer="sp")
    opened = open_model(str(tmp_path / "a"), device="cpu")
    model, tokenizer = opened.model, opened.tokenizer
    export_hf(model, tokenizer, tmp_path / "b")
    x = torch.randint(0, 60, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(hf_logits(tmp_path / "b", x), original(x).logits)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["rope_parameters"]["rope_type"] == rope["rope_type"]
    tok = open_model(str(tmp_path / "b"), device="cpu").tokenizer
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)


def test_tape_pretrained_rope_exports_without_a_tokenizer_and_bf16(tmp_path):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, pe="rope", tie_embeddings=True,
                                    pe_args={"theta": 500.0})).eval()
    save_model(model, ByteTokenizer(), tmp_path / "ckpt")
    result = runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0 and "no tokenizer" in result.output
    assert "wrote a Hugging Face Llama (LlamaForCausalLM) to" in result.output
    x = torch.randint(0, 259, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(hf_logits(tmp_path / "hf", x), model(x))
    result = runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "bf"),
                                 "--dtype", "bfloat16"])
    assert result.exit_code == 0 and json.loads((tmp_path / "bf" / "config.json").read_text())["dtype"] == "bfloat16"
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf").dtype == torch.bfloat16


@pytest.mark.parametrize("pe_args", [{"frequency_fraction": 0.5}, {"hope": True}, {"fope": True}])
def test_rope_frequency_options_are_refused_in_one_line(tmp_path, pe_args):
    model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=1, n_heads=2, pe="rope", pe_args=pe_args))
    save_model(model, ByteTokenizer(), tmp_path / "ckpt")
    result = runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"pe_args.{next(iter(pe_args))}" in result.output and "no Hugging Face Llama equivalent" in result.output
    assert not (tmp_path / "hf").exists()


def test_every_rope_layer_s_own_hook_refuses_what_it_cannot_express():
    """RoPE's export hook refuses its frequency options, also in a RoPE layer after the first (whose entries are
    the ones exported)."""
    from tapecli.errors import TapeError
    from tapecli.model.hf.export import check_exportable

    config = ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, pe="rope", schedule={
        "pattern": ["rope", "local"], "kinds": {"local": {"window": 4, "pe_args": {"hope": True}}}})
    with pytest.raises(TapeError, match=r"^pe_args.hope: True has no Hugging Face Llama equivalent .*native"):
        check_exportable(Transformer(config))
    with pytest.raises(ValueError, match="pe_args.fope"):
        Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=1, n_heads=2, pe="rope",
                                pe_args={"fope": True})).model.pe.hf_export()


@pytest.mark.parametrize("pe", ["tape", "alibi", "fire", "xpos", "t5"])
def test_pes_without_a_llama_equivalent_are_refused_in_one_line(tmp_path, pe):
    model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=1, n_heads=2, pe=pe))
    save_model(model, ByteTokenizer(), tmp_path / "ckpt")
    result = runner.invoke(app, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"pe '{pe}' has no Hugging Face Llama equivalent" in result.output and "native checkpoint" in result.output
    assert not (tmp_path / "hf").exists()
