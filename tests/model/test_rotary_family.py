"""RoPE's frequency options (p-RoPE, HoPE, FoPE, Hugging Face's partial rotary): attention equal to an fp64
reference written from the equations (every query/key pair rotated by explicit per-pair angles, every score
materialised), outputs and gradients; the options' frequencies and FoPE's coefficients as documented; the partial
rotary equal to transformers' own (Phi's); the combinations that cannot work refused in one line; and, with PoPE
and MapWM, causality and finite bf16 gradients.

The generic tests (test_model, test_generation, test_attention) run these options through the KV cache, chunked
prefill, left padding and the dense reference path like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import tiny

from tapecli.model import ModelConfig
from tapecli.model.attention import attend

D, H, G, T = 16, 4, 2, 11  # head_dim, query heads, key heads, tokens


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, width: int) -> torch.Tensor:
    """x [T, d] with pair (i, i + width/2) of the first `width` dims mapped by [[cos, -sin], [sin, cos]] at each
    token (cos, sin [T, width/2]), one element at a time; dims past `width` unchanged."""
    out = x.clone()
    half = width // 2
    for t in range(x.shape[0]):
        for i in range(half):
            a, b = x[t, i], x[t, i + half]
            out[t, i] = a * cos[t, i] - b * sin[t, i]
            out[t, i + half] = b * cos[t, i] + a * sin[t, i]
    return out


def reference_frequencies(option: dict, theta: float = 10000.0) -> list[float]:
    """w_i for the half pairs, from the equations: theta^(-2i/r) over the rotary width r; p-RoPE keeps the
    round(p r/2) highest; HoPE and FoPE zero every w_i with a period 2 pi / w_i longer than L (original_max_len,
    else the test models' max_seq_len 32)."""
    L = option.get("original_max_len", 32)
    r = int(D * option.get("partial_rotary_factor", 1.0))
    w = [theta ** (-2 * i / r) for i in range(r // 2)]
    keep = round(option.get("frequency_fraction", 1.0) * len(w))
    w = [wi if i < keep else 0.0 for i, wi in enumerate(w)]
    if option.get("hope") or option.get("fope"):
        w = [wi if wi > 0 and 2 * math.pi / wi <= L else 0.0 for wi in w]
    return w


def reference_attention(q, k, v, positions, option, pe):
    """softmax_j(q_i' . k_j' / sqrt(d)) v_j, causal, with q', k' rotated per the option's equations (fp64). The
    frequencies are the equations' rounded to fp32 as transformers computes them (the PE's own, checked equal)."""
    w = torch.tensor(reference_frequencies(option), dtype=torch.float64)
    assert torch.allclose(pe.inv_freq.double(), w, rtol=1e-6, atol=0) and torch.equal(pe.inv_freq == 0, w == 0)
    w = pe.inv_freq.double()
    r = 2 * len(w)
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for h in range(H):
            g = h // (H // G)
            angles = positions[b, :, None].double() * w  # [T, r/2]
            cos, sin = angles.cos(), angles.sin()
            if option.get("fope"):  # c_j(t) = sum_k C_kj cos(w_k t) / sum_k C_kj, kept frequencies only
                kept = w[w > 0]
                C, S = pe.fope_cos[g].double(), pe.fope_sin[g].double()
                m = C.shape[-1]
                base = positions[b, :, None].double() * kept
                cos, sin = torch.ones(T, r // 2, dtype=torch.float64), torch.zeros(T, r // 2, dtype=torch.float64)
                cos[:, :m], sin[:, :m] = base.cos() @ C, base.sin() @ S
            qr, kr = rotate_pairs(q[b, h], cos, sin, r), rotate_pairs(k[b, g], cos, sin, r)
            scores = qr @ kr.T / math.sqrt(D)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            out[b, h] = scores.softmax(-1) @ v[b, g]
    return out


OPTIONS = {
    "p-rope": {"frequency_fraction": 0.75},
    "hope": {"hope": True},
    "fope": {"fope": True},
    "fope-p": {"fope": True, "frequency_fraction": 0.5, "fope_sigma": 0.5},
    "partial": {"partial_rotary_factor": 0.5},
    "partial-p-rope": {"partial_rotary_factor": 0.5, "frequency_fraction": 0.5},
    "partial-fope": {"partial_rotary_factor": 0.5, "fope": True, "original_max_len": 128},
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_attention_equals_the_equations(name):
    """The PE's rotation + attention (the SDPA path) against the per-pair fp64 reference, outputs and gradients of
    q, k and v, at positions that are not 0..T-1 (a start offset and a second row further on)."""
    option = OPTIONS[name]
    model = tiny("rope", dim=H * D, n_heads=H, n_kv_heads=G, pe_args=option).double()
    pe, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T) + 3, torch.arange(T) + 20))
    state = pe.initial_state(positions, torch.float64)
    qr, kr = layer.rotate(q, k, state)
    got = attend(qr, kr, v, None, x=None, q_pos=positions, k_pos=positions, key_mask=None, cache=None)
    want = reference_attention(q, k, v, positions, option, pe)
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    for g, w in zip(torch.autograd.grad((got * weight).sum(), (q, k, v)),
                    torch.autograd.grad((want * weight).sum(), (q, k, v)), strict=True):
        assert (g - w).abs().max() <= 1e-12


def test_frequencies_are_the_documented_ones():
    for option in OPTIONS.values():
        if option.get("fope"):
            continue
        pe = tiny("rope", dim=H * D, n_heads=H, pe_args=option).model.pe
        assert torch.allclose(pe.inv_freq.double(), torch.tensor(reference_frequencies(option), dtype=torch.float64),
                              rtol=1e-6, atol=0)
    # p = 0 is NoPE, p = 1 RoPE; HoPE with a context longer than every period is RoPE.
    assert not tiny("rope", pe_args={"frequency_fraction": 0.0}).model.pe.inv_freq.any()
    assert torch.equal(tiny("rope", pe_args={"frequency_fraction": 1.0}).model.pe.inv_freq,
                       tiny("rope").model.pe.inv_freq)
    assert tiny("rope", pe_args={"hope": True, "original_max_len": 10**6}).model.pe.inv_freq.all()


def test_fope_coefficients():
    """Columns sum to 1; a step identity plus noise of gain sigma (sigma 0: the identity, so FoPE is HoPE when no
    more than d/4 frequencies are kept); one set per key head; the same in every build (seeded)."""
    fope = tiny("rope", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"fope": True}).model.pe
    assert fope.fope_cos.shape == (G, 2, 2)  # D = 2 kept frequencies of 8 at L = 32; m = min(2, 16 / 4)
    for coef in (fope.fope_cos, fope.fope_sin):
        assert torch.allclose(coef.sum(-2), torch.ones(G, 2, dtype=torch.float64))
    again = tiny("rope", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"fope": True}).model.pe
    assert torch.equal(again.fope_cos, fope.fope_cos) and not torch.equal(fope.fope_cos, fope.fope_sin)
    plain = tiny("rope", dim=H * D, n_heads=H, pe_args={"fope": True, "fope_sigma": 0.0})
    hope = tiny("rope", dim=H * D, n_heads=H, pe_args={"hope": True})
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(plain(x), hope(x), atol=1e-6)
    wide = tiny("rope", dim=4 * 32, n_heads=4, max_seq_len=4096, pe_args={"fope": True}).model.pe
    D_kept = int((wide.inv_freq > 0).sum())
    assert D_kept == 12 and wide.fope_cos.shape[-1] == 32 // 4  # m = d / 4 pairs carry a Fourier series
    noiseless = tiny("rope", dim=4 * 32, n_heads=4, max_seq_len=4096,
                     pe_args={"fope": True, "fope_sigma": 0.0}).model.pe
    assert noiseless.fope_cos[0].nonzero()[:, 0].tolist() == [0, 1, 3, 4, 6, 7, 9, 10]  # floor(j D / m)


