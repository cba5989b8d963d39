"""PoPE: attention equal to an fp64 reference written from the paper's complex-number equations (every score
materialised), outputs and gradients (the phase bias included); magnitudes from content only, phases from position
only; the frequencies and the bias clamp as documented.

The generic tests (test_model, test_generation, test_attention) run PoPE through the KV cache, chunked prefill,
left padding, bf16 and the dense reference path like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import VOCAB, tiny

from tapecli.model import ModelConfig
from tapecli.model.attention import attend

H, G, T, D = 4, 2, 10, 8


def reference(q, k, v, positions, bias, w):
    """softmax_s(Re[sum_c q~_tc conj(k~_sc)] / sqrt(d)) v_s, causal, with q~ = softplus(q) e^(i t w),
    k~ = softplus(k) e^(i (s w + delta)), delta clamped to [-2 pi, 0] (complex128, one query head at a time). `w`:
    w_c = theta^(-c/d) as the PE holds them (rounded to fp32; test_frequencies_are_d_per_head checks them)."""
    w = w.double()
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        t = positions[b].double()[:, None]
        for h in range(H):
            g = h // (H // G)
            delta = bias[h].clamp(-2 * math.pi, 0.0) if bias is not None else torch.zeros(D, dtype=torch.float64)
            qc = torch.polar(torch.nn.functional.softplus(q[b, h]), t * w)
            kc = torch.polar(torch.nn.functional.softplus(k[b, g]), t * w + delta)
            scores = (qc @ kc.conj().T).real / math.sqrt(D)
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
            out[b, h] = scores.softmax(-1) @ v[b, g]
    return out


@pytest.mark.parametrize("bias", [True, False])
def test_attention_equals_the_complex_equations(bias):
    model = tiny("pope", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"bias": bias}).double()
    pe, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(0)
    if bias:  # a bias inside the clamp range, and entries beyond it on both sides
        with torch.no_grad():
            layer.bias.copy_(torch.empty(H, D, dtype=torch.float64).uniform_(-7.5, 1.0, generator=gen))
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T) + 2, torch.arange(T) + 40))
    qr, kr = layer.rotate(q, k, pe.initial_state(positions, torch.float64))
    assert qr.shape == (2, H, T, 2 * D) and kr.shape == (2, G, T, 2 * D)
    got = attend(qr, kr, v, None, x=None, q_pos=positions, k_pos=positions, key_mask=None, cache=None)
    want = reference(q, k, v, positions, layer.bias if bias else None, pe.inv_freq)
    assert got.shape == v.shape[:1] + (H,) + v.shape[2:]
    assert (got - want).abs().max() <= 1e-12
    inputs = (q, k, v, layer.bias) if bias else (q, k, v)
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    for g, w in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (g - w).abs().max() <= 1e-12
    if bias:  # the clamp: entries beyond [-2 pi, 0] get no gradient, the others do
        grad = torch.autograd.grad((attend(*layer.rotate(q, k, pe.initial_state(positions, torch.float64)), v,
                                           None, x=None, q_pos=positions, k_pos=positions, key_mask=None,
                                           cache=None) * weight).sum(), layer.bias)[0]
        outside = (layer.bias < -2 * math.pi) | (layer.bias > 0)
        assert outside.any() and not grad[outside].any() and grad[~outside].abs().min() > 0


def test_what_and_where_are_decoupled():
    """Magnitudes come from content only: flipping a component's sign (which RoPE would read as a phase of pi)
    changes only its softplus magnitude; phases come from position only: scores depend on t - s alone."""
    model = tiny("pope", dim=H * D, n_heads=H, pe_args={"bias": False}).double()
    pe, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, H, T, D, generator=gen, dtype=torch.float64), torch.randn(1, H, T, D, generator=gen,
                                                                                    dtype=torch.float64)
    scores = []
    for start in (0, 13):
        qr, kr = layer.rotate(q, k, pe.initial_state(torch.arange(T)[None] + start, torch.float64))
        scores.append(qr @ kr.transpose(-1, -2))
    assert (scores[0] - scores[1]).abs().max() <= 1e-10  # shift invariant
    qr, kr = layer.rotate(q, k, pe.initial_state(torch.arange(T)[None], torch.float64))
    magnitude = (qr[..., :D] ** 2 + qr[..., D:] ** 2).sqrt() / math.sqrt(2)
    assert torch.allclose(magnitude, torch.nn.functional.softplus(q))


def test_frequencies_are_d_per_head():
    pe = tiny("pope", dim=H * D, n_heads=H).model.pe
    assert pe.inv_freq.shape == (D,)
    assert torch.allclose(pe.inv_freq.double(), 10000.0 ** (-torch.arange(D, dtype=torch.float64) / D), rtol=1e-6)
    assert tiny("pope").model.layers[0].pe.bias.abs().sum() == 0  # starts at zero


def test_fresh_model_trains_and_counts_its_bias():
    from tapecli.model import count_parameters

    model = tiny("pope", n_kv_heads=2)
    assert count_parameters(model)["pe"] == 2 * 4 * 8  # layers x heads x head_dim
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    model(x).logsumexp(-1).sum().backward()
    assert all(layer.pe.bias.grad.abs().sum() > 0 for layer in model.model.layers)
    assert count_parameters(tiny("pope", pe_args={"bias": False}))["pe"] == 0


def test_bad_pe_args_are_clear():
    with pytest.raises(ValueError, match="model.pe_args.theta"):
        ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="pope", pe_args={"theta": 0.5})
