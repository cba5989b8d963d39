"""FoX: the layer equals an fp64 reference written from the paper's equations (D_ij summed gate by gate, every
logit materialised; the Pro parts and RoPE written out), outputs and gradients, on every CPU path; exact under
the KV cache (chunked prefill, left padding, token shifts carried across calls); gradients reach every parameter.

The generic tests (test_model.py, test_attention.py, test_generation.py) loop over PE_NAMES and cover it too.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import KVCache, attention, count_parameters
from tapecli.model.attention import chunked

PRO = {"output_gate": True, "output_norm": True, "qk_norm": True, "k_shift": True, "v_shift": True}


def rms(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x, position, theta):
    """RoPE on one head vector: pair (i, i + d/2) turned by position * theta^(-2i/d) (the frequency in fp32, as
    transformers and tape's RoPE compute it)."""
    half = x.shape[-1] // 2
    angle = position * (1.0 / theta ** (torch.arange(0, 2 * half, 2).float() / (2 * half))).to(x.dtype)
    a, b = x[:half], x[half:]
    return torch.cat((a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()))


def shifted(raw, alpha, real):
    """a_t raw_{t-1} + (1 - a_t) raw_t over one row's tokens (raw [T, d]); padding's raw is 0."""
    raw = raw * real[:, None]
    previous = torch.cat((torch.zeros_like(raw[:1]), raw[:-1]))
    return alpha[:, None] * previous + (1 - alpha[:, None]) * raw


def naive_fox(layer, x, q, k, v, real, positions, theta=500000.0):
    """The FoX layer's attention output [B, H, T, d] one (b, h, i) at a time: f_t = sigmoid(w_f . x_t + b_f),
    logits q_i . k_j / sqrt(d) + sum_{l=j+1..i} log f_l over real keys j <= i (a padded query also sees itself)."""
    B, H, T, d = q.shape
    G = k.shape[1]
    out = torch.zeros_like(q)
    gates = torch.sigmoid(x @ layer.fgate_proj.weight.T + layer.fgate_proj.bias)  # [B, T, H]
    for b in range(B):
        log_f = torch.where(real[b][:, None], gates[b].log(), torch.zeros_like(gates[b]))
        keys, values = [], []
        for g in range(G):
            key, value = k[b, g], v[b, g]
            if layer.k_shift_proj is not None:
                key = shifted(key, torch.sigmoid(x[b] @ layer.k_shift_proj.weight[g]), real[b].double())
            if layer.v_shift_proj is not None:
                value = shifted(value, torch.sigmoid(x[b] @ layer.v_shift_proj.weight[g]), real[b].double())
            if layer.k_norm is not None:
                key = rms(key, layer.k_norm[g], 1e-5)
            if layer.rope:
                key = torch.stack([rotate(key[t], positions[b, t], theta) for t in range(T)])
            keys.append(key)
            values.append(value)
        for h in range(H):
            g = h // (H // G)
            for i in range(T):
                query = q[b, h, i] if layer.q_norm is None else rms(q[b, h, i], layer.q_norm[h], 1e-5)
                if layer.rope:
                    query = rotate(query, positions[b, i], theta)
                seen = [j for j in range(i + 1) if real[b, j] or j == i]
                logits = torch.stack([query @ keys[g][j] / math.sqrt(d) + log_f[j + 1:i + 1, h].sum() for j in seen])
                o = logits.softmax(0) @ values[g][seen]
                if layer.output_norm is not None:
                    o = rms(o, layer.output_norm[h], layer.norm_eps)
                if layer.ogate_proj is not None:
                    o = o * torch.sigmoid(x[b, i] @ layer.ogate_proj.weight[h * d:(h + 1) * d].T)
                out[b, h, i] = o
    return out


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunked, "chunk_rows", lambda b, h, tq, tk, elements=0, window=None: max(1, min(4, tq)))


