"""GRAPE-AP (path-integral additive GRAPE): attention equal to an fp64 reference written from the paper's path sum
b_h(t, j) = sum_{l=j+1..t} psi_h(t, l) with the official potential (one query-key pair and one path token at a
time), outputs and gradients down to the positional projection, at several lengths, on the chunked path (several
chunks) and the dense one; the paper's special cases reduce exactly to tape's ALiBi and FoX (logits, with and
without padding); the gated GRAPE-A forms against the paper's gated bias (one pair at a time) and equal to ALiBi
with constant gates; bad pe_args and `tape export` refused in one line.

The generic tests (test_model, test_generation, test_attention, test_pe_check, test_train) run it through the KV
cache, chunked prefill, padding, bf16, fp64, training and resuming like every PE.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from test_model import VOCAB, tiny

from tapecli.errors import TapeError
from tapecli.model import ModelConfig, attention
from tapecli.model.attention import recompute
from tapecli.model.hf.export import check_exportable
from tapecli.pe.check import Subject, run_check

H, G, D, DP = 4, 2, 8, 6


def reference(layer, x, q, k, v, positions):
    """softmax_j(q_t . k_j / sqrt(d) + sum_{l=j+1..t} m_h log sigmoid(p_t . R(l) p^_l / D_p)) v_j, j <= t; p = W_p x
    per head, p^ = p / rms(p), R(l) the rotation of every pair (i, i + D_p/2) by -l."""
    B, T, _ = x.shape
    W = layer.p_proj.weight.view(H, DP, -1)
    eps = torch.finfo(torch.float64).eps
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            p = x[b] @ W[h].T  # [T, D_p]
            normed = p / (p.pow(2).mean(-1, keepdim=True) + eps).sqrt()
            rotated = []
            for t in range(T):
                c, s = math.cos(positions[b, t]), math.sin(positions[b, t])
                a, z = normed[t, :DP // 2], normed[t, DP // 2:]
                rotated.append(torch.cat((a * c + z * s, z * c - a * s)))
            logits = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for t in range(T):
                for j in range(t + 1):
                    bias = torch.zeros((), dtype=torch.float64)
                    for lt in range(j + 1, t + 1):
                        bias = bias + layer.slopes[h] * torch.nn.functional.logsigmoid(p[t] @ rotated[lt] / DP)
                    logits[t, j] = q[b, h, t] @ k[b, h // (H // G), j] / math.sqrt(D) + bias
            out[b, h] = logits.softmax(-1) @ v[b, h // (H // G)]
    return out


@pytest.mark.parametrize("T", [3, 9, 17])
@pytest.mark.parametrize("path", ["chunked", "dense"])
def test_attention_equals_the_path_sum(monkeypatch, T, path):
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 17 * 2)  # a few queries per chunk: several chunks
    model = tiny("grape-ap", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"p_head_dim": DP}).double()
    layer = model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    with torch.no_grad():
        layer.p_proj.weight.normal_(0, 0.5, generator=gen)
    x = torch.randn(2, T, H * D, generator=gen, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T), torch.arange(T) + 11))
    got = attend_on(path, model, x, q, k, v, positions)
    assert_equal_with_gradients(got, reference(layer, x, q, k, v, positions), (x, q, k, v, layer.p_proj.weight))


def attend_on(path, model, x, q, k, v, positions):
    """The first layer's attention on its chunked path or, under attention.forced("dense"), its dense one."""
    need = model.model.layers[0].pe.need(model.model.pe.initial_state(positions, torch.float64), False)
    with attention.forced("dense") if path == "dense" else contextlib.nullcontext():
        return need.attend(x, q, k, v, None, True, None, None)


def assert_equal_with_gradients(got, want, inputs):
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item())


def gated_reference(layer, q, k, v):
    """GRAPE-A's gated linear bias (the paper's Eq. 4.5, the official gated forms): softmax_j(q_t . k_j / sqrt(d)
    - (t - j) softplus(o_h) m_h (softplus(v^_h . q_t / sqrt(d)) + softplus(u^_h . k_j / sqrt(d)))) v_j, j <= t, with
    u^ = u / max(|u|, 1e-6) and v^ likewise (a gate left out where the form has none)."""
    B, _, T, _ = q.shape
    out = torch.zeros_like(q)
    unit = lambda w: w / torch.clamp(w.norm(), min=1e-6)  # noqa: E731
    sp = torch.nn.functional.softplus
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            logits = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for t in range(T):
                for j in range(t + 1):
                    rate = torch.zeros((), dtype=torch.float64)
                    if layer.gate_v is not None:
                        rate = rate + sp(unit(layer.gate_v[h]) @ q[b, h, t] / math.sqrt(D))
                    if layer.gate_u is not None:
                        rate = rate + sp(unit(layer.gate_u[h]) @ k[b, g, j] / math.sqrt(D))
                    bias = -(t - j) * sp(layer.gate_omega[h]) * layer.slopes[h] * rate
                    logits[t, j] = q[b, h, t] @ k[b, g, j] / math.sqrt(D) + bias
            out[b, h] = logits.softmax(-1) @ v[b, g]
    return out


