"""`tape extend-context` on imported hybrids (SmolLM3 with windowed NoPE layers, Qwen2 with windowed layers and q/k/v
biases, Qwen3 with QK-norm, Cohere2 with sliding RoPE and full NoPE layers on a parallel block, EXAONE 4 with them on
post-norms): every method starts at the base's logits under the same RoPE scaling (transformers with the same
`rope_parameters` is the reference), keeps the base's NoPE layers and windows (TAPE grows in the RoPE layers only),
trains from the CLI with checkpoints holding only the trained tensors, and the run evaluates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.model.schedule import describe
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import read_model_config, resolve_checkpoint
from tapecli.train.build import build_model

transformers = pytest.importorskip("transformers")
from hf_helpers import VOCAB, make_hf_model, sample_text  # noqa: E402

runner = CliRunner()
BASE_LEN, TARGET, WINDOW = 32, 64, 8
BASES = {
    "smollm3": ("SmolLM3ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, no_rope_layer_interval=2)),
    "qwen2": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2)),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16)),
    "cohere2": ("Cohere2ForCausalLM", dict(sliding_window=WINDOW, logit_scale=0.5)),
    "exaone4": ("Exaone4ForCausalLM", dict(sliding_window=WINDOW)),
}
# What the extended model's layers are (tapecli.model.schedule.describe), per base and method.
LAYERS = {("smollm3", "tape"): "tape x2 + nope x2 (window 8)", ("smollm3", "lora"): "rope x2 + nope x2 (window 8)",
          ("qwen2", "tape"): "tape x2 + tape x2 (window 8)", ("qwen2", "full"): "rope x2 + rope x2 (window 8)",
          ("qwen3", "tape"): "tape", ("qwen3", "longlora"): "rope",
          ("cohere2", "tape"): "tape x3 (window 8) + nope x1", ("cohere2", "lora"): "rope x3 (window 8) + nope x1",
          ("exaone4", "tape"): "tape x3 (window 8) + nope x1", ("exaone4", "full"): "rope x3 (window 8) + nope x1"}


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("extend-hybrids")
    for name, (arch, config) in BASES.items():
        make_hf_model(root / name, arch, max_position_embeddings=BASE_LEN, **config)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root


def reference_logits(base: Path, x: torch.Tensor) -> torch.Tensor:
    """transformers' model of `base` with RoPE interpolated linearly from BASE_LEN to TARGET (extend.scaling=pi)."""
    config = transformers.AutoConfig.from_pretrained(base)
    config.rope_parameters = {**config.rope_parameters, "rope_type": "linear", "factor": TARGET / BASE_LEN}
    model = transformers.AutoModelForCausalLM.from_pretrained(base, config=config).eval()
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("name, method", list(LAYERS))
def test_methods_start_at_the_base_and_keep_its_layers(bases, name, method):
    recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={TARGET}", f"extend.method={method}",
                                                     "extend.scaling=pi"])
    model, tokenizer, _ = build_model(recipe, None, str(bases / name), torch.device("cpu"), "fp32")
    assert describe(model.config.layers()) == LAYERS[name, method]
    x = torch.randint(3, tokenizer.vocab_size, (2, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.eval()(x)
    torch.testing.assert_close(ours, reference_logits(bases / name, x), rtol=0, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name, method", [("smollm3", "tape"), ("qwen2", "lora"), ("qwen3", "longlora"),
                                          ("cohere2", "tape")])
def test_extend_then_evaluate_from_the_cli(bases, tmp_path, name, method):
    out = tmp_path / "run"
    result = runner.invoke(app, ["extend-context", "--base", str(bases / name), "--method", method, "--scaling",
                                 "pi", "--recipe", "context-extension-smoke", "--out", str(out),
                                 f"model.max_seq_len={TARGET}", f"data.source={bases / 'corpus.txt'}",
                                 "train.max_steps=2", "train.save_every=2", "train.eval_every=0", "train.lr=1e-3"])
    assert result.exit_code == 0, result.output
    checkpoint = resolve_checkpoint(out)
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert not any(k.endswith(("q_proj.weight", "q_proj.bias", "mlp.up_proj.weight")) for k in saved)
    assert all(".pe." in k or "lora_" in k or "norm" in k or "embed_tokens" in k for k in saved), saved
    config = read_model_config(checkpoint)
    assert config["max_seq_len"] == TARGET and config["schedule"] == read_model_config_of_base(bases / name)
    result = runner.invoke(app, ["eval", "perplexity", "--model", str(out), "--data", str(bases / "corpus.txt"),
                                 "--seq-len", str(TARGET), "--max-windows", "2", "--out", str(tmp_path / "ppl")])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "ppl" / "results.json").read_text())["models"][0]
    for key, default in (("schedule", {}), ("qk_norm", False), ("qkv_bias", False)):  # recorded when not default
        assert record.get(key, default) == config[key], key
    assert record["pe"] == config["pe"]
    assert 0 < record["lengths"][str(TARGET)]["perplexity"] < 2 * VOCAB  # a random tiny base: about uniform


def read_model_config_of_base(base: Path) -> dict:
    from tapecli.model.hf.load import hf_model_config, read_hf_config

    return hf_model_config(read_hf_config(base)).schedule
