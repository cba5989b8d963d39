"""DAPE: attention equal to an fp64 reference written from the papers' equations (v1: every head's logit and bias of
one query-key pair through the MLP, one pair at a time; v2: each query's row of logits and biases through the two
convolutions, one key at a time), outputs and gradients down to f and the base's parameters, at several lengths,
with ALiBi, KERPLE and FIRE bases, on its chunked path (several chunks) and its dense reference path; v2 with a zero
convolution is its base (ALiBi's model exactly); the official initialisation; bad pe_args and `tape export`
refused in one line.

The generic tests (test_model, test_generation, test_attention, test_pe_check, test_probe, test_train) run it
through the KV cache, chunked prefill, padding, bf16, fp64, probing, training and resuming like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import tiny, tokens

from tapecli.errors import TapeError
from tapecli.model import ModelConfig, attention
from tapecli.model.attention import recompute
from tapecli.model.hf.export import check_exportable
from tapecli.pe.check import Subject, run_check

H, G, D = 4, 2, 8


def base_bias(layer, n, i):
    """B_h at distance n = i - j of a query at position i: ALiBi -m_h n; KERPLE -max(r1, .01) log(1 + max(r2, .01) n);
    FIRE g(psi(n) / (psi(max(i, L)) + 1e-6)), psi(z) = log(|c z| + 1), L = |l L0|."""
    if layer.base == "alibi":
        return -layer.slopes.double() * n
    if layer.base == "kerple":
        return -layer.r1.clamp(min=0.01) * torch.log(1 + layer.r2.clamp(min=0.01) * n)
    c, L = layer.c, torch.abs(layer.threshold_scale * layer.threshold)
    psi = lambda z: torch.log(torch.abs(c * z) + 1)  # noqa: E731
    z = psi(torch.as_tensor(n, dtype=torch.float64)) / (psi(torch.maximum(torch.as_tensor(i).double(), L)) + 1e-6)
    W1, b1, W2, b2 = layer.fire[0].weight, layer.fire[0].bias, layer.fire[2].weight, layer.fire[2].bias
    return W2 @ torch.nn.functional.leaky_relu(W1[:, 0] * z + b1, 0.01) + b2


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
                bias = base_bias(layer, n, positions[b, i])
                hidden = torch.nn.functional.leaky_relu(W1 @ torch.cat((A, bias)) + b1, 0.01)
                logits[:, i, j] = A + bias + W2 @ hidden + b2
        for h in range(H):
            out[b, h] = logits[h].softmax(-1) @ v[b, h // (H // G)]
    return out


def reference_v2(layer, q, k, v, positions):
    """DAPE v2: logits_i = A_i + B_i + F_i with each query's row of features X_i[c, j] = [A_ij ; B_ij] for the keys
    j <= i it sees and 0 after them (the official torch.tril), then, along the keys (p = kernel // 2),
        U[u, j] = leaky_relu(b1_u + sum_{c, t=-p..p} W1[u, c, t] X_i[c, j + t])    j = 0 .. i + p  (X = 0 at j < 0)
        F_i[h, j] = b2_h + sum_{u, t=-p..p} W2[h, u, t] U[u, j + t]               j = 0 .. i      (U = 0 at j < 0)"""
    W1, b1, W2, b2 = (t.double() for t in (layer.conv[0].weight[:, :, 0], layer.conv[0].bias,
                                           layer.conv[2].weight[:, :, 0], layer.conv[2].bias))
    p = W1.shape[-1] // 2
    Bn, _, T, _ = q.shape
    out = torch.zeros_like(q)
    for b in range(Bn):
        for i in range(T):
            X = torch.zeros(2 * H, i + 1 + 2 * p, dtype=torch.float64)  # keys 0 .. i + 2p
            for j in range(i + 1):
                A = torch.stack([q[b, h, i] @ k[b, h // (H // G), j] for h in range(H)]) / math.sqrt(D)
                X[:, j] = torch.cat((A, base_bias(layer, positions[b, i] - positions[b, j], positions[b, i])))
            at = lambda M, j: M[:, j] if 0 <= j < M.shape[1] else torch.zeros(M.shape[0], dtype=torch.float64)  # noqa: E731
            U = torch.stack([torch.nn.functional.leaky_relu(
                b1 + sum(W1[:, :, t + p] @ at(X, j + t) for t in range(-p, p + 1)), 0.01) for j in range(i + 1 + p)], 1)
            F = torch.stack([b2 + sum(W2[:, :, t + p] @ at(U, j + t) for t in range(-p, p + 1))
                             for j in range(i + 1)], 1)
            logits = X[:H, : i + 1] + X[H:, : i + 1] + F  # [H, i + 1]
            for h in range(H):
                out[b, h, i] = logits[h].softmax(-1) @ v[b, h // (H // G), : i + 1]
    return out


@pytest.mark.parametrize("T", [3, 10, 23])
@pytest.mark.parametrize("version,base", [(1, "kerple"), (1, "alibi"), (1, "fire"), (2, "kerple"), (2, "alibi"),
                                          (2, "fire")])
@pytest.mark.parametrize("path", ["chunked", "dense"])
def test_attention_equals_the_papers_equation(monkeypatch, T, version, base, path):
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 12 * 24 * 4)  # ~4 queries per chunk: several chunks
    args = {"version": version, "base": base, "mlp_width": 12}
    if version == 2:
        args["kernel"] = 5 if T == 10 else 3
    if base == "fire":
        args["threshold"] = 8.0  # below the longest positions: both sides of max(i, L)
    model = tiny("dape", dim=H * D, n_heads=H, n_kv_heads=G, pe_args=args).double()
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
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    inputs = (q, k, v, *layer.parameters())
    want, want_grads = reference_and_gradients(layer, inputs, positions, weight, (version, base, sorted(args.items())))
    assert (got - want).abs().max() <= 1e-12
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs), want_grads, strict=True):
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item())


_REFERENCES: dict[tuple, tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}


def reference_and_gradients(layer, inputs: tuple, positions, weight, case: tuple) -> tuple[torch.Tensor, tuple]:
    """The reference output for `inputs` (q, k, v, then the layer's parameters) and the gradients of its sum
    weighted by `weight` with respect to them. Both attention paths of a case start from the same inputs (the same
    seeds), so the reference loop runs once per distinct input: keyed by the case and the bytes of every tensor it
    reads (the inputs, the layer's buffers, the positions, the weight)."""
    tensors = (*inputs, *layer.buffers(), positions, weight)
    key = (repr(case), *(bytes(t.detach().contiguous().view(-1).view(torch.uint8).numpy()) for t in tensors))
    if key not in _REFERENCES:
        q, k, v = inputs[:3]
        want = (reference if case[0] == 1 else reference_v2)(layer, q, k, v, positions)
        _REFERENCES[key] = want.detach(), torch.autograd.grad((want * weight).sum(), inputs)
    return _REFERENCES[key]


def test_official_initialisation():
    torch.manual_seed(0)
    layer = tiny("dape", dim=64, n_heads=8).model.layers[0].pe
    assert layer.mlp[0].weight.shape == (32, 16) and layer.mlp[2].weight.shape == (8, 32)
    bound = 1 / math.sqrt(16)  # PyTorch's default linear init, not tape's N(0, 0.02)
    assert layer.mlp[0].weight.abs().max() <= bound and layer.mlp[0].weight.std() > 0.1
    assert 0 <= layer.r1.min() and layer.r1.max() <= 2 and 0 <= layer.r2.min() and layer.r2.max() <= 1
    alibi = tiny("dape", dim=64, n_heads=8, pe_args={"base": "alibi"}).model.layers[0].pe
    assert alibi.r1 is None and torch.allclose(alibi.slopes, 2.0 ** (-torch.arange(1, 9).float()))
    v2 = tiny("dape", dim=64, n_heads=8, pe_args={"version": 2, "base": "fire"}).model.layers[0].pe
    assert v2.conv[0].weight.shape == (32, 16, 1, 3) and v2.conv[2].weight.shape == (8, 32, 1, 3)
    assert v2.conv[0].weight.abs().max() <= 1 / math.sqrt(16 * 3) and v2.conv[0].weight.std() > 0.05
    assert v2.c.item() == pytest.approx(0.1) and v2.threshold == 256.0 and v2.threshold_scale.item() == 1.0
    assert v2.fire[0].weight.shape == (32, 1) and v2.fire[0].bias.abs().max() > 0  # PyTorch's default, not zeros


def test_v2_with_a_zero_convolution_is_its_base():
    """f = 0 (the last convolution zeroed): ALiBi's model exactly (same weights), KERPLE and FIRE their bias."""
    x = tokens(seq=20)
    dape = tiny("dape", n_kv_heads=2, pe_args={"version": 2, "base": "alibi"}).double()
    alibi = tiny("alibi", n_kv_heads=2).double()
    alibi.load_state_dict({k: v for k, v in dape.state_dict().items() if ".pe." not in k})
    assert (dape(x) - alibi(x)).abs().max() > 1e-4  # fresh convolutions adapt the logits
    with torch.no_grad():
        for layer in dape.model.layers:
            layer.pe.conv[2].weight.zero_()
            layer.pe.conv[2].bias.zero_()
    assert (dape(x) - alibi(x)).abs().max() <= 1e-13
    for base in ("kerple", "fire"):
        layer = tiny("dape", dim=H * D, n_heads=H, n_kv_heads=G, pe_args={"version": 2, "base": base}).double()
        layer = layer.model.layers[0].pe
        with torch.no_grad():
            layer.conv[2].weight.zero_()
            layer.conv[2].bias.zero_()
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(1, n, 9, D, generator=gen, dtype=torch.float64) for n in (H, G, G))
        got = layer.need(model_state(9), False).attend(None, q, k, v, None, True, None, None)
        scores = torch.einsum("bhid,bhjd->bhij", q, k.repeat_interleave(H // G, 1)) / math.sqrt(D)
        bias = torch.stack([torch.stack([base_bias(layer, i - j, i) if j <= i else torch.full((H,), -math.inf)
                                         for j in range(9)], -1) for i in range(9)], -2).double()
        want = (scores + bias[None]).softmax(-1) @ v.repeat_interleave(H // G, 1)
        assert (got - want).abs().max() <= 1e-13


def model_state(T):
    return tiny("dape").model.pe.initial_state(torch.arange(T)[None], torch.float64)


@pytest.mark.parametrize("args", [{"version": 2, "base": "fire", "kernel": 5}, {"version": 2}])
def test_v2_and_fire_are_exact_on_every_path(args):
    """tape pe check's exact checks: the dense path vs every score materialised (with padding), the KV cache
    through decoding and chunked prefill (a query's row does not depend on later tokens), padding, save-load."""
    subject = Subject("dape", args, torch.device("cpu"))
    for name in ("dense", "kv-cache", "chunked-prefill", "padding", "save-load"):
        outcome = run_check(name, subject)
        assert outcome.ok, (name, outcome.text)


def test_bad_pe_args_and_export_are_refused_in_one_line():
    for args, key in (({"base": "t5"}, "base"), ({"mlp_width": 0}, "mlp_width"), ({"version": 3}, "version"),
                      ({"kernel": 3}, "kernel"), ({"version": 2, "kernel": 4}, "kernel"),
                      ({"version": 2, "kernel": 0}, "kernel"), ({"threshold": 100.0}, "threshold"),
                      ({"base": "fire", "threshold": 0.0}, "threshold"),
                      ({"base": "fire", "threshold": "long"}, "threshold")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="dape", pe_args=args)
    with pytest.raises(TapeError, match="pe 'dape' has no Hugging Face Llama equivalent"):
        check_exportable(tiny("dape"))
