"""`tape extend-context` on a tiny Hugging Face Llama: parameter counts of the paper's 7B setting (meta device),
every method starting at the base's logits, every method x scaling training from the CLI, checkpoints holding only
the trained tensors, and exact resume after SIGKILL; the same start and resume on a tiny OLMo 2 (post-norm block), and
on a tiny Phi-3 with LongRoPE (`--scaling longrope`: the base's factors, or factors given in the recipe)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.model import ModelConfig, count_parameters
from tapecli.model.extend.extended import build_from_base
from tapecli.model.extend.lora import LoraSpec, apply_lora
from tapecli.model.hf.load import build_on_meta, hf_model_config
from tapecli.recipe import load_recipe
from tapecli.store.checkpoint import load_weights, read_model_config, resolve_checkpoint
from tapecli.store.door import open_model
from tapecli.train.build import build_model
from tapecli.train.extend import plan_extension
from tapecli.train.freeze import apply_plan

transformers = pytest.importorskip("transformers")
from hf_helpers import make_hf_llama, make_hf_model, sample_text  # noqa: E402
from train_helpers import (  # noqa: E402
    assert_same_weights,
    kill_after_first_checkpoint,
    subprocess_env,
    weights,
)

runner = CliRunner()
BASE_LEN, TARGET = 32, 64
LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
             "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "tie_word_embeddings": False, "hidden_act": "silu"}
# transformers' rope_parameters for each scaling at 32 -> 64 tokens (the reference the extended model must match).
HF_ROPE = {"pi": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
           "yarn": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4, "original_max_position_embeddings": 32},
           "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
           "theta": {"rope_type": "default", "rope_theta": 1e6},
           "none": {"rope_type": "default", "rope_theta": 1e4}}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny GQA Llama (context 32) with a BPE tokenizer, and a corpus next to it."""
    root = tmp_path_factory.mktemp("extend")
    make_hf_llama(root / "hf", n_kv_heads=2, max_position_embeddings=BASE_LEN)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root / "hf"


def extend_args(base: Path, out: Path, method: str, scaling: str, *extra: str) -> list[str]:
    return ["extend-context", "--base", str(base), "--method", method, "--scaling", scaling, "--recipe",
            "context-extension-smoke", "--out", str(out), f"model.max_seq_len={TARGET}",
            f"data.source={base.parent / 'corpus.txt'}", *extra]


def plan_on_meta(method: str, compat: str = "official"):
    recipe = load_recipe("context-extension", [f"extend.method={method}", f"extend.compat={compat}"])
    plan = plan_extension(recipe, hf_model_config(LLAMA2_7B).to_dict(), "llama2-7b")
    model = build_on_meta(plan.config)
    if plan.lora is not None:
        apply_lora(model, plan.lora)
    apply_plan(model, plan)
    return plan, model


def test_llama2_7b_parameter_counts_match_method_md():
    base_total = count_parameters(build_on_meta(hf_model_config(LLAMA2_7B)))["total"]
    assert base_total == 6_738_415_616
    embed_and_norms = 32000 * 4096 + 65 * 4096  # 131,072,000 + 266,240 (no [PAD] row: we pad with eos)

    plan, tape = plan_on_meta("tape")
    counts = count_parameters(tape)
    assert counts["pe"] == 17_072_128 and counts["total"] == base_total + 17_072_128  # method.md 1.7
    assert plan.config.pe_args == {"theta": 10000.0, "scaling": "linear", "original_max_len": 4096, "factor": 2.0}
    # Official protocol: W_x, W_1, W_2 train (not P); the last layer's state updates feed nothing and stay frozen.
    assert counts["trainable"] == 31 * (4096 * 128 + 2 * 32 * 128) + embed_and_norms

    _, lora = plan_on_meta("lora")
    lora_params = sum(p.numel() for n, p in lora.named_parameters() if "lora_" in n)
    assert lora_params == 8_388_608  # method.md 1.7: r=8 on q, k, v, o
    assert count_parameters(lora)["trainable"] == 8_388_608 + embed_and_norms  # "~139.7 M"

    _, paper_tape = plan_on_meta("tape", compat="paper")
    assert count_parameters(paper_tape)["trainable"] == counts["trainable"] + 31 * 32 * 32  # P trains too


