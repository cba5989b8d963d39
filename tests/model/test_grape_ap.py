"""GRAPE-AP (path-integral additive GRAPE): attention equal to an fp64 reference written from the paper's path sum
b_h(t, j) = sum_{l=j+1..t} psi_h(t, l) with the official potential (one query-key pair and one path token at a
time), outputs and gradients down to the positional projection, at several lengths, on the chunked path (several
chunks) and the dense one; the paper's special cases reduce exactly to tape's ALiBi and FoX (logits, with and
without padding); bad pe_args and `tape export` refused in one line.

The generic tests (test_model, test_generation, test_attention, test_pe_check, test_train) run it through the KV
cache, chunked prefill, padding, bf16, fp64, training and resuming like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import VOCAB, tiny

from tapecli.errors import TapeError
from tapecli.model import ModelConfig, attention
from tapecli.model.attention import recompute
from tapecli.model.hf.export import check_exportable

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
    need = layer.need(model.model.pe.initial_state(positions, torch.float64), False)
    if path == "dense":
        with attention.forced("dense"):
            got = need.attend(x, q, k, v, None, True, None, None)
    else:
        got = need.attend(x, q, k, v, None, True, None, None)
    want = reference(layer, x, q, k, v, positions)
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    inputs = (x, q, k, v, layer.p_proj.weight)
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item())


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