@pytest.mark.parametrize("T", [3, 9, 17])
@pytest.mark.parametrize("form", ["querygated", "keygated", "querykeygated"])
@pytest.mark.parametrize("path", ["chunked", "dense"])
def test_gated_forms_equal_the_papers_bias(monkeypatch, T, form, path):
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 17 * 2)  # a few queries per chunk: several chunks
    model = tiny("grape-ap", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"potential": form}).double()
    layer = model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    with torch.no_grad():
        layer.gate_omega.normal_(0, 1, generator=gen)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T), torch.arange(T) + 11))
    got = attend_on(path, model, None, q, k, v, positions)
    inputs = (q, k, v, *layer.parameters())
    assert len(inputs) == (6 if form == "querykeygated" else 5)
    assert_equal_with_gradients(got, gated_reference(layer, q, k, v), inputs)


@pytest.mark.parametrize("form", ["querygated", "keygated", "querykeygated"])
def test_gated_forms_with_constant_gates_are_alibi_exactly(form):
    """Zero gate vectors make every gate softplus(0) = log 2: with softplus(o_h) = 1 / (log 2 per gate) the bias is
    -m_h (t - j), ALiBi's (logits with and without padding); the official init is N(0, 1/d) vectors, softplus(o) = 1."""
    x = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(3))
    grape = tiny("grape-ap", n_kv_heads=2, pe_args={"potential": form}).double()
    layer = grape.model.layers[0].pe
    assert torch.allclose(torch.nn.functional.softplus(layer.gate_omega), torch.ones(4, dtype=torch.float64))
    vector = layer.gate_v if layer.gate_v is not None else layer.gate_u
    assert 0.2 < vector.std() * math.sqrt(8) < 2.5  # N(0, 1/d), d = 8
    alibi = tiny("alibi", n_kv_heads=2).double()
    alibi.load_state_dict({k: v for k, v in grape.state_dict().items() if ".pe." not in k})
    gates = 2 if form == "querykeygated" else 1
    with torch.no_grad():
        for named, p in grape.named_parameters():
            if ".gate_u" in named or ".gate_v" in named:
                p.zero_()
            elif ".gate_omega" in named:
                p.fill_(math.log(math.expm1(1 / (gates * math.log(2)))))
    for got, want in zip(padded_logits(grape, x), padded_logits(alibi, x), strict=True):
        assert (got - want).abs().max() <= 1e-12


def test_gated_forms_are_exact_on_every_path():
    """tape pe check's exact checks, gated by queries and keys: the dense path vs every score materialised (with
    padding), the KV cache through decoding and chunked prefill, padding, save-load."""
    subject = Subject("grape-ap", {"potential": "querykeygated"}, torch.device("cpu"))
    for name in ("dense", "kv-cache", "chunked-prefill", "padding", "save-load"):
        outcome = run_check(name, subject)
        assert outcome.ok, (name, outcome.text)


def padded_logits(model, x):
    mask = torch.ones_like(x)
    mask[1, :4] = 0
    real = mask.bool()
    return model(x)[:, :], model(x, attention_mask=mask)[real]


@pytest.mark.parametrize("special", ["alibi", "fox"])
def test_the_papers_special_cases_are_alibi_and_fox_exactly(special):
    """psi = -m_h is ALiBi's bias; psi = log sigmoid(w_h . x_l + b_h) is FoX's forget gates (its parameters loaded
    into GRAPE-AP under the same names)."""
    x = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(3))
    grape = tiny("grape-ap", n_kv_heads=2, pe_args={"potential": special}).double()
    other = tiny(special, n_kv_heads=2).double()
    if special == "fox":
        with torch.no_grad():
            for layer in other.model.layers:
                layer.pe.fgate_proj.weight.normal_(0, 0.5)
                layer.pe.fgate_proj.bias.uniform_(-1, 3)
        grape.load_state_dict(other.state_dict())
    assert grape.state_dict().keys() == other.state_dict().keys()
    for got, want in zip(padded_logits(grape, x), padded_logits(other, x), strict=True):
        assert (got - want).abs().max() <= 1e-12


def test_bad_pe_args_and_export_are_refused_in_one_line():
    for args, key in (({"potential": "kerple"}, "potential"), ({"p_head_dim": 3}, "p_head_dim"),
                      ({"p_head_dim": -2}, "p_head_dim")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="grape-ap", pe_args=args)
    with pytest.raises(TapeError, match="pe 'grape-ap' has no Hugging Face Llama equivalent"):
        check_exportable(tiny("grape-ap"))
    assert tiny("grape-ap").model.layers[0].pe.p_proj.weight.shape == (4 * 8, 32)  # p_head_dim 0: head_dim
