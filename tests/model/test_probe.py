"""Attention probing (tapecli.model.attention.probe): the weights every layer reports are the naive fp64 weights,
chunk by chunk, for every PE and every attention path, and probing changes no output.

For each layer, the inputs attention received (q, k after the PE, its bias, CoPE's table, PaTH's maps) are recorded
and the weights recomputed with every score materialised by the references of test_attention.py and
test_contextual_pe.py; the chunks the probe hands out are assembled into [B, H, T, T] and compared. Chunk budgets are
shrunk so every path runs several chunks.
"""

from __future__ import annotations

import pytest
import torch
from test_attention import naive_weights
from test_contextual_pe import naive_cope_weights, naive_path_weights
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import PE_NAMES, KVCache, attention, transformer
from tapecli.model.attention import OwnAttention, ScoreBias, chunked, probe, recompute

pytestmark = pytest.mark.usefixtures("one_thread")
TOL = 1e-10  # fp64
OWN = ("cope", "path")
OVERRIDES = {"path": {"pe_args": {"chunk_size": 4}}, "t5": {"pe_args": {"num_buckets": 8, "max_distance": 6}}}


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(chunked, "chunk_rows", lambda b, h, tq, tk, elements=0, window=None: max(1, min(5, tq)))
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 13 * 5)  # 5 queries per chunk at these shapes


class Layers:
    """Records what attention received in every layer, and assembles the chunks the probe reports."""

    def __init__(self, monkeypatch, T: int) -> None:
        self.inputs, self.T = [], T
        self.weights, self.positions, self.rows = [], [], []
        real = transformer.attend

        def attend(q, k, v, need, **kwargs):
            self.inputs.append((q, k, need, kwargs))
            return real(q, k, v, need, **kwargs)

        monkeypatch.setattr(transformer, "attend", attend)

    def observe(self, chunk: probe.WeightsChunk) -> None:
        layer = len(self.inputs) - 1
        B, H, C, K = chunk.weights.shape
        if layer == len(self.weights):
            self.weights.append(torch.zeros(B, H, self.T, self.T, dtype=torch.float64))
            self.positions.append(torch.zeros(B, H, self.T, self.T, dtype=torch.float64))
            self.rows.append(torch.zeros(self.T, dtype=torch.long))
        self.weights[layer][:, :, chunk.first : chunk.first + C, :K] = chunk.weights
        if "positions" in chunk.extras:
            self.positions[layer][:, :, chunk.first : chunk.first + C, :K] = chunk.extras["positions"]
        self.rows[layer][chunk.first : chunk.first + C] += 1


