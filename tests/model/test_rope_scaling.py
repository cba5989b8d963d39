"""RoPE scalings: our frequencies follow each formula, and whole models match transformers' Llama bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from tapecli.model import ModelConfig, Transformer
from tapecli.model.pe.rope_freqs import default_inv_freq

transformers = pytest.importorskip("transformers")

HEAD_DIM, MAX_LEN = 16, 64
SCALINGS = {
    "none": {},
    "linear": {"scaling": "linear", "factor": 4.0},
    "dynamic": {"scaling": "dynamic", "factor": 2.0},
    "yarn": {"scaling": "yarn", "factor": 4.0, "original_max_len": 32},
    "llama3": {"scaling": "llama3", "factor": 8.0, "theta": 500000.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_len": 16},
}


def hf_rope_parameters(args: dict) -> dict:
    params = {"rope_theta": args.get("theta", 10000.0), "rope_type": "default"}
    if args:
        params.update(rope_type=args["scaling"], factor=args["factor"])
    if "original_max_len" in args:
        params["original_max_position_embeddings"] = args["original_max_len"]
    for ours, theirs in (("low_freq_factor", "low_freq_factor"), ("high_freq_factor", "high_freq_factor")):
        if ours in args:
            params[theirs] = args[ours]
    return params


def both_models(args: dict):
    config = ModelConfig(vocab_size=97, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96,
                         max_seq_len=MAX_LEN, pe="rope", pe_args=args)
    torch.manual_seed(0)
    ours = Transformer(config).eval()
    hf_config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=MAX_LEN, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters=hf_rope_parameters(args))
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    hf.load_state_dict(ours.state_dict(), strict=True)  # same parameter names, nothing to rename
    return ours, hf


@pytest.mark.parametrize("name", list(SCALINGS))
def test_whole_model_matches_transformers_llama(name):
    ours, hf = both_models(SCALINGS[name])
    x = torch.randint(0, 97, (2, 100), generator=torch.Generator().manual_seed(1))  # beyond MAX_LEN: dynamic NTK
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x).logits)


@pytest.mark.parametrize("name", [n for n in SCALINGS if n != "none"])
def test_scaling_changes_the_model(name):
    scaled, _ = both_models(SCALINGS[name])
    plain, _ = both_models({})
    x = torch.randint(0, 97, (1, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (scaled(x) - plain(x)).abs().max() > 1e-4


def frequencies(args: dict, positions: torch.Tensor) -> tuple[torch.Tensor, float]:
    config = ModelConfig(vocab_size=8, dim=4 * HEAD_DIM, n_layers=1, n_heads=4, max_seq_len=MAX_LEN, pe="rope",
                         pe_args=args)
    pe = Transformer(config).model.pe
    return pe.frequencies(positions), pe.attention_factor


def test_linear_is_position_interpolation():
    inv, factor = frequencies(SCALINGS["linear"], torch.arange(10))
    assert torch.allclose(inv, default_inv_freq(10000.0, HEAD_DIM) / 4.0) and factor == 1.0
    # Interpolating by 4 means position 4t now has the angle position t used to have.
    rope = Transformer(ModelConfig(vocab_size=8, dim=64, n_layers=1, n_heads=4, pe="rope")).model.pe
    scaled = Transformer(ModelConfig(vocab_size=8, dim=64, n_layers=1, n_heads=4, pe="rope",
                                     pe_args=SCALINGS["linear"])).model.pe
    assert torch.allclose(scaled.rotary(torch.tensor([[0, 4, 8, 12]])), rope.rotary(torch.tensor([[0, 1, 2, 3]])),
                          atol=1e-6)


def test_dynamic_ntk_base_formula():
    short, _ = frequencies(SCALINGS["dynamic"], torch.arange(MAX_LEN))
    assert torch.equal(short, default_inv_freq(10000.0, HEAD_DIM))  # unchanged within the original context
    long, _ = frequencies(SCALINGS["dynamic"], torch.arange(3 * MAX_LEN))
    base = 10000.0 * ((2.0 * 3 * MAX_LEN / MAX_LEN) - 1) ** (HEAD_DIM / (HEAD_DIM - 2))
    assert torch.allclose(long, 1.0 / base ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))


def test_yarn_ramp_and_attention_factor():
    inv, factor = frequencies(SCALINGS["yarn"], torch.arange(4))
    plain = default_inv_freq(10000.0, HEAD_DIM)
    assert factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
    # High frequencies are kept, low ones are interpolated by the factor, the ones between lie in between.
    assert torch.allclose(inv[0], plain[0]) and torch.allclose(inv[-1], plain[-1] / 4.0)
    ratio = plain / inv
    assert ((ratio >= 1 - 1e-6) & (ratio <= 4 + 1e-6)).all() and (ratio.diff() >= -1e-6).all()


def test_llama3_wavelength_bands():
    args = {**SCALINGS["llama3"], "original_max_len": 64}  # long, medium and short bands all occur at d=16
    inv, _ = frequencies(args, torch.arange(4))
    plain = default_inv_freq(args["theta"], HEAD_DIM)
    wavelen = 2 * math.pi / plain
    long_waves = wavelen > args["original_max_len"] / args["low_freq_factor"]
    short_waves = wavelen < args["original_max_len"] / args["high_freq_factor"]
    assert torch.allclose(inv[long_waves], plain[long_waves] / args["factor"])
    assert torch.equal(inv[short_waves], plain[short_waves])
    medium = ~long_waves & ~short_waves
    assert long_waves.any() and short_waves.any() and medium.any()
    assert ((inv[medium] < plain[medium]) & (inv[medium] > plain[medium] / args["factor"])).all()


LONGROPE = {"scaling": "longrope", "original_max_len": 16, "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [1.0 + 1.5 * i for i in range(8)]}


@pytest.mark.parametrize("extra", [{}, {"factor": 8.0}, {"attention_factor": 0.9}, {"partial_rotary_factor": 0.5}])
def test_longrope_equals_transformers_compute_longrope_parameters(extra):
    """The short factors up to original_max_len, the long ones past it (transformers' switch on the largest position
    + 1 of a forward, for every token of it), and its attention factor (default from max_position_embeddings /
    original_max_position_embeddings, or from `factor`)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    args = {**LONGROPE, **extra}
    partial = args.get("partial_rotary_factor", 1.0)
    n = int(HEAD_DIM * partial) // 2
    args.update(short_factor=args["short_factor"][:n], long_factor=args["long_factor"][:n])
    params = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": args["short_factor"],
              "long_factor": args["long_factor"], "original_max_position_embeddings": 16,
              "partial_rotary_factor": partial, **{k: v for k, v in extra.items() if k != "partial_rotary_factor"}}
    config = transformers.Phi3Config(hidden_size=4 * HEAD_DIM, num_attention_heads=4, max_position_embeddings=MAX_LEN,
                                     original_max_position_embeddings=16, rope_parameters=params)
    compute = ROPE_INIT_FUNCTIONS["longrope"]
    for length, seq_len in ((16, None), (17, 17), (40, 40)):
        inv, factor = frequencies(args, torch.arange(length)[None])
        theirs, their_factor = compute(config, seq_len=seq_len)
        assert torch.equal(inv, theirs) and factor == their_factor, (length, extra)
    assert factor == extra.get("attention_factor", math.sqrt(1 + math.log(extra.get("factor", MAX_LEN / 16))
                                                             / math.log(16)))
    # One position past the original length switches the whole forward, earlier tokens included.
    short, _ = frequencies(args, torch.arange(16)[None])
    long, _ = frequencies(args, torch.tensor([[0, 1, 16]]))
    assert not torch.equal(short, long)