def test_memory_estimate_of_the_paper_setting():
    """Llama-2-7B + TAPE at 8192 tokens, bf16 base, 8 processes: FSDP divides weights, gradients and optimizer
    states by 8; activations stay per device."""
    from tapecli.train.memory import estimate_memory

    _, model = plan_on_meta("tape")
    model.to(torch.bfloat16)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    recipe = load_recipe("context-extension", ["extend.method=tape", "train.precision=bf16"])
    ddp, sharded = estimate_memory(model, recipe, 8, False), estimate_memory(model, recipe, 8, True)
    trainable = count_parameters(model)["trainable"]
    assert ddp["gradients"] == 4 * trainable and ddp["optimizer"] == 8 * trainable
    assert sharded["weights"] == ddp["weights"] // 8 and sharded["activations"] == ddp["activations"]
    assert 1.5 * 2**30 < sharded["weights"] < 1.7 * 2**30 and sharded["total"] < 8 * 2**30  # 7.19 GiB
    recipe.train.activation_checkpointing = False
    assert estimate_memory(model, recipe, 8, True)["activations"] > 8 * sharded["activations"]


def reference_logits(base: Path, scaling: str, x: torch.Tensor) -> torch.Tensor:
    config = transformers.AutoConfig.from_pretrained(base)
    config.rope_parameters = dict(HF_ROPE[scaling])
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, config=config).eval()
    with torch.no_grad():
        return hf(x).logits


@pytest.mark.parametrize("scaling", ["pi", "yarn", "dynamic", "theta"])
@pytest.mark.parametrize("method", ["tape", "lora", "longlora"])
def test_methods_start_at_the_base_logits_under_the_same_scaling(base, method, scaling):
    recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={TARGET}", f"extend.method={method}",
                                                     f"extend.scaling={scaling}"])
    model, tokenizer, _ = build_model(recipe, None, str(base), torch.device("cpu"), "fp32")
    x = torch.randint(0, tokenizer.vocab_size, (2, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.eval()(x)
    expected = reference_logits(base, scaling, x)
    if method == "tape":
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)  # the [V | E] attention sums differently
    else:
        assert torch.equal(ours, expected)  # LoRA's B = 0 adds exactly zero


def run_cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


# Every method trains, and every scaling once, each with another method: a scaling only changes RoPE's frequencies
# (tests/model/test_rope_scaling.py; test_methods_start_at_the_base_logits_under_the_same_scaling checks them in the
# extended models against transformers), the training path is the method's. longlora has no `none`.
SCALINGS_TRAINED = {"tape": ("pi", "none"), "lora": ("yarn",), "longlora": ("dynamic",), "full": ("theta",)}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(SCALINGS_TRAINED))
def test_every_method_and_scaling_trains_from_the_cli(base, tmp_path, method):
    for scaling in SCALINGS_TRAINED[method]:
        out = tmp_path / scaling
        output = run_cli(*extend_args(base, out, method, scaling, "train.max_steps=2", "train.save_every=2",
                                      "train.batch_size=1", "train.eval_every=0",
                                      "train.activation_checkpointing=false"))
        assert f"method {method}, scaling {scaling}" in output and "trainable" in output
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert len([r for r in rows if "loss" in r]) == 2 and all(r["loss"] < 7 for r in rows if "loss" in r)
        config = read_model_config(resolve_checkpoint(out))
        assert config["max_seq_len"] == TARGET and config["pe"] == ("tape" if method == "tape" else "rope")
    output = run_cli(*extend_args(base, tmp_path / "official", method, "theta", "--compat", "official",
                                  "train.max_steps=2", "train.save_every=2", "train.batch_size=1",
                                  "train.eval_every=0"))
    assert "protocol official" in output and "linear x2, RoPE theta 1e+06" in output


