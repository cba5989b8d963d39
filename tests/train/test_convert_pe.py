"""Converting a pretrained RoPE model's layers by continued training (`tape extend-context` with `model.schedule` /
`model.window`): what step 0 computes equals transformers running the converted layout on the base's weights
(SmolLM3 with `no_rope_layers` for NoPE layers, Mistral with `sliding_window` for windows), TAPE grown in the RoPE
layers starts exactly there, and the conversion trains from the CLI at the base's length with checkpoints holding only
the trained tensors, then evaluates beside its base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import resolve_checkpoint
from tapecli.train.build import build_model

transformers = pytest.importorskip("transformers")
from hf_helpers import make_hf_llama, sample_text  # noqa: E402

runner = CliRunner()
BASE_LEN = 32
NOPE_EVERY_4TH = ["model.schedule.pattern=rope+rope+rope+nope"]
# TAPE in the layers that keep the model's PE (a kind naming no pe), NoPE in every 4th.
TAPE_AND_NOPE = ["model.schedule.pattern=global+global+global+nope", "model.schedule.kinds.global.window=null"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("convert")
    make_hf_llama(root / "hf", n_kv_heads=2, n_layers=4, max_position_embeddings=BASE_LEN)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root / "hf"


def converted(base: Path, method: str, *keys: str, target: int = BASE_LEN, scaling: str = "none"):
    recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={target}", f"data.seq_len={BASE_LEN}",
                                                     f"extend.method={method}", f"extend.scaling={scaling}", *keys])
    model, _, _ = build_model(recipe, None, str(base), torch.device("cpu"), "fp32")
    return model.eval()


def reference(base: Path, arch: str, **keys) -> torch.nn.Module:
    """The base's weights in transformers class `arch` with config keys `keys` (the converted layout)."""
    config = json.loads((base / "config.json").read_text())
    config.update(architectures=[arch], **keys)
    cls = getattr(transformers, arch)
    return cls.from_pretrained(base, config=cls.config_class(**config)).eval()


def tokens(length: int) -> torch.Tensor:
    return torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method, keys", [("lora", NOPE_EVERY_4TH), ("full", NOPE_EVERY_4TH),
                                          ("tape", TAPE_AND_NOPE)])
def test_nope_layers_start_as_transformers_runs_the_converted_layout(base, method, keys):
    model = converted(base, method, *keys)
    assert [spec.pe for spec in model.config.layers()] == ["tape" if method == "tape" else "rope"] * 3 + ["nope"]
    x = tokens(BASE_LEN)
    smollm3 = reference(base, "SmolLM3ForCausalLM", no_rope_layers=[1, 1, 1, 0])
    plain = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.no_grad():
        ours, expected = model(x), smollm3(x).logits
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
        assert (ours - plain(x).logits).abs().max() > 1e-3  # removing a rotation changes the model


def test_windowed_layers_start_as_the_base_inside_the_window(base):
    model = converted(base, "lora", "model.window=8", target=2 * BASE_LEN, scaling="pi")
    x = tokens(2 * BASE_LEN)
    config = json.loads((base / "config.json").read_text())
    mistral = reference(base, "MistralForCausalLM", sliding_window=8,
                        rope_parameters={**config["rope_parameters"], "rope_type": "linear", "factor": 2.0})
    with torch.no_grad():
        ours = model(x)
        torch.testing.assert_close(ours, mistral(x).logits, rtol=0, atol=2e-5)
        unwindowed = converted(base, "lora", target=2 * BASE_LEN, scaling="pi")(x)
    torch.testing.assert_close(ours[:, :8], unwindowed[:, :8], rtol=0, atol=2e-5)  # the first 8 tokens: the base
    assert (ours[:, 8:] - unwindowed[:, 8:]).abs().max() > 1e-3


@pytest.mark.parametrize("keys, scaling, message", [
    ([], "none", "model.max_seq_len: the target context 32 must exceed the base's 32"),
    (NOPE_EVERY_4TH, "pi", "extend.scaling: pi stretches positions from 32 to 32 tokens"),
    (["model.schedule.pattern=rope+t5"], "none", "model.schedule: changes the shape of"),
])
def test_conversions_that_do_not_apply_are_one_line(base, keys, scaling, message):
    with pytest.raises(TapeError, match=message) as info:
        converted(base, "lora", *keys, scaling=scaling)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_convert_then_evaluate_beside_the_base_from_the_cli(base, tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["extend-context", "--base", str(base), "--method", "lora", "--scaling", "none",
                                 "--recipe", "context-extension-smoke", "--out", str(out),
                                 f"model.max_seq_len={BASE_LEN}", "data.seq_len=32", *NOPE_EVERY_4TH,
                                 f"data.source={base.parent / 'corpus.txt'}", "train.max_steps=2",
                                 "train.save_every=2", "train.eval_every=0", "train.lr=1e-3"])
    assert result.exit_code == 0, result.output
    assert "layers rope -> rope x3 + nope x1" in result.output
    with safe_open(str(resolve_checkpoint(out) / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved and all("lora_" in k or "norm" in k or "embed_tokens" in k for k in saved), saved
    result = runner.invoke(app, ["eval", "perplexity", "--model", str(base), "--model", str(out), "--data",
                                 str(base.parent / "corpus.txt"), "--seq-len", f"{BASE_LEN},{2 * BASE_LEN}",
                                 "--max-windows", "2", "--out", str(tmp_path / "ppl")])
    assert result.exit_code == 0, result.output
    models = json.loads((tmp_path / "ppl" / "results.json").read_text())["models"]
    assert [m.get("schedule", {}) for m in models] == [{}, {"pattern": "rope+rope+rope+nope"}]
    assert all(set(m["lengths"]) == {str(BASE_LEN), str(2 * BASE_LEN)} for m in models)


def test_tape_that_would_grow_in_no_layer_is_one_line(base):
    with pytest.raises(TapeError, match="model.pe: tape would grow in no layer") as info:
        converted(base, "tape", *NOPE_EVERY_4TH)  # every name is a PE's own name: rope stays rope
    assert "\n" not in str(info.value)
