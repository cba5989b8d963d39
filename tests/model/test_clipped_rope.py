"""Clipped RoPE: the official raised-cosine taper of the lowest frequencies (and HardClip's zeros); attention equal
to an fp64 reference written from the paper's equations (every score materialised, one loop over query-key pairs),
outputs and gradients, at several lengths and with YaRN under it; with clipping off, RoPE exactly; refused by
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

H, G, D = 4, 2, 16


def taper(n_freqs: int, clip: int, hard: bool = False) -> torch.Tensor:
    """The paper's soft clipping in fp64: factor (1 + cos(pi j / (n - 1))) / 2 on the j-th of the n lowest."""
    mask = torch.ones(n_freqs, dtype=torch.float64)
    n = min(clip, n_freqs)
    for j in range(n):
        mask[n_freqs - n + j] = 0.0 if hard else (0.5 * (1 + math.cos(math.pi * j / (n - 1))) if n > 1 else 1.0)
    return mask


def reference(q, k, v, positions, w, mscale=1.0):
    """softmax_j(Re[sum_c q~_ic conj(k~_jc)] / sqrt(d)) v_j over j <= i, q~_c = (q_c + i q_{c+d/2}) e^(i t w_c)
    (k likewise), scaled by YaRN's attention factor on both sides; one (query, key) pair at a time."""
    B, _, T, d = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        t = positions[b].double()
        for h in range(H):
            g = h // (H // G)
            turn = torch.polar(torch.ones_like(w), t[:, None] * w)
            qc = torch.complex(q[b, h, :, :d // 2], q[b, h, :, d // 2:]) * turn
            kc = torch.complex(k[b, g, :, :d // 2], k[b, g, :, d // 2:]) * turn
            scores = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for i in range(T):
                for j in range(i + 1):
                    scores[i, j] = mscale ** 2 * (qc[i] * kc[j].conj()).sum().real / math.sqrt(d)
            out[b, h] = scores.softmax(-1) @ v[b, g]
    return out


@pytest.mark.parametrize("T", [5, 17, 40])
@pytest.mark.parametrize("scaling", ["none", "yarn"])
def test_attention_equals_the_papers_equations(T, scaling):
    args = {"clip_low_n": 5} if scaling == "none" else {"clip_low_n": 5, "scaling": "yarn", "factor": 4.0,
                                                        "original_max_len": 16}
    model = tiny("clipped-rope", dim=H * D, n_heads=H, n_kv_heads=G, pe_args=args).double()
    pe, layer = model.model.pe, model.model.layers[0].pe
    gen = torch.Generator().manual_seed(T)
    q = torch.randn(2, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, G, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.stack((torch.arange(T), torch.arange(T) + 100))
    got = attend(*layer.rotate(q, k, pe.initial_state(positions, torch.float64)), v, None, x=None, q_pos=positions,
                 k_pos=positions, key_mask=None, cache=None)
    # The frequencies as the PE holds them (fp32, like RoPE's): their equation is test_the_taper_is_the_papers.
    want = reference(q, k, v, positions, pe.frequencies(positions).double(), pe.attention_factor)
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    for a, b in zip(torch.autograd.grad((got * weight).sum(), (q, k, v)),
                    torch.autograd.grad((want * weight).sum(), (q, k, v)), strict=True):
        assert (a - b).abs().max() <= 1e-12


@pytest.mark.parametrize("clip", [0, 1, 3, 8, 20])
@pytest.mark.parametrize("hard", [False, True])
def test_the_taper_is_the_papers(clip, hard):
    pe = tiny("clipped-rope", dim=H * D, n_heads=H, pe_args={"clip_low_n": clip, "hard": hard}).model.pe
    rope = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    got = pe.frequencies(torch.arange(4)[None]).double()
    assert torch.allclose(got, rope * taper(D // 2, clip, hard), rtol=1e-6, atol=0)
    if clip > 1 and not hard:  # the boundary frequency is kept, the lowest stops rotating
        assert got[D // 2 - min(clip, D // 2)] == pe.inv_freq[D // 2 - min(clip, D // 2)] and got[-1] == 0


@pytest.mark.parametrize("rope_args", [{}, {"theta": 500000.0}, {"scaling": "yarn", "factor": 4.0},
                                       {"scaling": "dynamic", "factor": 2.0}, {"scaling": "llama3", "factor": 8.0}])
def test_clipping_off_is_rope_exactly(rope_args):
    x = tokens(seq=40)  # past max_seq_len 32, where dynamic NTK rescales
    clipped = tiny("clipped-rope", pe_args={"clip_low_n": 0, **rope_args}).double()
    rope = tiny("rope", pe_args=rope_args).double()
    assert torch.equal(clipped(x), rope(x))
    on = tiny("clipped-rope", pe_args={"clip_low_n": 3, **rope_args}).double()
    assert not torch.allclose(on(x), rope(x))


def test_dynamic_scaling_is_clipped_too():
    pe = tiny("clipped-rope", pe_args={"clip_low_n": 2, "scaling": "dynamic", "factor": 2.0}).model.pe
    long = pe.frequencies(torch.arange(80)[None])
    assert long.shape[-1] == 4 and long[..., -1].abs().max() == 0 and long[..., -2].abs().min() > 0
    assert not torch.equal(long.flatten(), pe.frequencies(torch.arange(8)[None]).flatten())  # rescaled, then clipped


def test_bad_pe_args_and_export_are_refused_in_one_line():
    for args, key in (({"clip_low_n": -1}, "clip_low_n"), ({"clip_low_n": 2.5}, "clip_low_n"),
                      ({"fope": True}, "fope"), ({"scaling": "nope"}, "scaling")):
        with pytest.raises(ValueError, match=f"model.pe_args.{key}"):
            ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, pe="clipped-rope", pe_args=args)
    with pytest.raises(TapeError, match="pe 'clipped-rope' has no Hugging Face Llama equivalent"):
        check_exportable(tiny("clipped-rope"))
