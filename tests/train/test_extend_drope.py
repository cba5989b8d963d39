"""`tape extend-context --method drope` (DroPE, arXiv 2512.12167): every layer's positional embedding removed, equal
to transformers' model with RoPE nulled as the official code nulls it (cos = 1, sin = 0) on a Llama and on hybrid
bases (windows, NoPE layers kept); on a tape run equal to the same weights in a NoPE model; every weight trains;
the run evaluates and exports (a SmolLM3 without RoPE in any layer); it resumes bit-exactly after SIGKILL; bad
inputs are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.model import ModelConfig, Transformer
from tapecli.model.schedule import describe
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import load_weights, read_model_config, resolve_checkpoint
from tapecli.store.door import open_model
from tapecli.train.build import build_model

transformers = pytest.importorskip("transformers")
from hf_helpers import make_hf_llama, make_hf_model, sample_text  # noqa: E402
from train_helpers import (  # noqa: E402
    assert_same_weights,
    kill_after_first_checkpoint,
    subprocess_env,
    weights,
)

runner = CliRunner()
BASE_LEN, TARGET, WINDOW = 32, 64, 8
HYBRIDS = {  # base: (transformers class, config, what the DroPE model's layers are)
    "smollm3": ("SmolLM3ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, no_rope_layer_interval=2),
                "nope x2 + nope x2 (window 8)"),
    "qwen2": ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2),
              "nope x2 + nope x2 (window 8)"),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16), "nope"),
}


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> Path:
    """A tiny GQA Llama (context 32), the hybrid bases, and a corpus next to them."""
    root = tmp_path_factory.mktemp("drope")
    make_hf_llama(root / "llama", n_kv_heads=2, max_position_embeddings=BASE_LEN)
    for name, (arch, config, _) in HYBRIDS.items():
        make_hf_model(root / name, arch, max_position_embeddings=BASE_LEN, **config)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root


def drope_args(base: Path, out: Path, *extra: str) -> list[str]:
    return ["extend-context", "--base", str(base), "--method", "drope", "--recipe", "drope-smoke", "--out", str(out),
            f"model.max_seq_len={TARGET}", f"data.seq_len={BASE_LEN}", f"data.source={base.parent / 'corpus.txt'}",
            *extra]


def nope_reference(base: Path, x: torch.Tensor) -> torch.Tensor:
    """transformers' model of `base` with RoPE nulled as DroPE's official code does (custom_models/attention.py:
    position_embeddings replaced by cos = 1, sin = 0 in every layer)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    rotary = model.model.rotary_emb
    original = rotary.forward
    rotary.forward = lambda *a, **k: tuple(f(t) for f, t in zip((torch.ones_like, torch.zeros_like), original(*a, **k),
                                                                strict=True))
    with torch.no_grad():
        return model(x).logits