def test_partial_rotary_equals_transformers_phi():
    """Hugging Face's partial rotary as transformers' Phi computes it (first r dims, pairs (i, i + r/2),
    frequencies over r): its rotary embedding and apply_rotary_pos_emb against our RotaryLayer."""
    phi = pytest.importorskip("transformers.models.phi.modeling_phi")
    config = phi.PhiConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5})
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, H, T, D, generator=gen) for _ in range(2))
    positions = torch.arange(T).expand(2, T) + 5
    cos, sin = phi.PhiRotaryEmbedding(config)(q, positions)
    rot = D // 2
    q_rot, k_rot = phi.apply_rotary_pos_emb(q[..., :rot], k[..., :rot], cos, sin)
    want_q, want_k = torch.cat((q_rot, q[..., rot:]), -1), torch.cat((k_rot, k[..., rot:]), -1)
    model = tiny("rope", dim=H * D, n_heads=H, pe_args={"partial_rotary_factor": 0.5})
    got_q, got_k = model.model.layers[0].pe.rotate(q, k, model.model.pe.initial_state(positions, torch.float32))
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


@pytest.mark.parametrize("pe,pe_args,key", [
    ("rope", {"frequency_fraction": 1.5}, "frequency_fraction"),
    ("rope", {"partial_rotary_factor": 0.0}, "partial_rotary_factor"),
    ("rope", {"fope_sigma": -1.0}, "fope_sigma"),
    ("rope", {"hope": True, "scaling": "dynamic", "factor": 2.0}, "hope"),
    ("xpos", {"fope": True}, "fope"),
    ("tape", {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ("rope", {"fope": True, "theta": 1e9, "original_max_len": 2}, "fope"),
])
def test_bad_options_are_one_line_naming_the_key(pe, pe_args, key):
    with pytest.raises(ValueError, match=f"model.pe_args.{key}") as info:
        ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, max_seq_len=32, pe=pe, pe_args=pe_args)
    assert "\n" not in str(info.value)


def test_zeroing_applies_to_every_rope_based_pe():
    """p-RoPE and HoPE only change frequencies, so xPos, RandPE and TAPE take them (TAPE's fresh model is still
    its RoPE model)."""
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    rope = tiny("rope", pe_args={"hope": True, "frequency_fraction": 0.5})
    tape = tiny("tape", pe_args={"hope": True, "frequency_fraction": 0.5})
    tape.load_state_dict(rope.state_dict(), strict=False)
    assert torch.allclose(rope(x), tape(x), atol=1e-5)
    assert tiny("xpos", pe_args={"hope": True}).model.pe.inv_freq[-1] == 0


@pytest.mark.parametrize("pe,pe_args", [("rope", OPTIONS["fope"]), ("rope", OPTIONS["partial-p-rope"]),
                                        ("rope", OPTIONS["hope"]), ("pope", {}), ("mapwm", {})])
def test_causal_and_finite_in_bf16(pe, pe_args):
    """Changing a token changes no logit before it (fp32); under bf16 autocast the loss and every gradient are
    finite. (The KV cache, chunked prefill and padding: the generic tests.)"""
    from test_model import randomize_tape

    model = randomize_tape(tiny(pe, n_kv_heads=2, pe_args=pe_args), std=0.3)
    x = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(5))
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % 61
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[:, :7], b[:, :7]) and (a[:, 7:] - b[:, 7:]).abs().max() > 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x)[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