@pytest.mark.slow
@pytest.mark.parametrize("method", ["tape", "lora"])
def test_checkpoints_hold_only_trained_tensors_and_open_like_any_other(base, tmp_path, method):
    out = tmp_path / "run"
    run_cli(*extend_args(base, out, method, "pi", "train.max_steps=2", "train.save_every=2", "train.eval_every=0",
                         "train.lr=1e-2"))
    checkpoint = resolve_checkpoint(out)
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    record = json.loads((checkpoint / "base_model.json").read_text())
    assert record["source"] == str(base) and Path(record["directory"]) == base.resolve()
    own = {"model.embed_tokens.weight", "model.norm.weight"}
    assert own <= saved and not any(k.endswith(("q_proj.weight", "mlp.up_proj.weight")) for k in saved)
    assert all(".pe." in k or "lora_" in k or "norm" in k or "embed_tokens" in k for k in saved)

    opened = open_model(str(out), device="cpu")  # LoRA merged into the weights for evaluation
    model, tokenizer = opened.model, opened.tokenizer
    config = ModelConfig.from_dict(read_model_config(checkpoint))
    lora = None if record["lora"] is None else LoraSpec(**record["lora"])
    unmerged = build_from_base(config, base, dtype=torch.float32, device="cpu", lora=lora)
    load_weights(unmerged, checkpoint, missing_ok=set(unmerged.state_dict()))
    unmerged.eval()
    x = torch.randint(0, tokenizer.vocab_size, (1, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), unmerged(x), rtol=0, atol=1e-5)
        trained = model(x)
    reference = reference_logits(base, "pi", x)
    assert (trained - reference).abs().max() > 1e-3  # training moved it away from the base

    # Fine-tuning an extended checkpoint further gives a self-contained model (LoRA merged, every tensor saved).
    run_cli("finetune", "--checkpoint", str(out), "--recipe", "context-extension-smoke", "--out", str(tmp_path / "ft"),
            f"model.max_seq_len={TARGET}", f"data.source={base.parent / 'corpus.txt'}", "train.max_steps=1",
            "train.save_every=1", "train.eval_every=0", "train.warmup=0", "train.batch_size=1")
    assert not (resolve_checkpoint(tmp_path / "ft") / "base_model.json").exists()
    assert "model.layers.0.self_attn.q_proj.weight" in weights(tmp_path / "ft")


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")  # in this process as in the killed one (OMP_NUM_THREADS=1): the same floats
@pytest.mark.parametrize("which, method, scaling, steps, every, saved", [
    ("base", "longlora", "pi", 12, 3, "lora_"), ("olmo2", "tape", "pi", 12, 3, ".pe."),
    ("gemma3", "tape", "none", 12, 3, ".pe."), ("phi3", "tape", "longrope", 12, 3, ".pe."),
    ("phi3", "lora", "longrope", 12, 3, "lora_")])
def test_sigkill_then_resume_matches_uninterrupted(request, tmp_path, which, method, scaling, steps, every, saved):
    """A real `tape extend-context` process killed at some step after its first checkpoint; the same command (here,
    in this process) resumes it to the weights of an uninterrupted run (LongLoRA on the Llama, TAPE on OLMo 2, TAPE
    on Gemma 3's global layers only, TAPE and LoRA on a Phi-3 with LongRoPE, its rows past the switch)."""
    base = request.getfixturevalue(which)
    extra = (f"train.max_steps={steps}", f"train.save_every={every}", "train.eval_every=0", "train.keep_last=2",
             "train.activation_checkpointing=false", "train.lr=1e-3", *(GEMMA3_GLOBAL_TAPE * (which == "gemma3")))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_cli(*extend_args(base, whole, method, scaling, *extra))
    kill_after_first_checkpoint(extend_args(base, killed, method, scaling, *extra), killed, subprocess_env(), steps)
    assert "resuming from" in run_cli(*extend_args(base, killed, method, scaling, *extra))
    assert_same_weights(weights(whole), weights(killed))
    assert {k for k in weights(killed) if saved in k}  # the adapters or TAPE's grown weights were saved and resumed


@pytest.fixture(scope="module")
def olmo2(tmp_path_factory) -> Path:
    """A tiny OLMo 2 (context 32; post-norms, QK-norm over the projections) and a corpus next to it."""
    root = tmp_path_factory.mktemp("olmo2")
    make_hf_model(root / "hf", "Olmo2ForCausalLM", max_position_embeddings=BASE_LEN)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root / "hf"


