"""LieRE and ComRoPE: attention equal to an fp64 reference written from the papers' definitions (the angle matrix A
materialised as one d x d matrix from its parameters, scores q_t^T exp((p_s - p_t) A) k_s with p = t / L, one
query-key pair at a time), outputs and gradients down to the generators' parameters, at several lengths; the
official initialisations; bad pe_args and `tape export` refused in one line.

The generic tests (test_model, test_generation, test_attention, test_pe_check, test_train) run both through the KV
cache, chunked prefill, padding, bf16, fp64, training and resuming like every PE.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import tiny

from tapecli.errors import TapeError
from tapecli.model import KVCache, ModelConfig
from tapecli.model.attention import attend
from tapecli.model.hf.export import check_exportable
from tapecli.model.pe import liere
from tapecli.model.pe.liere import power_table, rotations, skew

H, G, D, L = 4, 2, 8, 32  # L: max_seq_len, the positions' normaliser


def angle_matrix(pe: str, layer, head: int) -> torch.Tensor:
    """A [d, d] of one key head from the papers: LieRE's U - U^T (U: the raw parameter's strict upper triangle,
    dense or per block); ComRoPE's diag(B_1..B_m), B_j = P_j - P_j^T (AP), theta_j (P_j - P_j^T) (LD)."""
    raw = layer.raw[head if layer.raw.shape[0] > 1 else 0]
    blocks = []
    for j in range(raw.shape[0]):
        P = raw[j]
        if pe == "liere":
            n = P.shape[0]
            B = torch.zeros(n, n, dtype=torch.float64)
            for r in range(n):
                for c in range(r + 1, n):
                    B[r, c], B[c, r] = P[r, c], -P[r, c]
        else:
            B = P - P.T
            if layer.theta is not None:
                B = layer.theta[j, 0, 0] * B
        blocks.append(B)
    return torch.block_diag(*blocks)


def reference(pe, layer, q, k, v, positions):
    B, _, T, _ = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            A = angle_matrix(pe, layer, g)
            scores = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for t in range(T):
                for s in range(t + 1):
                    R = torch.linalg.matrix_exp((positions[b, s] - positions[b, t]) / L * A)
                    scores[t, s] = q[b, h, t] @ R @ k[b, g, s] / math.sqrt(D)
            out[b, h] = scores.softmax(-1) @ v[b, g]
    return out


CASES = [("liere", {}), ("liere", {"generator_dim": 4, "per_head": True}), ("comrope", {"block_size": 4}),
         ("comrope", {"block_size": 2, "variant": "ld"}), ("comrope", {"block_size": 8})]


@pytest.mark.parametrize("T", [4, 9, 20])
@pytest.mark.parametrize(("pe", "args"), CASES, ids=[f"{pe}-{'-'.join(map(str, a.values())) or 'default'}"
                                                     for pe, a in CASES])
def test_attention_equals_the_papers_definition(pe, args, T):
    model = tiny(pe, dim=H * D, n_heads=H, n_kv_heads=G, max_seq_len=L, pe_args=args).double()
    pe_model, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T), torch.arange(T) + 45))  # also past the training length
    got = attend(*layer.rotate(q, k, pe_model.initial_state(positions, torch.float64)), v, None, x=None,
                 q_pos=positions, k_pos=positions, key_mask=None, cache=None)
    want = reference(pe, layer, q, k, v, positions)
    assert (got - want).abs().max() <= 1e-9  # matrix_exp of different arguments: rounding grows with |A|
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    inputs = (q, k, v, *(p for p in layer.parameters()))
    for a, b in zip(torch.autograd.grad((got * weight).sum(), inputs),
                    torch.autograd.grad((want * weight).sum(), inputs), strict=True):
        assert (a - b).abs().max() <= 1e-9 * max(1.0, b.abs().max().item())


