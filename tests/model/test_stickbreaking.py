"""Stick-breaking attention: equal to a naive fp64 loop over the stick, outputs and gradients, on every path; exact
under the KV cache (chunked prefill, left padding); the official conventions (no self-attention by default, the
leftover stick dropped or added to the query's own value).

The generic tests (test_model.py, test_attention.py, test_generation.py) loop over PE_NAMES and cover it too:
training paths == the materialised reference, cached == uncached generation, padded batches == each row alone,
bf16 autocast, fp64, memory linear in the context.
"""

from __future__ import annotations

import pytest
import torch
from test_model import VOCAB, tiny

from tapecli.model import KVCache, attention
from tapecli.model.attention import recompute
from tapecli.model.pe.stickbreaking_ops import stick_breaking, stick_breaking_dense


def naive_stick_breaking(q, k, v, key_mask=None, current=False, remainder=False):
    """Walk back from each query over its visible keys, breaking off b = sigmoid(q . k / sqrt(d)) of the stick
    that is left: out_i = sum_j b_ij prod_{j < l < i} (1 - b_il) v_j (+ the leftover stick times v_i)."""
    B, H, Tq, d = q.shape
    G, Tk = k.shape[1], k.shape[2]
    out = torch.zeros(B, H, Tq, v.shape[-1], dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            g = h // (H // G)
            for i in range(Tq):
                me = Tk - Tq + i
                stick = torch.ones((), dtype=q.dtype)
                for j in range(me if current else me - 1, -1, -1):
                    if key_mask is not None and not key_mask[b, j]:
                        continue  # padding breaks nothing
                    share = torch.sigmoid(q[b, h, i] @ k[b, g, j] / d ** 0.5)
                    out[b, h, i] += stick * share * v[b, g, j]
                    stick = stick * (1 - share)
                if remainder:
                    out[b, h, i] += stick * v[b, g, me]
    return out


def inputs(B=2, H=4, G=2, Tq=9, Tk=9, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(B, H, Tq, d, generator=gen, dtype=torch.float64)
    k, v = (2 * torch.randn(B, G, Tk, d, generator=gen, dtype=torch.float64) for _ in range(2))
    return [t.requires_grad_() for t in (q, k, v)]


def padding(B: int, T: int) -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    mask[0, 5] = False  # and a hole: any layout hides the key
    return mask


@pytest.mark.parametrize("current", [False, True], ids=["strict", "current"])
@pytest.mark.parametrize("remainder", [False, True], ids=["drop", "remainder"])
@pytest.mark.parametrize("case", ["plain", "padded", "past", "padded-past"])
def test_chunks_equal_the_naive_loop_outputs_and_gradients(current, remainder, case):
    """The chunked path (1, 3 and all queries per chunk) and the materialised reference equal the loop, and so do
    their gradients in q, k and v (grouped-query heads, a past of cached keys, padding)."""
    Tq, Tk = (4, 11) if "past" in case else (9, 9)
    q, k, v = inputs(Tq=Tq, Tk=Tk)
    key_mask = padding(2, Tk) if "padded" in case else None
    want = naive_stick_breaking(q, k, v, key_mask, current, remainder)
    g = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, (q, k, v), g)
    got_dense = stick_breaking_dense(q, k, v, key_mask, 8 ** -0.5, current, remainder)
    assert (got_dense - want).abs().max() <= 1e-12
    for rows in (1, 3, Tq):
        got = stick_breaking(q, k, v, key_mask, 8 ** -0.5, current, remainder, rows)
        assert (got - want).abs().max() <= 1e-12
        for a, b in zip(torch.autograd.grad(got, (q, k, v), g), want_grads, strict=True):
            assert (a - b).abs().max() <= 1e-11


def test_the_official_conventions():
    """No remainder: the first query sees nothing (output 0), every row's weights sum to at most 1; with the
    remainder the first query returns its own value and a single key v_0 with an equal value gives the constant."""
    q, k, v = (t.detach() for t in inputs(B=1, H=1, G=1, Tq=6, Tk=6))
    out = stick_breaking(q, k, v, None, 8 ** -0.5, False, False, 6)
    assert out[0, 0, 0].abs().max() == 0
    ones = torch.ones_like(v)
    assert (stick_breaking(q, k, ones, None, 8 ** -0.5, False, False, 6) <= 1 + 1e-12).all()
    assert torch.allclose(stick_breaking(q, k, ones, None, 8 ** -0.5, False, True, 6), ones[:, :1].expand(-1, 1, 6, -1),
                          atol=1e-12)  # the weights and the leftover stick make up the whole stick
    with_self = stick_breaking(q, k, v, None, 8 ** -0.5, False, True, 6)
    assert torch.equal(with_self[0, 0, 0], v[0, 0, 0])
    # A key with a huge logit takes the whole stick: nothing farther away gets weight (recency, not magnitude).
    k2 = k.clone()
    k2[0, 0, 3] = 50 * q[0, 0, 5]
    w = stick_breaking(q, k2, torch.eye(6, 8, dtype=q.dtype)[None, None], None, 8 ** -0.5, False, False, 2)
    assert w[0, 0, 5, 3] > 1 - 1e-12 - w[0, 0, 5, 4] and w[0, 0, 5, :3].abs().max() < 1e-12


@pytest.mark.parametrize("pe_args", [{}, {"attend_current": True, "remainder": True}], ids=["default", "options"])
def test_cached_prefill_and_left_padding_equal_the_full_forward(monkeypatch, pe_args):
    """A left-padded batch prefilled through the KV cache in pieces (then decoded one token at a time) gives the
    logits of the full forward and of each row alone; the training path's gradients equal the materialised
    reference's."""
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 24 * 3)  # several chunks at these sizes
    model = tiny("stickbreaking", n_kv_heads=2, pe_args=pe_args).double().eval()
    x = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[0, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = KVCache(model.config.n_layers)
    with torch.no_grad():
        full = model(x, attention_mask=mask)
        pieces = [model(x[:, a:b], start_pos=positions[:, a], cache=cache, attention_mask=mask[:, :b][:, a:b])
                  for a, b in ((0, 6), (6, 11), (11, 12), (12, 13), (13, 14))]
        alone = model(x[:1, 4:])
    assert (torch.cat(pieces, 1) - full)[mask.bool()].abs().max() <= 1e-10
    assert (full[0, 4:] - alone[0]).abs().max() <= 1e-10
    assert torch.equal(model.generate(x, 4, attention_mask=mask, prefill_chunk=3),
                       model.generate(x, 4, attention_mask=mask, use_cache=False))
    model.train()
    params = list(model.parameters())
    with attention.recording() as taken:
        got = torch.autograd.grad(model(x, attention_mask=mask)[mask.bool()].sum(), params)
    with attention.forced("dense"):
        want = torch.autograd.grad(model(x, attention_mask=mask)[mask.bool()].sum(), params)
    assert taken == ["stickbreaking-recompute"] * 2
    assert max((a - b).abs().max() for a, b in zip(got, want, strict=True)) <= 1e-10


def test_bad_pe_args_are_clear():
    with pytest.raises(ValueError, match=r"model.pe_args.kernel: unknown value 'cuda'; allowed: auto, torch"):
        tiny("stickbreaking", pe_args={"kernel": "cuda"})
    with pytest.raises(ValueError, match=r"model.pe_args.remainder: expected true or false, got 'self'"):
        tiny("stickbreaking", pe_args={"remainder": "self"})
    with pytest.raises(ValueError, match=r"model.causal: pe 'stickbreaking'"):
        tiny("stickbreaking", causal=False)


def test_plan_names_each_path():
    layer = tiny("stickbreaking").model.layers[0].pe
    cpu = dict(device_type="cpu", dtype=torch.float32, q_len=64, k_len=64)
    assert layer.plan(**cpu, grad=True, cached=False) == "stickbreaking-recompute"
    assert layer.plan(**cpu, grad=False, cached=False) == "stickbreaking-chunked"
    assert layer.plan(**{**cpu, "k_len": 80}, grad=True, cached=True) == "stickbreaking-chunked"
    with attention.forced("dense"):
        assert layer.plan(**cpu, grad=True, cached=False) == "stickbreaking-dense"


def test_causal_bit_for_bit(monkeypatch):
    """Changing the tokens from position 9 on leaves every earlier logit bit-identical (chunks of 3 queries, so one
    chunk holds queries on both sides)."""
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 16 * 3)
    model = tiny("stickbreaking", n_kv_heads=2)
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(6))
    y = x.clone()
    y[:, 9:] = (y[:, 9:] + 1) % VOCAB
    assert torch.equal(model(x)[:, :9], model(y)[:, :9]) and not torch.equal(model(x)[:, 9:], model(y)[:, 9:])


def test_fp32_products_stay_within_fp32_rounding():
    """The stick as products of (1 - b) in fp32 (not the paper's log-space sums) over 512 keys: within 1e-5 of the
    fp64 reference, as the log-space form in fp32 is."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 512, 32, generator=gen, dtype=torch.float64) for _ in range(3))
    want = stick_breaking_dense(q, k, v, None, 32 ** -0.5, False, False)
    products = stick_breaking(q.float(), k.float(), v.float(), None, 32 ** -0.5, False, False, 128)
    log_space = stick_breaking_dense(q.float(), k.float(), v.float(), None, 32 ** -0.5, False, False)
    assert (products.double() - want).abs().max() <= 1e-5 and (log_space.double() - want).abs().max() <= 1e-5