@pytest.mark.parametrize("scaling", ["pi", "yarn"])
@pytest.mark.parametrize("method", ["tape", "lora"])
def test_olmo2_extensions_start_at_the_base_logits(olmo2, method, scaling):
    recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={TARGET}", f"extend.method={method}",
                                                     f"extend.scaling={scaling}"])
    model, tokenizer, _ = build_model(recipe, None, str(olmo2), torch.device("cpu"), "fp32")
    assert model.config.block == {"norms": "post", "qk_norm": "projection"}
    x = torch.randint(0, tokenizer.vocab_size, (2, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), reference_logits(olmo2, scaling, x), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    """A tiny Gemma 3 (context 32): a sliding layer (local RoPE, theta 1e4) and a global one (theta 1e6)."""
    root = tmp_path_factory.mktemp("gemma3")
    make_hf_model(root / "hf", "Gemma3ForCausalLM", num_hidden_layers=2, head_dim=16, sliding_window=4,
                  max_position_embeddings=BASE_LEN, layer_types=["sliding_attention", "full_attention"])
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root / "hf"


# With --scaling none: TAPE on Gemma 3's global layer only, its RoPE interpolated linearly to TARGET; the local
# layer keeps its RoPE.
GEMMA3_GLOBAL_TAPE = ("model.n_layers=2",
                      "model.schedule={layers: [local, global], kinds: {local: {pe: rope, window: 4}, "
                      "global: {pe_args: {theta: 1000000.0, scaling: linear, factor: 2.0, original_max_len: 32}}}}")


def test_a_base_with_a_rope_per_layer_type_is_refused_in_one_line(gemma3, tmp_path):
    """Gemma 3's global layers carry their own RoPE (a schedule kind's pe_args), which --scaling would not touch."""
    result = runner.invoke(app, extend_args(gemma3, tmp_path / "out", "tape", "pi"))
    assert result.exit_code == 2
    assert "model.schedule: " in result.output and "gives its global layers a RoPE of their own" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_tape_on_gemma3_global_layers_starts_at_transformers_with_that_rope(gemma3):
    recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={TARGET}", "extend.method=tape",
                                                     "extend.scaling=none", *GEMMA3_GLOBAL_TAPE])
    model, tokenizer, _ = build_model(recipe, None, str(gemma3), torch.device("cpu"), "fp32")
    assert [spec.pe for spec in model.config.layers()] == ["rope", "tape"]
    config = transformers.AutoConfig.from_pretrained(gemma3)
    config.rope_parameters["full_attention"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}
    hf = transformers.AutoModelForCausalLM.from_pretrained(gemma3, config=config).eval()
    x = torch.randint(3, tokenizer.vocab_size, (2, TARGET), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), hf(x).logits, rtol=0, atol=1e-5)


PHI3_ORIGINAL = 16  # the Phi-3 base's original_max_position_embeddings (its max_position_embeddings: BASE_LEN)
FACTORS = {"short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 1.8, 2.0],
           "long_factor": [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0]}


@pytest.fixture(scope="module")
def phi3(tmp_path_factory) -> Path:
    """A tiny Phi-3 (fused weights; context 32, LongRoPE from 16: Phi-3-mini-128k's layout) and a corpus."""
    root = tmp_path_factory.mktemp("phi3")
    make_hf_model(root / "hf", "Phi3ForCausalLM", max_position_embeddings=BASE_LEN,
                  original_max_position_embeddings=PHI3_ORIGINAL, rope_scaling={"rope_type": "longrope", **FACTORS})
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root / "hf"


@pytest.fixture(scope="module")
def phi3_plain(tmp_path_factory) -> Path:
    """A tiny Phi-3 without rope_scaling (context 32: Phi-3-mini-4k's layout, without its window)."""
    root = tmp_path_factory.mktemp("phi3-plain")
    make_hf_model(root / "hf", "Phi3ForCausalLM", max_position_embeddings=BASE_LEN)
    (root / "corpus.txt").write_text(sample_text(300, seed=1))
    return root / "hf"