def layer_inputs(model, T=10, padded=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, 32, generator=gen, dtype=torch.float64)
    H, G = model.config.n_heads, model.config.n_kv_heads
    q = torch.randn(2, H, T, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, G, T, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    real = torch.ones(2, T, dtype=torch.bool)
    if padded:
        real[1, :3] = False  # left padding
        real[0, 6] = False  # and a hole
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    return [t.requires_grad_() for t in (x, q, k, v)], real, positions


@pytest.mark.parametrize("pe_args", [{}, {"rope": True}, PRO, {**PRO, "rope": True, "theta": 100.0}],
                         ids=["fox", "rope", "pro", "pro-rope"])
@pytest.mark.parametrize("padded", [False, True], ids=["plain", "padded"])
def test_layer_equals_the_equations(small_chunks, pe_args, padded):
    """Outputs and gradients (x, q, k, v and every FoX parameter) of the default CPU path (SDPA's fused kernel, or
    the chunked kernel with padding: several chunks) and of the materialised path equal the fp64 loop."""
    model = randomize_tape(tiny("fox", n_kv_heads=2, pe_args=pe_args), std=0.5).double()
    layer = model.model.layers[0].pe
    (x, q, k, v), real, positions = layer_inputs(model, padded=padded)
    state = model.model.pe.initial_state(positions, torch.float64)
    key_mask = real if padded else None
    want = naive_fox(layer, x, q, k, v, real, positions, pe_args.get("theta", 500000.0))
    params = [x, q, k, v, *layer.parameters()]
    g = torch.randn_like(want)
    for forced, name in ((None, "fox-flash"), ("dense", "fox-dense")):
        need = layer.need(state, False)
        with attention.forced(forced) if forced else torch.enable_grad():
            assert need.plan("cpu", torch.float64, 10, 10, True, False) == name
            got = need.attend(x, q, k, v, None, True, key_mask, None)
        rows = real[:, None, :, None]  # padded queries' outputs are meaningless by contract
        assert ((got - want) * rows).abs().max() <= 1e-12, name
        for a, b in zip(torch.autograd.grad(got * rows, params, g), torch.autograd.grad(want * rows, params, g,
                                                                                       retain_graph=True),
                        strict=True):
            assert (a - b).abs().max() <= 1e-10, name


@pytest.mark.parametrize("overrides", [{}, {"n_kv_heads": 2, "pe_args": {**PRO, "rope": True}}],
                         ids=["fox", "pro-rope-gqa"])
def test_cached_prefill_and_left_padding_equal_the_full_forward(small_chunks, overrides):
    """A left-padded batch prefilled through the KV cache in pieces, then decoded token by token (shift states and
    c carried in the cache), gives the logits of the full forward and of each row alone; greedy generation with
    chunked prefill equals generation without a cache."""
    model = randomize_tape(tiny("fox", **overrides), std=0.3).double().eval()
    x = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[0, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = KVCache(model.config.n_layers)
    with torch.no_grad(), attention.recording() as taken:
        full = model(x, attention_mask=mask)
        pieces = [model(x[:, a:b], start_pos=positions[:, a], cache=cache, attention_mask=mask[:, :b][:, a:b])
                  for a, b in ((0, 6), (6, 11), (11, 12), (12, 13), (13, 14))]
        alone = model(x[:1, 4:])
    assert {"fox-flash", "fox-dense"} <= set(taken)
    assert (torch.cat(pieces, 1) - full)[mask.bool()].abs().max() <= 1e-10
    assert (full[0, 4:] - alone[0]).abs().max() <= 1e-10
    assert cache.layers[0].buffers["fox_decay"].dtype == torch.float64
    assert torch.equal(model.generate(x, 4, attention_mask=mask, prefill_chunk=3),
                       model.generate(x, 4, attention_mask=mask, use_cache=False))


def test_gradients_reach_every_parameter_and_bf16_runs():
    model = randomize_tape(tiny("fox", n_kv_heads=2, pe_args={**PRO, "rope": True}), std=0.3)
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    model(x).pow(2).mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
        assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
        assert torch.equal(model.generate(x[:, :4], 5), model.generate(x[:, :4], 5, use_cache=False))


def test_parameter_counts():
    # Per layer: the forget gate (dim x heads + heads).
    assert count_parameters(tiny("fox"))["pe"] == 2 * (32 * 4 + 4)
    # Pro, grouped-query (2 key heads of 8): + output gate (dim x dim), output norm and q-norm (heads x d),
    # k-norm (key heads x d), two shifts (dim x key heads).
    pro = count_parameters(tiny("fox", n_kv_heads=2, pe_args=PRO))["pe"]
    assert pro == 2 * (32 * 4 + 4 + 32 * 32 + 32 + 32 + 16 + 2 * 32 * 2)


def test_bad_pe_args_are_clear():
    with pytest.raises(ValueError, match=r"model.pe_args.kernel: unknown value 'fast'; allowed: auto, torch"):
        tiny("fox", pe_args={"kernel": "fast"})
    with pytest.raises(ValueError, match=r"model.pe_args.pro: not an argument of pe 'fox'"):
        tiny("fox", pe_args={"pro": True})
    with pytest.raises(ValueError, match=r"model.causal: pe 'fox'"):
        tiny("fox", causal=False)


def test_plan_names_each_path():
    layer = tiny("fox").model.layers[0].pe
    cpu = dict(device_type="cpu", dtype=torch.float32, q_len=64, k_len=64, grad=True)
    assert layer.plan(**cpu, cached=False) == "fox-flash"
    assert layer.plan(**cpu, cached=True, padded=True) == "fox-flash"
    assert layer.plan(**{**cpu, "q_len": 1, "k_len": 65}, cached=True) == "fox-dense"
    with attention.forced("dense"):
        assert layer.plan(**cpu, cached=False) == "fox-dense"


@pytest.mark.parametrize("pe_args", [{}, {**PRO, "rope": True}], ids=["fox", "pro-rope"])
def test_causal_bit_for_bit(pe_args):
    """Changing the tokens from position 9 on leaves every earlier logit bit-identical (no row depends on a later
    token's gate)."""
    model = randomize_tape(tiny("fox", n_kv_heads=2, pe_args=pe_args), std=0.3)
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(6))
    y = x.clone()
    y[:, 9:] = (y[:, 9:] + 1) % VOCAB
    assert torch.equal(model(x)[:, :9], model(y)[:, :9]) and not torch.equal(model(x)[:, 9:], model(y)[:, 9:])