def with_rope(base: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.no_grad():
        return model(x).logits


@pytest.mark.parametrize("name", ["llama", *HYBRIDS])
def test_drope_removes_every_positional_embedding(bases, name):
    recipe = load_recipe("drope-smoke", [f"model.max_seq_len={TARGET}", f"data.seq_len={BASE_LEN}",
                                         "extend.method=drope", "extend.scaling=none"])
    model, tokenizer, note = build_model(recipe, None, str(bases / name), torch.device("cpu"), "fp32")
    assert describe(model.config.layers()) == (HYBRIDS[name][2] if name in HYBRIDS else "nope")
    assert "method drope" in note and all(p.requires_grad for p in model.parameters())
    x = torch.randint(3, tokenizer.vocab_size, (2, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.eval()(x)
    expected = nope_reference(bases / name, x)
    torch.testing.assert_close(ours, expected, rtol=0, atol=2e-5)
    assert (ours - with_rope(bases / name, x)).abs().max() > 1e-3  # RoPE mattered (a random tiny model: little)


def test_drope_on_a_tape_run_equals_its_weights_in_a_nope_model(trained, tmp_path):
    run = trained()  # the TINY recipe: RoPE, max_seq_len 64
    (tmp_path / "corpus.txt").write_text(sample_text(100, seed=2))
    recipe = load_recipe("drope-smoke", ["model.max_seq_len=128", "data.seq_len=32", "extend.method=drope",
                                         "extend.scaling=none"])
    model, _, note = build_model(recipe, None, str(run), torch.device("cpu"), "fp32")
    assert "layers rope -> nope" in note and describe(model.config.layers()) == "nope"
    saved = read_model_config(resolve_checkpoint(run))
    nope = Transformer(ModelConfig.from_dict({**saved, "pe": "nope", "pe_args": {}, "max_seq_len": 128}))
    load_weights(nope, resolve_checkpoint(run))
    x = torch.randint(0, saved["vocab_size"], (2, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model.eval()(x), nope.eval()(x))


def run_cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.slow
def test_drope_trains_every_weight_and_evaluates_past_the_base(bases, tmp_path):
    out = tmp_path / "run"
    output = run_cli(*drope_args(bases / "llama", out, "train.max_steps=2", "train.save_every=2",
                                 "train.eval_every=0", "train.lr=1e-2"))
    assert "method drope" in output and "layers rope -> nope" in output
    config = read_model_config(resolve_checkpoint(out))
    assert config["max_seq_len"] == TARGET and config["schedule"] == {"pattern": ["nope"]}
    saved = weights(out)
    assert "model.layers.0.self_attn.q_proj.weight" in saved and "model.layers.1.mlp.up_proj.weight" in saved
    run_cli("eval", "perplexity", "--model", str(out), "--data", str(bases / "corpus.txt"), "--seq-len",
            f"{BASE_LEN},{TARGET}", "--max-windows", "2", "--out", str(tmp_path / "ppl"))
    record = json.loads((tmp_path / "ppl" / "results.json").read_text())["models"][0]
    assert record["schedule"] == {"pattern": ["nope"]}
    assert all(0 < record["lengths"][str(n)]["perplexity"] < 1e4 for n in (BASE_LEN, TARGET))

    # Exported, it is a SmolLM3 whose every layer skips RoPE, with tape's logits.
    run_cli("export", "--checkpoint", str(out), "--out", str(tmp_path / "hf"))
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert exported.config.no_rope_layers == [0, 0]
    x = torch.randint(3, exported.config.vocab_size, (1, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(open_model(str(out), device="cpu").model(x), exported(x).logits, rtol=0, atol=2e-5)


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")  # in this process as in the killed one (OMP_NUM_THREADS=1): the same floats
@pytest.mark.parametrize("source", ["hf", "tape"])
def test_sigkill_then_resume_matches_uninterrupted(bases, trained, tmp_path, source):
    """A real `tape extend-context --method drope` process, on a Hugging Face base and on a tape run, killed after its
    first checkpoint; the same command resumes it to the weights of an uninterrupted run."""
    base = bases / "llama" if source == "hf" else trained()
    extra = ("train.max_steps=30", "train.save_every=5", "train.eval_every=0", "train.keep_last=2",
             "train.activation_checkpointing=false", "train.lr=1e-3")
    whole, killed = tmp_path / "whole", tmp_path / "killed"

    def args(out: Path) -> list[str]:
        return [*drope_args(base, out, *extra), f"data.source={bases / 'corpus.txt'}"]

    run_cli(*args(whole))
    kill_after_first_checkpoint(args(killed), killed, subprocess_env(), 30)
    assert "resuming from" in run_cli(*args(killed))
    assert_same_weights(weights(whole), weights(killed))


@pytest.mark.parametrize("args, message", [
    (["--scaling", "pi"], "extend.scaling: pi scales RoPE, which --method drope removes from every layer"),
    (["--compat", "official"], "extend.compat: official is the TAPE paper's scripts' protocol"),
    (["model.schedule.pattern=[rope,nope]"], "model.schedule: --method drope sets every layer's schedule"),
    ([f"data.seq_len={TARGET}"], f"data.seq_len: {TARGET} exceeds the base's length {BASE_LEN}"),
    ([f"model.max_seq_len={BASE_LEN // 2}", "data.seq_len=16"], "model.max_seq_len: the target context 16"),
])
def test_bad_input_is_one_line(bases, tmp_path, args, message):
    result = runner.invoke(app, [*drope_args(bases / "llama", tmp_path / "run"), *args])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("pe, message", [
    ("nope", "has no positional embedding in any layer; there is nothing for drope to remove"),
    ("tape", "'tape' (model.layers.0.pe."),
])
def test_a_run_without_a_weightless_positional_embedding_is_refused(trained, tmp_path, pe, message):
    run = trained("tiny", f"model.pe={pe}")
    (tmp_path / "corpus.txt").write_text(sample_text(50, seed=2))
    result = runner.invoke(app, ["extend-context", "--base", str(run), "--method", "drope", "--recipe",
                                 "drope-smoke", "--out", str(tmp_path / "run"), "model.max_seq_len=128",
                                 "data.seq_len=32", f"data.source={tmp_path / 'corpus.txt'}"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output and not (tmp_path / "run").exists()


def test_other_methods_still_need_a_hugging_face_base(trained, tmp_path):
    (tmp_path / "corpus.txt").write_text(sample_text(50, seed=2))
    result = runner.invoke(app, ["extend-context", "--base", str(trained()), "--method", "lora", "--recipe",
                                 "context-extension-smoke", "--out", str(tmp_path / "run"), "model.max_seq_len=128",
                                 f"data.source={tmp_path / 'corpus.txt'}"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "not a Hugging Face model directory" in result.output