def reference(model, q, k, need, kwargs):
    """The layer's weights (and CoPE's positions) with every score materialised, in fp64."""
    pe = need.attend.__self__ if isinstance(need, OwnAttention) else None  # the layer's LayerPE
    if isinstance(need, OwnAttention) and model.config.pe == "cope":
        return naive_cope_weights(pe, q, k.repeat_interleave(q.shape[1] // k.shape[1], 1))
    if isinstance(need, OwnAttention):
        u, beta = pe.householder(kwargs["x"], None, None)
        w = u / (u.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        return naive_path_weights(q, k, w, beta), None
    bias = need.pairs if isinstance(need, ScoreBias) else None
    return naive_weights(q, k, bias, kwargs["q_pos"], kwargs["k_pos"], kwargs["key_mask"]), None


UNREPORTED = ("stickbreaking", "dape", "grape-ap")  # own attention that reports no weights: refused while probing
THROUGH_TAPE = ("fox", "mapwm")  # own attention computed by tape's attention on encoded heads: tested below


@pytest.mark.parametrize("pe", [pe for pe in PE_NAMES if pe not in UNREPORTED + THROUGH_TAPE])
@pytest.mark.parametrize("path", ["sdpa", "chunked", "dense"])
def test_reported_weights_are_the_naive_weights_on_every_path(monkeypatch, small_chunks, pe, path):
    """Own-attention PEs: their default path and their reference path under forced("dense") (sdpa and chunked
    force nothing on them: both run their default path)."""
    if pe in OWN and path == "chunked":
        pytest.skip("the same as sdpa for a PE with its own attention")
    model = randomize_tape(tiny(pe, n_kv_heads=2, **OVERRIDES.get(pe, {})), std=0.5).double().eval()
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode(), attention.forced(path):
        plain = model(ids)
        layers = Layers(monkeypatch, 13)
        with probe.probing(layers.observe):
            probed = model(ids)
    assert (probed - plain).abs().max() <= TOL
    assert len(layers.weights) == len(layers.inputs) == 2
    for layer, (q, k, need, kwargs) in enumerate(layers.inputs):
        assert (layers.rows[layer] == 1).all()  # every query reported exactly once
        with torch.inference_mode():
            weights, positions = reference(model, q, k, need, kwargs)
        assert (layers.weights[layer] - weights).abs().max() <= TOL
        if positions is not None:
            assert (layers.positions[layer] * (weights > 0) - positions).abs().max() <= TOL


@pytest.mark.parametrize("pe", UNREPORTED)
def test_a_pe_that_reports_no_weights_is_refused_while_probing(pe):
    model = tiny(pe).double().eval()
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode(), probe.probing(lambda chunk: None):
        with pytest.raises(ValueError, match=r"^attention probing: this PE computes its own attention and does not "
                                             r"report its weights"):
            model(ids)


def probed_layers(model, monkeypatch) -> Layers:
    """Two sequences of 13 tokens, probed: the outputs equal the unprobed ones; the layers' inputs and weights."""
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        plain = model(ids)
        layers = Layers(monkeypatch, 13)
        with probe.probing(layers.observe):
            probed = model(ids)
    assert (probed - plain).abs().max() <= TOL
    return layers


@pytest.mark.parametrize("pe", ["nope", "rope", "alibi", "t5"])
def test_a_sliding_window_layer_reports_its_band(monkeypatch, small_chunks, pe):
    """model.window=4: every query's weights are the naive softmax over the 4 keys it sees (itself and the 3 before
    it), every other key 0; the table path (ALiBi, T5), the per-chunk masks (RoPE, NoPE); outputs unchanged."""
    model = randomize_tape(tiny(pe, n_kv_heads=2, window=4, **OVERRIDES.get(pe, {})), std=0.5).double().eval()
    layers = probed_layers(model, monkeypatch)
    distance = torch.arange(13)[:, None] - torch.arange(13)
    band = (distance >= 0) & (distance < 4)
    for layer, (q, k, need, kwargs) in enumerate(layers.inputs):
        assert kwargs["window"] == 4 and (layers.rows[layer] == 1).all()
        bias = need.pairs if isinstance(need, ScoreBias) else None
        scores = naive_weights(q, k, bias, kwargs["q_pos"], kwargs["k_pos"]).log()
        weights = scores.masked_fill(~band, float("-inf")).softmax(-1)
        assert (layers.weights[layer] - weights).abs().max() <= TOL
        assert (layers.weights[layer][..., ~band] == 0).all()


def test_fox_reports_its_forgetting_weights(monkeypatch, small_chunks):
    """FoX's weights are softmax(q.k / sqrt(d) + c_i - c_j), c the cumulative log forget gates: reported through
    its widened heads, equal to that formula in fp64; outputs unchanged."""
    model = randomize_tape(tiny("fox", n_kv_heads=2), std=0.5).double().eval()
    layers = probed_layers(model, monkeypatch)
    for layer, (q, k, _, kwargs) in enumerate(layers.inputs):
        with torch.inference_mode():
            _, c = model.model.layers[layer].pe.decay(kwargs["x"], None, None)
            gates = c[..., :, None] - c[..., None, :]  # c_i - c_j
            weights = naive_weights(q, k, lambda qp, kp, gates=gates: gates, None, None)
        assert (layers.rows[layer] == 1).all() and (layers.weights[layer] - weights).abs().max() <= TOL


def test_mapwm_reports_the_weights_of_its_rotated_heads(monkeypatch, small_chunks):
    """MapWM rotates queries and keys itself, then attends through tape's attention (`encoded_attention`): the
    weights reported are the naive weights of the heads it rotated; outputs unchanged."""
    from tapecli.model.pe import base

    model = randomize_tape(tiny("mapwm", n_kv_heads=2), std=0.5).double().eval()
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(3))
    rotated, real = [], base.attend
    monkeypatch.setattr(base, "attend", lambda q, k, v, need, **kw: rotated.append((q, k)) or real(q, k, v, need, **kw))
    with torch.inference_mode():
        layers = Layers(monkeypatch, 13)
        with probe.probing(layers.observe):
            probed = model(ids)
        rotated.clear()
        plain = model(ids)
    assert (probed - plain).abs().max() <= TOL and len(rotated) == 2
    for layer, (q, k) in enumerate(rotated):
        weights = naive_weights(q, k, None, None, None)
        assert (layers.rows[layer] == 1).all() and (layers.weights[layer] - weights).abs().max() <= TOL


def test_probe_path_with_padding_and_a_cache_offset(monkeypatch, small_chunks):
    """Left padding (hidden keys, positions over real tokens), then queries after cached keys: the probe path's
    masks are the dispatcher's (dense.visible)."""
    model = randomize_tape(tiny("alibi", n_kv_heads=2), std=0.5).double().eval()
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :3] = 0
    real = mask.bool()
    with torch.inference_mode():
        plain = model(ids, attention_mask=mask)
        layers = Layers(monkeypatch, 11)
        with probe.probing(layers.observe):
            probed = model(ids, attention_mask=mask)
            cache = KVCache(2)
            model(ids[:, :7], attention_mask=mask[:, :7], cache=cache)
            cached = model(ids[:, 7:], start_pos=torch.tensor([7, 4]), cache=cache)
    assert (probed - plain)[real].abs().max() <= TOL and (cached - plain[:, 7:]).abs().max() <= TOL
    for call, (q, k, need, kwargs) in enumerate(layers.inputs):
        if call in (4, 5):  # the 4 queries after 7 cached keys: keys of the prefill call too
            k = torch.cat((layers.inputs[call - 2][1], k), dim=2)
        with torch.inference_mode():
            weights, _ = reference(model, q, k, need, kwargs)
        rows = slice(k.shape[2] - q.shape[2], k.shape[2])  # the queries are the last of the keys
        got = layers.weights[call][:, :, rows, : k.shape[2]]
        assert (got - weights).transpose(1, 2)[real[:, rows]].abs().max() <= TOL


def test_probing_needs_no_gradients_and_a_reporting_pe():
    model = tiny("rope").eval()
    ids = torch.randint(0, VOCAB, (1, 6))
    with probe.probing(lambda chunk: None), pytest.raises(RuntimeError, match="without gradients"):
        model(ids)
    silent = OwnAttention(attend=lambda *args: None, plan=lambda *args: "own")
    q = torch.zeros(1, 2, 3, 4)
    with torch.inference_mode(), probe.probing(lambda chunk: None), pytest.raises(ValueError, match="report"):
        attention.attend(q, q, q, silent, x=q, q_pos=torch.arange(3)[None], k_pos=torch.arange(3)[None],
                         key_mask=None, cache=None)
    assert attention.plan(None, "cpu", torch.float32, 8, 8, False, False) == "sdpa"  # nothing left active


def test_probed_long_sequence_keeps_no_square_tensor():
    """At 2,048 tokens (the default chunk budget, 2 heads) no allocation of the probed forward reaches one head's
    [T, T] map in fp32: the CPU profiler records every allocation."""
    from torch.profiler import ProfilerActivity, profile

    T = 2048
    model = randomize_tape(tiny("alibi", n_heads=2, max_seq_len=T), std=0.5).eval()
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(5))
    chunks = []
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, \
            probe.probing(lambda chunk: chunks.append(chunk.weights.shape[-2])):
        model.run(ids)
    largest = max(event.cpu_memory_usage for event in prof.events())
    assert len(chunks) > 2 * 2 and sum(chunks) == 2 * T  # several chunks per layer, every query once
    assert 0 < largest < T * T * 4