def test_official_initialisations_and_shapes():
    liere = tiny("liere", dim=H * D, n_heads=H, n_kv_heads=G).model.layers[1].pe.raw
    assert liere.shape == (1, 1, D, D) and 0 <= liere.min() and liere.max() < 2 * math.pi  # U(0, 2 pi), dense
    assert tiny("liere", dim=H * D, n_heads=H, n_kv_heads=G,
                pe_args={"per_head": True, "generator_dim": 2}).model.layers[0].pe.raw.shape == (G, D // 2, 2, 2)
    torch.manual_seed(0)
    big = tiny("comrope", dim=256, n_heads=4, pe_args={"init_std": 0.5}).model.layers[0].pe
    assert big.raw.shape == (4, 8, 8, 8) and big.theta is None and abs(big.raw.std().item() - 0.5) < 0.05
    assert tiny("comrope", pe_args={"variant": "ld"}).model.layers[0].pe.theta.shape == (1, 1, 1)


def test_bad_pe_args_and_export_are_refused_in_one_line():
    for pe, args, key in (("liere", {"generator_dim": 3}, "generator_dim"), ("liere", {"generator_dim": -2},
                                                                            "generator_dim"),
                          ("comrope", {"block_size": 5}, "block_size"), ("comrope", {"variant": "xy"}, "variant"),
                          ("comrope", {"init_std": 0.0}, "init_std")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe=pe, pe_args=args)
    for pe in ("liere", "comrope"):
        with pytest.raises(TapeError, match=f"pe '{pe}' has no Hugging Face Llama equivalent"):
            check_exportable(tiny(pe))


def per_position(generator: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """exp(p s A), one matrix exponential per position (fp64): [B, S, T, n * b * b] as `rotations` returns."""
    p = positions.double()[:, None, :, None, None, None] * scale
    return torch.linalg.matrix_exp(p * generator.double()[None, :, None]).flatten(-3)


@pytest.mark.parametrize("shape", [(1, 1, 16, 16), (2, 4, 4, 4)], ids=["dense", "blocks"])
@pytest.mark.parametrize("lo", [0, 300, -7])
def test_power_table_equals_one_matrix_exponential_per_position(shape, lo, monkeypatch):
    """Integer positions lo..lo+299 read the doubling table: equal (fp64, values and the generator's gradient) to
    exp(p s A) per position, whatever the offset (also negative). Its exponentials, exp(lo s A) and the 9 powers
    E^(2^k) that 300 entries need, are one batched matrix_exp call (on CUDA each call waits for the GPU)."""
    calls, exponentials = [], []
    monkeypatch.setattr(liere, "power_table", lambda *a: calls.append(a[1:3]) or power_table(*a))
    torch.manual_seed(0)
    raw = torch.empty(shape, dtype=torch.float64).uniform_(0, 2 * math.pi).requires_grad_()
    positions = torch.arange(lo, lo + 300)[None]
    matrix_exp = torch.linalg.matrix_exp
    with monkeypatch.context() as patch:
        patch.setattr(torch.linalg, "matrix_exp", lambda a: exponentials.append(a.shape[0]) or matrix_exp(a))
        got = rotations(skew(raw), positions, 1 / L)
    want = per_position(skew(raw), positions, 1 / L)
    assert calls == [(lo, 300)] and exponentials == [10] and got.dtype == torch.float64
    assert (got - want).abs().max() <= 1e-12
    weight = torch.randn(got.shape, dtype=torch.float64)
    (a,), (b,) = (torch.autograd.grad((r * weight).sum(), raw) for r in (got, want))
    assert (a - b).abs().max() <= 1e-12 * b.abs().max()


def test_offset_padded_and_non_integer_positions(monkeypatch):
    """Cache decoding (one token at its offset; a batch whose rows sit at different offsets), padded rows (a
    position repeated) and positions that are not integers all equal one matrix exponential per position (fp64);
    positions too sparse for the table and non-integer ones take the per-position fallback, integer-valued floats
    the table; and a model decoding from its KV cache equals its full forward."""
    calls = []
    monkeypatch.setattr(liere, "power_table", lambda *a: calls.append(a[1:3]) or power_table(*a))
    torch.manual_seed(0)
    generator = skew(torch.empty(2, 2, 4, 4, dtype=torch.float64).uniform_(0, 2 * math.pi))
    cases = [(torch.tensor([[41]]), [(41, 1)]), (torch.tensor([[3], [900]]), []),
             (torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]), [(0, 5)]),
             (torch.tensor([[0.5, 1.25, 7.0]], dtype=torch.float64), []),
             (torch.tensor([[5.0, 6.0, 8.0]], dtype=torch.float64), [(5, 4)])]
    for positions, table in cases:
        calls.clear()
        got = rotations(generator, positions, 1 / L)
        assert calls == table and got.shape == (positions.shape[0], 2, positions.shape[1], 2 * 16)
        assert (got - per_position(generator, positions, 1 / L)).abs().max() <= 1e-12, positions

    for pe in ("liere", "comrope"):
        model = tiny(pe, dim=H * D, n_heads=H, n_kv_heads=G, max_seq_len=L).double().eval()
        ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
        cache = KVCache(model.config.n_layers)
        with torch.no_grad():
            steps = [model(ids[:, :8], cache=cache)] + [model(ids[:, t:t + 1], start_pos=t, cache=cache)
                                                         for t in range(8, 12)]
            assert (torch.cat(steps, dim=1) - model(ids)).abs().max() <= 1e-10


@pytest.mark.parametrize(("pe", "args"), CASES[:3], ids=["liere", "liere-blocks-per-head", "comrope"])
def test_rotated_queries_and_keys_keep_their_features_contiguous(pe, args):
    """SDPA's fused kernels take only features of stride 1: rotated queries and keys keep them so (one batch row
    and several, one rotation and one per key head)."""
    model = tiny(pe, dim=H * D, n_heads=H, n_kv_heads=G, max_seq_len=L, pe_args=args)
    pe_model, layer = model.model.pe, model.model.layers[0].pe
    for B in (1, 3):
        q, k = torch.randn(B, 6, H, D).transpose(1, 2), torch.randn(B, 6, G, D).transpose(1, 2)
        positions = pe_model.positions(B, 6, 0, q.device)
        for x in layer.rotate(q, k, pe_model.initial_state(positions, torch.float32)):
            assert x.stride(-1) == 1
