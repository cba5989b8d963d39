"""tapecli.store.door: every source kind opens to the model its files describe (weights, config, tokenizer), found
without loading anything; updates (recipe keys, a grown PE, --pe-arg) and errors in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from numerics import assert_close_to_rounding
from safetensors.torch import load_file

from tapecli.data.tokenizer import ByteTokenizer, load_tokenizer_dir, tokenizer_fingerprint
from tapecli.errors import TapeError
from tapecli.model import ModelConfig, Transformer
from tapecli.model.hf.hub import is_hf_source
from tapecli.model.hf.load import hf_model_config, read_hf_config
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import save_model
from tapecli.store.door import find_source, open_model
from tapecli.train.extend import plan_extension

IDS = torch.tensor([[1, 2, 3, 4, 5]])


def tiny(pe: str = "rope", **pe_args) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, max_seq_len=32, pe=pe,
                                   pe_args=pe_args)).eval()


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with two checkpoints; the newer one holds a different model."""
    save_model(tiny(), ByteTokenizer(), tmp_path / "run" / "checkpoints" / "step-00000001")
    model = tiny()
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    save_model(model, ByteTokenizer(), tmp_path / "run" / "checkpoints" / "step-00000002")
    return tmp_path / "run", model


def assert_opens_as_saved(opened, checkpoint: Path) -> None:
    """The opened model holds exactly the checkpoint's tensors, config and tokenizer."""
    saved = load_file(str(checkpoint / "model.safetensors"))
    state = opened.model.state_dict()
    assert set(state) - set(saved) <= {"lm_head.weight"}
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    assert opened.model.config.to_dict() == json.loads((checkpoint / "model_config.json").read_text())
    assert tokenizer_fingerprint(opened.tokenizer) == tokenizer_fingerprint(load_tokenizer_dir(checkpoint /
                                                                                               "tokenizer"))


def test_a_run_opens_its_newest_checkpoint_and_a_checkpoint_itself(run_dir):
    run, newest = run_dir
    source = find_source(str(run))
    assert (source.kind, source.name, source.base) == ("tape", "run", None)
    assert source.location == str((run / "checkpoints" / "step-00000002").resolve())
    opened = open_model(str(run), device="cpu")
    assert opened.kind == "tape" and opened.dtype == "fp32" and opened.name == "run" and not opened.model.training
    assert opened.source == source.location
    assert_opens_as_saved(opened, run / "checkpoints" / "step-00000002")
    torch.testing.assert_close(opened.model(IDS), newest(IDS), rtol=0, atol=0)

    older = open_model(str(run / "checkpoints" / "step-00000001"), device="cpu", dtype="bf16")
    assert older.name == "run/step-00000001" and {p.dtype for p in older.model.parameters()} == {torch.bfloat16}
    assert older.record() == {"name": "run/step-00000001", "source": older.source, "kind": "tape", "dtype": "bf16",
                              "pe": "rope", "pe_args": {}, "pe_overrides": {}}


def test_errors_are_one_line(tmp_path, run_dir):
    with pytest.raises(TapeError, match=r"^--model: .*missing does not exist; pass --model PATH \(a tape run"):
        find_source(str(tmp_path / "missing"))
    with pytest.raises(TapeError, match=r"^train.init_from: .*missing does not exist; pass train.init_from=PATH \("):
        find_source(str(tmp_path / "missing"), what="train.init_from")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TapeError, match="holds no tape checkpoint"):
        open_model(str(tmp_path / "empty"), device="cpu")
    with pytest.raises(TapeError, match="--dtype: unknown dtype 'fp8'"):
        open_model(str(run_dir[0]), device="cpu", dtype="fp8")
    with pytest.raises(TapeError, match="--pe-arg: bogus: not an argument of pe 'rope'"):
        open_model(str(run_dir[0]), device="cpu", pe_args={"bogus": 1})


def test_pe_args_equal_a_model_built_with_them(run_dir):
    run, newest = run_dir
    opened = open_model(str(run), device="cpu", pe_args={"scaling": "linear", "factor": 2})
    assert opened.model.config.pe_args == {"scaling": "linear", "factor": 2.0}
    assert opened.record()["pe_overrides"] == {"scaling": "linear", "factor": 2}
    reference = tiny(scaling="linear", factor=2.0)
    reference.load_state_dict(newest.state_dict())
    ids = torch.arange(20)[None]
    torch.testing.assert_close(opened.model(ids), reference(ids), rtol=0, atol=0)
    assert not torch.allclose(opened.model(ids), newest(ids))  # the override did change the model


def test_pe_args_that_change_weight_shapes_are_refused(tmp_path):
    save_model(tiny("tape"), ByteTokenizer(), tmp_path / "ckpt")
    with pytest.raises(TapeError, match=r"--pe-arg hidden: changes the shape of the model's weights \(model\.layers"):
        open_model(str(tmp_path / "ckpt"), device="cpu", pe_args={"hidden": 3})


