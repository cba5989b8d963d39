"""MapWM: attention equal to an fp64 reference written from MapFormer's equations (increments from the layer input,
their running sum, per-pair rotations, every score materialised), outputs and gradients down to the PE's
parameters and the input; the running sum carried by the KV cache; padding adds no increment.

The generic tests (test_model, test_generation, test_attention) run MapWM through the KV cache, chunked prefill,
left padding, bf16 and the dense reference path like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import KVCache, ModelConfig
from tapecli.model.attention import recording

H, G, T, D, DIM = 4, 2, 9, 8, 32


def reference(layer, x, q, k, v, real=None):
    """The definition, one token and pair at a time (fp64): delta_t = W_out (W_in x_t + b_in) + b_out per key head,
    theta_t = sum_{s <= t, s real} delta_s * exp(l), q_t and k_t rotated pair (i, i + d/2) by theta_t,
    softmax_s(q_t' . k_s' / sqrt(d)) v_s over the real keys s <= t (each query sees itself)."""
    B = x.shape[0]
    half = D // 2
    rank = layer.rank
    out = torch.zeros_like(q)
    for b in range(B):
        keys, queries = [], []
        for g in range(G):
            total = torch.zeros(half, dtype=torch.float64)
            rows = []
            for t in range(T):
                hidden = layer.theta_in.weight[g * rank:(g + 1) * rank] @ x[b, t] + layer.theta_in.bias[
                    g * rank:(g + 1) * rank]
                delta = layer.theta_out.weight @ hidden + layer.theta_out.bias
                if real is None or real[b, t]:
                    total = total + delta
                rows.append(total * layer.log_freq[g].exp())
            angles = torch.stack(rows)  # [T, half]

            def rotate(vec, angles=angles):
                a, c = vec[:, :half], vec[:, half:]
                return torch.cat((a * angles.cos() - c * angles.sin(), c * angles.cos() + a * angles.sin()), -1)

            keys.append(rotate(k[b, g]))
            queries.append([rotate(q[b, h]) for h in range(g * H // G, (g + 1) * H // G)])
        for h in range(H):
            g = h // (H // G)
            qh = queries[g][h - g * H // G]
            scores = qh @ keys[g].T / math.sqrt(D)
            allowed = torch.ones(T, T, dtype=torch.bool).tril()
            if real is not None:
                allowed &= real[b][None, :] | torch.eye(T, dtype=torch.bool)
            out[b, h] = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v[b, g]
    return out


def layer_and_inputs(seed=0):
    model = randomize_tape(tiny("mapwm", dim=DIM, n_heads=H, n_kv_heads=G, pe_args={"rank": 3}), std=0.3).double()
    layer = model.model.layers[0].pe
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, DIM, generator=gen, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    return layer, x, q, k, v


@pytest.mark.parametrize("padded", [False, True])
def test_attention_equals_the_equations(padded):
    layer, x, q, k, v = layer_and_inputs()
    real = None
    if padded:
        real = torch.ones(2, T, dtype=torch.bool)
        real[1, :3] = False
    with recording() as taken:
        got = layer.attend(x, q, k, v, None, True, real, None)
    assert taken == ["chunked" if padded else "sdpa"]
    want = reference(layer, x, q, k, v, real)
    rows = torch.ones(2, T, dtype=torch.bool) if real is None else real
    assert (got - want).transpose(1, 2)[rows].abs().max() <= 1e-12
    inputs = (x, q, k, v, *[p for p in layer.parameters()])
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got) * rows[:, None, :, None]
    for g, w in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (g - w).abs().max() <= 1e-11


def test_the_cache_carries_the_running_sum():
    """Prefill 5 tokens, then 3, then 1 at a time: outputs equal one pass, the cache's running sum is the last
    token's theta and its keys are the rotated keys (rewritten in place, the raw ones never kept)."""
    layer, x, q, k, v = layer_and_inputs(seed=1)
    with torch.no_grad():
        full = layer.attend(x, q, k, v, None, True, None, None)
        cache = KVCache(1).layers[0]
        outs = []
        for start, stop in ((0, 5), (5, 8), (8, 9)):
            cache.owner.length = stop
            kk, vv = cache.append(k=k[:, :, start:stop], v=v[:, :, start:stop])
            outs.append(layer.attend(x[:, start:stop], q[:, :, start:stop], kk, vv, None, True, None, cache))
        assert (torch.cat(outs, dim=2) - full).abs().max() <= 1e-12
        theta, angles = layer.angles(x, None, None)
        assert torch.allclose(cache.state["mapwm_angle"], theta[:, :, -1], atol=1e-12, rtol=0)
        rotary = torch.cat((angles.cos(), angles.sin()), -1)
        from tapecli.model.pe.base import apply_rotary

        assert (cache.buffers["k"][:, :, :9] - apply_rotary(k, rotary)).abs().max() <= 1e-12


def test_left_padding_does_not_advance_the_sum():
    model = randomize_tape(tiny("mapwm", n_kv_heads=2), std=0.3).double().eval()
    x = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    padded = torch.cat((torch.zeros(1, 4, dtype=torch.long), x), dim=1)
    mask = torch.cat((torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 6, dtype=torch.long)), dim=1)
    with torch.no_grad():
        alone, with_pad = KVCache(2), KVCache(2)
        want = model(x, cache=alone)
        got = model(padded, cache=with_pad, attention_mask=mask)
    assert (got[:, 4:] - want).abs().max() <= 1e-10
    for a, b in zip(alone.layers, with_pad.layers, strict=True):
        assert (a.state["mapwm_angle"] - b.state["mapwm_angle"]).abs().max() <= 1e-12


def test_init_follows_the_authors_code():
    """Biases zero, frequencies base^(-(i+1)/(d/2)) with base = max_seq_len, weights N(0, init_std): a fresh
    MapWM's increments are small and content-dependent."""
    layer = tiny("mapwm", n_kv_heads=2, max_seq_len=64).model.layers[0].pe
    assert not layer.theta_in.bias.any() and not layer.theta_out.bias.any()
    want = 64.0 ** (-torch.arange(1, 5, dtype=torch.float64) / 4)
    assert torch.allclose(layer.log_freq.exp().double(), want.expand(2, -1), rtol=1e-6)
    assert abs(layer.theta_in.weight.std().item() - 0.02) < 0.005


def test_bad_pe_args_are_clear():
    for pe_args, key in (({"rank": 0}, "rank"), ({"freq_base": 0.5}, "freq_base")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="mapwm", pe_args=pe_args)
