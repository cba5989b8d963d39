"""DAPE: attention equal to an fp64 reference written from the paper's equation (every head's logit and bias of one
query-key pair through the MLP, one pair at a time), outputs and gradients down to the MLP and KERPLE's
parameters, at several lengths, with ALiBi and KERPLE bases, on its chunked path (several chunks) and its dense
reference path; the official initialisation; bad pe_args and `tape export` refused in one line.

The generic tests (test_model, test_generation, test_attention, test_pe_check, test_probe, test_train) run it
through the KV cache, chunked prefill, padding, bf16, fp64, probing, training and resuming like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import tiny

from tapecli.errors import TapeError
from tapecli.model import ModelConfig, attention
from tapecli.model.attention import recompute
from tapecli.model.hf.export import check_exportable

H, G, D = 4, 2, 8


def reference(layer, q, k, v, positions):
    """softmax_j(A_ij + B_ij + W2 leaky_relu(W1 [A_ij ; B_ij] + b1) + b2) v_j over j <= i, A_ij = q_i . k_j / sqrt(d)
    per head, B the base bias (ALiBi: -m_h (i - j); KERPLE: -max(r1, .01) log(1 + max(r2, .01) (i - j)))."""
    W1, b1, W2, b2 = layer.mlp[0].weight, layer.mlp[0].bias, layer.mlp[2].weight, layer.mlp[2].bias
    Bn, _, T, _ = q.shape
    out = torch.zeros_like(q)
    for b in range(Bn):
        logits = torch.full((H, T, T), float("-inf"), dtype=torch.float64)
        for i in range(T):
            for j in range(i + 1):
                n = positions[b, i] - positions[b, j]
                A = torch.stack([q[b, h, i] @ k[b, h // (H // G), j] for h in range(H)]) / math.sqrt(D)
                if layer.base == "alibi":
                    bias = -layer.slopes.double() * n
                else:
                    bias = -layer.r1.clamp(min=0.01) * torch.log(1 + layer.r2.clamp(min=0.01) * n)
                hidden = torch.nn.functional.leaky_relu(W1 @ torch.cat((A, bias)) + b1, 0.01)
                logits[:, i, j] = A + bias + W2 @ hidden + b2
        for h in range(H):
            out[b, h] = logits[h].softmax(-1) @ v[b, h // (H // G)]
    return out


@pytest.mark.parametrize("T", [3, 10, 23])
@pytest.mark.parametrize("base", ["kerple", "alibi"])
@pytest.mark.parametrize("path", ["chunked", "dense"])
def test_attention_equals_the_papers_equation(monkeypatch, T, base, path):
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 12 * 24 * 4)  # ~4 queries per chunk: several chunks
    model = tiny("dape", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"base": base, "mlp_width": 12}).double()
    pe, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T), torch.arange(T) + 70))
    need = layer.need(pe.initial_state(positions, torch.float64), False)
    assert need.plan("cpu", torch.float32, T, T, True, False) == "dape-chunked"
    if path == "dense":
        with attention.forced("dense"):
            got = need.attend(None, q, k, v, None, True, None, None)
    else:
        got = need.attend(None, q, k, v, None, True, None, None)
    want = reference(layer, q, k, v, positions)
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    inputs = (q, k, v, *layer.parameters())
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item())


def test_official_initialisation():
    torch.manual_seed(0)
    layer = tiny("dape", dim=64, n_heads=8).model.layers[0].pe
    assert layer.mlp[0].weight.shape == (32, 16) and layer.mlp[2].weight.shape == (8, 32)
    bound = 1 / math.sqrt(16)  # PyTorch's default linear init, not tape's N(0, 0.02)
    assert layer.mlp[0].weight.abs().max() <= bound and layer.mlp[0].weight.std() > 0.1
    assert 0 <= layer.r1.min() and layer.r1.max() <= 2 and 0 <= layer.r2.min() and layer.r2.max() <= 1
    alibi = tiny("dape", dim=64, n_heads=8, pe_args={"base": "alibi"}).model.layers[0].pe
    assert alibi.r1 is None and torch.allclose(alibi.slopes, 2.0 ** (-torch.arange(1, 9).float()))


def test_bad_pe_args_and_export_are_refused_in_one_line():
    for args, key in (({"base": "fire"}, "base"), ({"mlp_width": 0}, "mlp_width")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="dape", pe_args=args)
    with pytest.raises(TapeError, match="pe 'dape' has no Hugging Face Llama equivalent"):
        check_exportable(tiny("dape"))
