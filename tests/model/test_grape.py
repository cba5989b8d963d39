"""Multiplicative GRAPE (commuting): attention equal to an fp64 reference written from the paper's group action
(scores q_t^T exp((s - t) sum_j w_j L_j) k_s with the rank-2 generators materialised as matrices, one query-key
pair at a time), outputs and gradients down to the learned frequencies, at several lengths, with one spectrum per
layer or per key head; RoPE exactly with the canonical planes and log-uniform spectrum it starts from; refused by
`tape export`.

The generic tests (test_model, test_generation, test_attention, test_pe_check, test_train) run it through the KV
cache, chunked prefill, padding, bf16, fp64, training and resuming like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import tiny, tokens

from tapecli.errors import TapeError
from tapecli.model import ModelConfig
from tapecli.model.attention import attend
from tapecli.model.hf.export import check_exportable
from tapecli.pe.check import Subject, run_check

H, G, D = 4, 2, 8


def generator(layer, row: int) -> torch.Tensor:
    """The generator L of spectrum `row` as a d x d matrix. Commuting: sum_j w_j L_j, L_j = e_{j+d/2} e_j^T -
    e_j e_{j+d/2}^T the rank-2 skew generator of plane (j, j + d/2), w = exp(log_freq). Non-commuting (the paper's
    Appendix D): the first r/2 planes replaced by E L_r E^T, L_r = sum_i w_i (a_i b_i^T - b_i a_i^T) in R^{r x r},
    E [d, r] selecting the coordinates of those planes. Learned planes: B L B^T, B = exp(W - W^T)."""
    freq = layer.log_freq[row].exp()
    m = layer.mix_a.shape[1] if hasattr(layer, "mix_a") else 0
    total = torch.zeros(D, D, dtype=torch.float64)
    for j in range(m, D // 2):
        plane = torch.zeros(D, D, dtype=torch.float64)
        plane[j + D // 2, j], plane[j, j + D // 2] = 1.0, -1.0
        total = total + freq[j] * plane
    if m:
        E = torch.zeros(D, 2 * m, dtype=torch.float64)
        for c, i in enumerate(list(range(m)) + [D // 2 + i for i in range(m)]):
            E[i, c] = 1.0
        mixture = sum(freq[i] * (torch.outer(layer.mix_a[row, i], layer.mix_b[row, i]) -
                                 torch.outer(layer.mix_b[row, i], layer.mix_a[row, i])) for i in range(m))
        total = total + E @ mixture @ E.T
    if hasattr(layer, "plane_log"):
        W = layer.plane_log[row]
        basis = torch.linalg.matrix_exp(W - W.T)
        total = basis @ total @ basis.T
    return total


def reference(q, k, v, positions, layer):
    """softmax_s(q_t^T G(s - t) k_s / sqrt(d)) v_s over s <= t, G(n) = exp(n L) (one generator per key head, or
    one shared): the matrix exponential of the whole d x d generator at each offset."""
    B, _, T, _ = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            L = generator(layer, g if layer.log_freq.shape[0] > 1 else 0)
            scores = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for t in range(T):
                for s in range(t + 1):
                    action = torch.linalg.matrix_exp((positions[b, s] - positions[b, t]) * L)
                    scores[t, s] = q[b, h, t] @ action @ k[b, g, s] / math.sqrt(D)
            out[b, h] = scores.softmax(-1) @ v[b, g]
    return out


FORMS = {"commuting": {}, "learned-planes": {"learned_planes": True},
         "noncommuting": {"generators": "noncommuting", "rank": 4},
         "noncommuting-full": {"generators": "noncommuting", "rank": D, "learned_planes": True}}


def perturb(layer, gen):
    """Move every parameter away from its start (RoPE): a learned spectrum, mixture vectors, basis."""
    with torch.no_grad():
        for name in ("log_freq", "mix_a", "mix_b", "plane_log"):
            if hasattr(layer, name):
                p = getattr(layer, name)
                p.add_((0.5 if name == "log_freq" else 0.3) * torch.randn(p.shape, generator=gen, dtype=p.dtype))


@pytest.mark.parametrize("T", [4, 9, 20])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("form", list(FORMS))
def test_attention_equals_the_group_action(T, shared, form):
    args = {"share_across_heads": shared, **FORMS[form]}
    model = tiny("grape", dim=H * D, n_heads=H, n_kv_heads=G, pe_args=args).double()
    pe, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    perturb(layer, gen)
    assert layer.log_freq.shape == ((1 if shared else G), D // 2)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T), torch.arange(T) + 37))
    got = attend(*layer.rotate(q, k, pe.initial_state(positions, torch.float64)), v, None, x=None, q_pos=positions,
                 k_pos=positions, key_mask=None, cache=None)
    want = reference(q, k, v, positions, layer)
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    inputs = (q, k, v, *layer.parameters())
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (a - b).abs().max() <= 1e-11 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("args", [{}, {"learnable": False}, {"theta": 500000.0}, {"share_across_heads": False},
                                  {"learned_planes": True}, {"generators": "noncommuting"},
                                  {"generators": "noncommuting", "rank": 4, "learned_planes": True,
                                   "share_across_heads": False}])
def test_canonical_planes_with_the_log_uniform_spectrum_are_rope(args):
    """The spectrum starts at RoPE's (to the fp32 rounding of its log), and with RoPE's frequencies the model is
    RoPE's: logits equal in fp64. Learned planes start at the canonical ones (B = I) and the non-commuting mixture at
    the canonical planes of its subspace, so both are RoPE too until they are trained."""
    x = tokens(seq=30)
    theta = args.get("theta", 10000.0)
    grape = tiny("grape", n_kv_heads=2, pe_args=args).double()
    rope = tiny("rope", n_kv_heads=2, pe_args={"theta": theta}).double()
    spectra = [layer.pe.log_freq.exp() for layer in grape.model.layers]
    want = theta ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    assert all(torch.allclose(w, want.expand_as(w), rtol=1e-6, atol=0) for w in spectra)
    rope.model.pe.inv_freq = spectra[0][0].detach()  # every layer and head starts with the same spectrum
    assert (grape(x) - rope(x)).abs().max() <= 1e-13
    assert all(p.requires_grad == args.get("learnable", True) for n, p in grape.named_parameters()
               if n.endswith("log_freq"))
    with torch.no_grad():
        grape.model.layers[0].pe.log_freq.add_(0.1)
    assert (grape(x) - rope(x)).abs().max() > 1e-5  # a moved spectrum is no longer RoPE (fresh weights: small)


@pytest.mark.parametrize("shared", [True, False])
def test_noncommuting_with_canonical_planes_is_commuting_grape(shared):
    """The mixture at its start (the canonical planes of its subspace) with a learned spectrum: the commuting model
    with that spectrum, logits equal in fp64; moved mixture vectors couple the planes (their generators no longer
    commute) and change the logits."""
    x = tokens(seq=40)
    commuting = tiny("grape", n_kv_heads=2, pe_args={"share_across_heads": shared}).double()
    mixed = tiny("grape", n_kv_heads=2, pe_args={"share_across_heads": shared, "generators": "noncommuting"}).double()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for layer in commuting.model.layers:
            layer.pe.log_freq.add_(0.5 * torch.randn(layer.pe.log_freq.shape, generator=gen, dtype=torch.float64))
    mixed.load_state_dict(commuting.state_dict(), strict=False)
    assert (mixed(x) - commuting(x)).abs().max() <= 1e-13
    layer = mixed.model.layers[0].pe
    with torch.no_grad():
        layer.mix_a.add_(0.3 * torch.randn(layer.mix_a.shape, generator=gen, dtype=torch.float64))
    L = [torch.outer(layer.mix_a[0, i], layer.mix_b[0, i]) - torch.outer(layer.mix_b[0, i], layer.mix_a[0, i])
         for i in range(2)]
    assert (L[0] @ L[1] - L[1] @ L[0]).abs().max() > 1e-3
    assert (mixed(x) - commuting(x)).abs().max() > 1e-6


def contextual_reference(q, k, v, x, layer, per_head):
    """Contextual GRAPE from the official Type-I equations: omega_t = softplus(w . x_t + b) (one per token, or per
    key head), Phi_t = sum_{s < t} omega_s, scores q_t^T exp((Phi_s - Phi_t) sum_j w_j L_j) k_s / sqrt(d)."""
    B, _, T, _ = q.shape
    out = torch.zeros_like(q)
    W, b0 = layer.omega_proj.weight, layer.omega_proj.bias
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            row = g if per_head else 0
            phase, total = [], torch.zeros((), dtype=torch.float64)
            for t in range(T):
                phase.append(total)
                total = total + torch.nn.functional.softplus(W[row] @ x[b, t] + b0[row])
            L = generator(layer, g if layer.log_freq.shape[0] > 1 else 0)
            scores = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for t in range(T):
                for s in range(t + 1):
                    scores[t, s] = q[b, h, t] @ torch.linalg.matrix_exp((phase[s] - phase[t]) * L) @ k[b, g, s]
            out[b, h] = (scores / math.sqrt(D)).softmax(-1) @ v[b, g]
    return out


@pytest.mark.parametrize("T", [4, 13])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("form", ["commuting", "noncommuting-full"])
def test_contextual_grape_equals_the_official_equations(T, per_head, form):
    args = {"contextual": True, "ctx_per_head": per_head, "share_across_heads": not per_head, **FORMS[form]}
    model = tiny("grape", dim=H * D, n_heads=H, n_kv_heads=G, pe_args=args).double()
    layer = model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    with torch.no_grad():  # away from the official init (w = 0: every token the same increment)
        layer.omega_proj.weight.normal_(0, 0.5, generator=gen)
    perturb(layer, gen)
    x = torch.randn(2, T, H * D, generator=gen, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    need = layer.need(model.model.pe.initial_state(torch.arange(T)[None], torch.float64), False)
    got = need.attend(x, q, k, v, None, True, None, None)
    want = contextual_reference(q, k, v, x, layer, per_head)
    assert (got - want).abs().max() <= 1e-10  # phases of tens of radians: rounding grows with them
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    inputs = (x, q, k, v, *layer.parameters())
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (a - b).abs().max() <= 1e-9 * max(1.0, b.abs().max().item())


def test_contextual_grape_starts_with_the_official_increment():
    layer = tiny("grape", pe_args={"contextual": True}).model.layers[0].pe
    assert not layer.omega_proj.weight.any()
    phases = layer.phases(torch.randn(1, 6, 32), None, None)
    assert torch.allclose(phases, 1e-3 * torch.arange(6.0)[None, None], rtol=1e-5)


def test_contextual_grape_is_exact_on_every_path():
    """tape pe check's exact checks: fast paths vs every score materialised (with padding), the running phase
    carried by the KV cache through decoding and chunked prefill, padding adding no phase, save-load."""
    subject = Subject("grape", {"contextual": True, "ctx_per_head": True}, torch.device("cpu"))
    for name in ("dense", "kv-cache", "chunked-prefill", "padding", "save-load"):
        outcome = run_check(name, subject)
        assert outcome.ok, (name, outcome.text)


def test_bad_pe_args_and_export_are_refused_in_one_line():
    for args, key in (({"theta": 1.0}, "theta"), ({"learnable": 1}, "learnable"), ({"spectrum": 2}, "spectrum"),
                      ({"ctx_per_head": True}, "ctx_per_head"), ({"generators": "dense"}, "generators"),
                      ({"rank": 4}, "rank"), ({"generators": "noncommuting", "rank": 3}, "rank"),
                      ({"generators": "noncommuting", "rank": 0}, "rank"),
                      ({"generators": "noncommuting", "rank": 18}, "rank"),
                      ({"learned_planes": "yes"}, "learned_planes")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="grape", pe_args=args)
    with pytest.raises(TapeError, match="pe 'grape' has no Hugging Face Llama equivalent"):
        check_exportable(tiny("grape"))