def phi3_reference(base: Path, x: torch.Tensor, **rope) -> torch.Tensor:
    """transformers' Phi3 of `base`, at TARGET positions, with `rope` over its rope_parameters."""
    config = transformers.AutoConfig.from_pretrained(base)
    config.rope_parameters = {**config.rope_parameters, **rope}
    config.max_position_embeddings = TARGET
    if "original_max_position_embeddings" in rope:
        config.original_max_position_embeddings = rope["original_max_position_embeddings"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, config=config).eval()
    with torch.no_grad():
        return hf(x).logits


@pytest.mark.parametrize("method", ["tape", "lora"])
def test_longrope_extensions_of_phi3_start_at_transformers(phi3, phi3_plain, method):
    """--scaling longrope keeps a LongRoPE base's factors, original length and attention factor; on a base without
    LongRoPE it takes the recipe's factors, from the base's length, with transformers' default attention factor."""
    x = torch.randint(3, 96, (2, TARGET), generator=torch.Generator().manual_seed(0))
    for base, extra, rope in (
            (phi3, [], {}),
            (phi3_plain, [f"model.pe_args.{key}={value}" for key, value in FACTORS.items()],
             {"rope_type": "longrope", **FACTORS, "original_max_position_embeddings": BASE_LEN})):
        recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={TARGET}", f"extend.method={method}",
                                                         "extend.scaling=longrope", *extra])
        assert "longrope" in plan_extension(recipe, hf_model_config(json.loads((base / "config.json").read_text(
        ))).to_dict(), "base").summary
        model, _, _ = build_model(recipe, None, str(base), torch.device("cpu"), "fp32")
        assert model.config.pe_args["original_max_len"] == (PHI3_ORIGINAL if base == phi3 else BASE_LEN)
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(x), phi3_reference(base, x, **rope), rtol=0, atol=1e-5)


def test_another_scaling_replaces_a_phi3_longrope(phi3, tmp_path):
    recipe = load_recipe("context-extension-smoke", [f"model.max_seq_len={TARGET}", "extend.scaling=yarn",
                                                     "extend.method=lora"])
    model, _, _ = build_model(recipe, None, str(phi3), torch.device("cpu"), "fp32")
    args = model.config.pe_args
    assert (args["scaling"], args["original_max_len"], args["factor"]) == ("yarn", BASE_LEN, 2.0)
    assert args["short_factor"] is None and args["long_factor"] is None and model.model.pe.attention_factor == \
        pytest.approx(0.1 * math.log(2.0) + 1)


def test_longrope_without_factors_is_one_line(base, tmp_path):
    result = runner.invoke(app, extend_args(base, tmp_path / "run", "lora", "longrope"))
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "model.pe_args.short_factor: --scaling longrope needs the short and long rescale factors" in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["--method", "bogus"], "extend.method: expected one of tape, lora, longlora, full"),
    (["--scaling", "yarn", "--compat", "official"], "extend.scaling: yarn does not exist in the official protocol"),
    (["--scaling", "longrope", "--compat", "official"], "extend.scaling: longrope does not exist in the official "
                                                        "protocol"),
    (["train.freeze=['*']"], "train.freeze: extend-context trains what --method says"),
    (["extend.trainable=['*embeddings*']"], "extend.trainable: pattern '*embeddings*' matches no parameter"),
    (["model.n_layers=3"], "model.n_layers: the recipe asks for 3"),
    (["model.max_seq_len=32", "data.seq_len=32"], "model.max_seq_len: the target context 32 must exceed the base's 32"),
    (["--method", "longlora", "extend.group_fraction=0.3"], "extend.group_fraction: 0.3 of data.seq_len 64"),
])
def test_bad_input_is_one_line(base, tmp_path, args, message):
    result = runner.invoke(app, [*extend_args(base, tmp_path / "run", "tape", "pi"), *args])
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "run").exists()


def test_offline_hub_base_says_to_pass_a_directory(tmp_path):
    result = runner.invoke(app, ["extend-context", "--base", "llama2-7b", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and result.output.startswith(
        "error: --base: llama2-7b is not in the local Hugging Face cache, and the hub cannot be reached; pass --base "
        "DIR (a local Hugging Face model directory")


def test_help_lists_the_short_names():
    output = runner.invoke(app, ["extend-context", "--help"]).output
    assert all(name in output for name in ("llama2-7b", "llama3-8b", "mistral-7b", "tinyllama", "smollm2-135m"))
