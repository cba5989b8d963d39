"""Gated attention output (`model.output_gate`): each head's attention output times sigmoid(x W), equal to an fp64
reference written from the paper's equation (every score materialised, one loop over query-key pairs), outputs and
gradients, over PEs of every kind of need (rotation, bias, wide values, own attention); exact through the KV cache
and padding (`tape pe check`'s checks); saved with checkpoints, and configs without the key open as before;
refused by `tape export` and `tape merge`'s shape check.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import VOCAB, tiny, tokens

from tapecli.errors import TapeError
from tapecli.model import ModelConfig
from tapecli.model.hf.export import check_exportable
from tapecli.pe.check import Subject, run_check
from tapecli.recipe import load_recipe

H, D = 4, 8


def reference_layer(attn, x, positions, w, slopes=None):
    """One attention layer from the paper's equations: Y_h = softmax_j(q_i . k_j / sqrt(d) - m_h (i - j)) v_j over
    j <= i (RoPE when `slopes` is None: q, k rotated by angle t theta^(-2c/d) on pairs (c, c + d/2); ALiBi
    otherwise), Y'_h = Y_h * sigmoid(x W_h), out = Y' W_o. One query-key pair at a time, fp64; `w` the RoPE
    frequencies theta^(-2c/d) as the PE holds them (fp32, as transformers computes them)."""
    B, T, _ = x.shape
    q = attn.q_proj(x).view(B, T, H, D)
    k = attn.k_proj(x).view(B, T, H, D)
    v = attn.v_proj(x).view(B, T, H, D)
    if slopes is None:
        rot = torch.polar(torch.ones(T, D // 2, dtype=torch.float64), positions.double()[:, None] * w)
        q = torch.view_as_real(torch.complex(q[..., :D // 2], q[..., D // 2:]) * rot[None, :, None])
        k = torch.view_as_real(torch.complex(k[..., :D // 2], k[..., D // 2:]) * rot[None, :, None])
        q, k = (torch.cat((t[..., 0], t[..., 1]), -1) for t in (q, k))
    gate_w = attn.output_gate.proj.weight.view(H, -1, x.shape[-1])  # [H, d or 1, dim]
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            scores = torch.full((T, T), float("-inf"), dtype=torch.float64)
            for i in range(T):
                for j in range(i + 1):
                    bias = 0.0 if slopes is None else -slopes[h] * (positions[i] - positions[j])
                    scores[i, j] = q[b, i, h] @ k[b, j, h] / math.sqrt(D) + bias
            y = scores.softmax(-1) @ v[b, :, h]
            out[b, :, h] = y * torch.sigmoid(x[b] @ gate_w[h].T)
    return attn.o_proj(out.reshape(B, T, H * D))


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("pe", ["rope", "alibi"])
@pytest.mark.parametrize("T", [3, 11, 24])
def test_the_gated_layer_equals_the_papers_equation(gate, pe, T):
    model = tiny(pe, dim=H * D, n_heads=H, output_gate=gate).double()
    attn = model.model.layers[0].self_attn
    gen = torch.Generator().manual_seed(T)
    x = torch.randn(2, T, H * D, generator=gen, dtype=torch.float64, requires_grad=True)
    positions = torch.arange(T) + 5
    state = model.model.pe.initial_state(positions[None], torch.float64)
    got, _ = attn(x, model.model.layers[0].pe, state, positions[None], None, None, None)
    slopes = model.model.layers[0].pe.slopes.double() if pe == "alibi" else None
    w = model.model.pe.inv_freq.double() if pe == "rope" else None
    assert w is None or torch.allclose(w, 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D), rtol=1e-6)
    want = reference_layer(attn, x, positions, w, slopes)
    assert (got - want).abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=torch.float64).view_as(got)
    params = (x, attn.output_gate.proj.weight, attn.q_proj.weight, attn.v_proj.weight)
    for a, b in zip(torch.autograd.grad((got * weight).sum(), params),
                    torch.autograd.grad((want * weight).sum(), params), strict=True):
        assert (a - b).abs().max() <= 1e-12


@pytest.mark.parametrize(("pe", "gate"), [("rope", "elementwise"), ("fox", "headwise"), ("cope", "elementwise")])
def test_every_attention_path_stays_exact_with_the_gate(pe, gate):
    """tape pe check's exact checks on a gated model: the fast paths vs every score materialised (outputs and
    gradients, padded or not), the KV cache and chunked prefill vs the full forward, padding and save-load."""
    subject = Subject(pe, device=torch.device("cpu"), keys={"output_gate": gate})
    for name in ("dense", "kv-cache", "chunked-prefill", "padding", "save-load"):
        outcome = run_check(name, subject)
        assert outcome.ok, (name, outcome.text)


def test_parameters_names_and_the_default():
    gated = tiny("rope", output_gate="elementwise")
    shapes = {n: tuple(p.shape) for n, p in gated.named_parameters() if "output_gate" in n}
    assert shapes == {f"model.layers.{i}.self_attn.output_gate.proj.weight": (32, 32) for i in range(2)}
    headwise = tiny("rope", output_gate="headwise")
    assert headwise.model.layers[1].self_attn.output_gate.proj.weight.shape == (4, 32)
    plain = tiny("rope")
    assert not any("output_gate" in n for n, _ in plain.named_parameters())
    x = tokens()
    gated(x).logsumexp(-1).sum().backward()
    assert all(layer.self_attn.output_gate.proj.weight.grad.abs().sum() > 0 for layer in gated.model.layers)
    assert gated(x).shape == (2, 12, VOCAB)


def test_configs_without_the_key_open_and_the_key_is_saved():
    config = tiny("rope", output_gate="headwise").config
    saved = config.to_dict()
    assert saved["output_gate"] == "headwise" and ModelConfig.from_dict(saved).output_gate == "headwise"
    del saved["output_gate"]  # a config written before the key existed
    assert ModelConfig.from_dict(saved).output_gate == "none"
    assert "output_gate" not in tiny("rope").config.attention_keys()


def test_a_bad_gate_and_export_are_refused_in_one_line():
    with pytest.raises(ValueError, match="model.output_gate: unknown gate 'sideways'; allowed: none, elementwise"):
        ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, output_gate="sideways")
    with pytest.raises(TapeError, match="^model.output_gate: unknown gate 'sideways'; allowed: none, elementwise, "
                                       "headwise$"):
        load_recipe("selective-copy-smoke", ["model.output_gate=sideways"])
    assert load_recipe("selective-copy-smoke", ["model.output_gate=headwise"]).model.output_gate == "headwise"
    with pytest.raises(TapeError, match="model.output_gate: 'elementwise' gates attention's output"):
        check_exportable(tiny("rope", output_gate="elementwise"))