def test_longrope_cache_key_says_which_factors_the_keys_hold():
    config = ModelConfig(vocab_size=8, dim=4 * HEAD_DIM, n_layers=1, n_heads=4, max_seq_len=MAX_LEN, pe="rope",
                         pe_args=LONGROPE)
    pe = Transformer(config).model.pe
    assert [pe.cache_key(torch.arange(n)[None]) for n in (1, 16, 17)] == ["short", "short", "long"]
    assert pe.cache_key(torch.tensor([[16], [3]])) == "long"  # one row past it switches the batch, as transformers


@pytest.mark.parametrize("args, message", [
    ({**LONGROPE, "short_factor": [1.0] * 7}, "model.pe_args.short_factor: expected a list of 8 numbers (one per "
                                              "rotary frequency: head_dim 16 x partial_rotary_factor 1 / 2), got 7"),
    ({**LONGROPE, "partial_rotary_factor": 0.5}, "model.pe_args.short_factor: expected a list of 4 numbers"),
    ({**LONGROPE, "long_factor": 2.0}, "model.pe_args.long_factor: expected a list of 8 numbers (one per rotary "
                                       "frequency: head_dim 16 x partial_rotary_factor 1 / 2), got 2.0"),
    ({**LONGROPE, "long_factor": [1.0] * 7 + [-1.0]}, "model.pe_args.long_factor: every factor must be a finite "
                                                      "number > 0, got -1.0"),
    ({**LONGROPE, "long_factor": [1.0] * 7 + ["2"]}, "model.pe_args.long_factor: every factor must be a finite"),
    ({k: v for k, v in LONGROPE.items() if k != "long_factor"}, "model.pe_args.long_factor: scaling 'longrope' "
                                                                 "needs it: a list of 8 rescale factors"),
    ({"scaling": "yarn", "factor": 2.0, "short_factor": [1.0] * 8}, "model.pe_args.short_factor: only scaling "
                                                                    "'longrope' takes it (scaling is 'yarn')"),
    ({**LONGROPE, "hope": True}, "model.pe_args.hope: cannot combine with scaling 'longrope'"),
])
def test_longrope_arguments_are_checked_in_one_line(args, message):
    with pytest.raises(ValueError) as info:
        ModelConfig(vocab_size=8, dim=4 * HEAD_DIM, n_layers=1, n_heads=4, max_seq_len=MAX_LEN, pe="rope",
                    pe_args=args)
    assert message in str(info.value) and "\n" not in str(info.value)