def test_recipe_keys_merge_and_rope_grows_into_tape(run_dir):
    run, newest = run_dir
    opened = open_model(str(run), device="cpu", model_keys={"max_seq_len": 64, "pe": "tape"})
    assert opened.model.config.max_seq_len == 64 and opened.model.config.pe == "tape"
    saved = load_file(str(run / "checkpoints" / "step-00000002" / "model.safetensors"))
    state = opened.model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in saved.items())
    grown = sorted(set(state) - set(saved) - {"lm_head.weight"})
    assert grown and all(".pe." in name for name in grown)
    with torch.no_grad():  # TAPE's updates start at zero: the grown model computes what the rope model computes
        torch.testing.assert_close(opened.model(IDS), newest(IDS), rtol=0, atol=1e-5)
    with pytest.raises(TapeError, match="model.dim: the recipe asks for 64"):
        open_model(str(run), device="cpu", model_keys={"dim": 64})


# ---------------------------------------------------------------------------------------------------------------
# Hugging Face models and checkpoints on them

transformers = pytest.importorskip("transformers")
from hf_helpers import extended_checkpoint, make_hf_llama  # noqa: E402


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("door-hf")
    reference = make_hf_llama(root / "hf", n_kv_heads=2, max_position_embeddings=32)
    return root / "hf", reference


def test_hub_ids_and_short_names_are_sources_found_without_the_network():
    for spec in ("llama2-7b", "meta-llama/Llama-2-7b-hf"):
        source = find_source(spec)
        assert (source.kind, source.location, source.name) == ("hf", spec, spec) and is_hf_source(spec)
    with pytest.raises(TapeError, match="^--model: llama2-7b is not in the local Hugging Face cache"):
        open_model("llama2-7b", device="cpu")


def test_a_hugging_face_directory_opens_with_its_weights_config_and_tokenizer(hf_dir):
    directory, reference = hf_dir
    source = find_source(str(directory))
    assert (source.kind, source.location, source.name) == ("hf", str(directory.resolve()), "hf")
    opened = open_model(str(directory), device="cpu")
    assert opened.kind == "hf" and opened.source == source.location and opened.dtype == "fp32"
    assert opened.model.config == hf_model_config(read_hf_config(directory))
    expected = reference.state_dict()
    state = opened.model.state_dict()
    assert set(state) == {k for k in expected if not k.endswith("inv_freq")}
    assert all(torch.equal(state[name], expected[name]) for name in state)
    fast = transformers.AutoTokenizer.from_pretrained(directory)
    text = "the model reads a long sequence"
    assert opened.tokenizer.encode(text) == fast.encode(text, add_special_tokens=False)
    x = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(opened.model(x), reference(x).logits)
    bf16 = open_model(str(directory), device="cpu", dtype="bf16").model
    assert all(torch.equal(p, expected[name].bfloat16()) for name, p in bf16.state_dict().items())


@pytest.mark.parametrize("method", ["lora", "tape"])
def test_an_extended_checkpoint_opens_as_its_base_plus_its_own_tensors(hf_dir, tmp_path, method):
    directory, reference = hf_dir
    checkpoint = extended_checkpoint(directory, tmp_path / "ckpt", method)
    source = find_source(str(checkpoint))
    assert source.kind == "tape" and source.base["source"] == str(directory) and source.name == "ckpt"
    own = load_file(str(checkpoint / "model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.weight" not in own  # only new and trained tensors are saved
    base = reference.state_dict()
    opened = open_model(str(checkpoint), device="cpu")
    assert opened.model.config.to_dict() == json.loads((checkpoint / "model_config.json").read_text())
    assert tokenizer_fingerprint(opened.tokenizer) == tokenizer_fingerprint(load_tokenizer_dir(checkpoint /
                                                                                               "tokenizer"))
    state = opened.model.state_dict()
    assert not any("lora_" in name for name in state)  # merged into plain layers
    record = json.loads((checkpoint / "base_model.json").read_text())
    for name, tensor in state.items():
        stem = name.removesuffix(".weight")
        if f"{stem}.lora_A" in own:  # W + alpha / r B A
            scaling = record["lora"]["alpha"] / record["lora"]["rank"]
            b, a = own[f"{stem}.lora_B"].double(), own[f"{stem}.lora_A"].double()
            assert_close_to_rounding(tensor, base[name].double() + b @ a * scaling,
                                     scale=(base[name].double().abs() + b.abs() @ a.abs() * scaling).max(), ulps=16)
        else:
            assert torch.equal(tensor, own[name] if name in own else base[name]), name

    # Kept on its base (resuming training): bf16 base weights, the checkpoint's own tensors exactly, in fp32.
    recipe = load_recipe("context-extension-smoke", ["model.max_seq_len=64", f"extend.method={method}"])
    plan = plan_extension(recipe, hf_model_config(read_hf_config(directory)).to_dict(), str(directory))
    kept = open_model(str(checkpoint), device="cpu", dtype="bf16", config=plan.config, lora=plan.lora,
                      keep_base=True).model
    assert kept.base_model == record
    for name, tensor in kept.state_dict().items():
        if name in own:
            assert tensor.dtype == torch.float32 and torch.equal(tensor, own[name]), name
        elif name in base:
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, base[name].bfloat16()), name
