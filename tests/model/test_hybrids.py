"""Hybrid models: a PE per layer (schedules), attention temperature, length scaling and sliding windows, exact
against an independent reference on every attention path.

The reference (`naive_attend`) replaces the model's attention: every [Tq, Tk] score materialised in fp64, the
causal, padding and window rules written out anew (not `attention.dense.visible`), the bias from the PE's `pairs`,
divided by the temperature; PEs that compute attention themselves get that mask. Each model is compared with it on
every path (`attention.forced`, and the default plan), in logits and in gradients, with grouped-query heads,
padding on either side, a KV cache prefilled in chunks, and windows shorter than the sequence, so the chunked path
visits a window's keys only and the windowed cache drops what no query sees any more.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import ModelConfig, attention
from tapecli.model.attention import OwnAttention, ScoreBias, WideValue, chunked, recompute
from tapecli.model.attention.scaling import QueryScale
from tapecli.model.hybrid import HybridState
from tapecli.model.schedule import describe

TOL = 1e-9

# Every kind of layer: windows shorter than the test sequences, temperatures, both length scales.
HYBRIDS = {
    "irope": dict(pe="rope", temperature=0.9, schedule={
        "pattern": ["local", "local", "global"],
        "kinds": {"local": {"window": 4, "pe_args": {"theta": 100.0}},
                  "global": {"pe": "nope", "length_scale": "llama4",
                             "length_scale_args": {"floor_scale": 3.0, "attn_scale": 0.5}}}}),
    "rnope-swa": dict(pe="nope", length_scale="log", length_scale_args={"length": 6}, schedule={
        "every": {"n": 2, "kind": "nope", "others": "swa"},
        "kinds": {"swa": {"pe": "rope", "window": 5, "length_scale": "none"}}}),
    "bias": dict(pe="alibi", schedule={
        "layers": ["alibi-local", "t5", "fire"],
        "kinds": {"alibi-local": {"window": 5}, "t5": {"pe": "t5", "temperature": 0.8,
                                                       "pe_args": {"num_buckets": 8, "max_distance": 6}},
                  "fire": {"pe": "fire", "window": 6, "temperature": 1.3}}}),
    "tape-nope": dict(pe="tape", schedule={
        "pattern": ["tape", "nope", "local-tape"], "kinds": {"local-tape": {"window": 4}}}),
    "contextual": dict(pe="rope", schedule={
        "layers": ["cope", "path", "rope"],
        "kinds": {"cope": {"pe": "cope", "window": 5, "temperature": 0.9},
                  "path": {"pe": "path", "temperature": 1.1, "pe_args": {"chunk_size": 4}}}}),
    "sinks": dict(pe="rope", schedule={  # attention sinks in some layers (GPT-OSS's), over a bias and wide values
        "layers": ["local", "t5", "tape"],
        "kinds": {"local": {"window": 4, "sinks": True},
                  "t5": {"pe": "t5", "sinks": True, "temperature": 0.8, "pe_args": {"num_buckets": 8,
                                                                                     "max_distance": 6}},
                  "tape": {"pe": "tape", "sinks": True, "temperature": 1.2}}}),
}


def hybrid(name: str, **overrides):
    kwargs = {"n_layers": 3, "n_kv_heads": 2, **copy.deepcopy(HYBRIDS[name]), **overrides}
    model = randomize_tape(tiny(kwargs.pop("pe"), **kwargs), std=0.3).double()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.self_attn.sinks is not None:  # sink logits of order 1 (their init is N(0, 0.02))
                layer.self_attn.sinks.copy_(torch.randn(layer.self_attn.sinks.shape, generator=generator))
    return model


@pytest.fixture
def small_chunks(monkeypatch):
    """A few queries per chunk at test sizes, so every path really runs several chunks (window or not)."""
    monkeypatch.setattr(chunked, "chunk_rows", lambda b, h, tq, tk, elements=0, window=None: max(1, min(3, tq)))
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 24 * 5)


def naive_attend(q, k, v, need, *, x, q_pos, k_pos, key_mask, cache, causal=True, window=None, temperature=1.0,
                 sinks=None):
    """The reference attention (module docstring); `sinks` [H]: GPT-OSS's sink column joins the softmax."""
    if k.shape[1] != v.shape[1]:
        v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
    if isinstance(need, WideValue):
        v = torch.cat((v, need.values.to(v.dtype).expand(v.shape[0], -1, -1, -1)), dim=-1)
    if cache is not None:
        k, v = cache.append(k=k, v=v)
        k_pos = k_pos[..., -k.shape[2]:]
        key_mask = None if key_mask is None else key_mask[:, -k.shape[2]:]
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    q_pos, k_pos = q_pos.expand(B, Tq), k_pos.expand(B, Tk)
    allowed = torch.zeros(B, 1, Tq, Tk, dtype=torch.bool)
    for b in range(B):
        for i in range(Tq):
            me = Tk - Tq + i  # the query's own key
            for j in range(me + 1):
                real = key_mask is None or bool(key_mask[b, j]) or j == me
                near = window is None or int(q_pos[b, i] - k_pos[b, j]) < window
                allowed[b, 0, i, j] = real and near
    if isinstance(need, OwnAttention):
        options = {"temperature": temperature} if temperature != 1.0 else {}
        return need.attend(x, q, k, v, allowed, False, key_mask, cache, **options)
    k, v = (t.repeat_interleave(H // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    if isinstance(need, ScoreBias):
        scores = scores + need.pairs(q_pos, k_pos)
    logits = (scores / temperature).masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        column = sinks.to(logits.dtype)[None, :, None, None].expand(B, H, Tq, 1)
        return torch.cat((logits, column), -1).softmax(-1)[..., :-1] @ v
    return logits.softmax(-1) @ v


def loss_of(model, x, mask):
    logits = model(x, attention_mask=mask)
    keep = torch.ones_like(logits[..., :1]) if mask is None else mask[..., None].to(logits.dtype)
    return logits, (logits * keep * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum()


def padding(kind: str | None, T: int) -> torch.Tensor | None:
    if kind is None:
        return None
    mask = torch.ones(2, T, dtype=torch.long)
    if kind == "left":
        mask[1, :5] = 0
    else:
        mask[1, -5:] = 0
    return mask


@pytest.mark.parametrize("name", HYBRIDS)
@pytest.mark.parametrize("path", [None, "dense", "chunked", "sdpa"])
@pytest.mark.parametrize("pad", [None, "left", "right"])
def test_every_path_equals_the_naive_reference(small_chunks, monkeypatch, name, path, pad):
    """Logits and every gradient of a training step, on each path, equal the naive fp64 reference."""
    model = hybrid(name).train()
    reference = copy.deepcopy(model)
    x = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(3))
    mask = padding(pad, 15)
    if name == "sinks" and path == "sdpa":  # no log-sum-exp on that path: refused, not wrong
        with attention.forced(path), pytest.raises(ValueError, match="^attention path sdpa: returns no log-sum-exp"):
            loss_of(model, x, mask)
        return
    params = [p for p in model.parameters() if p.requires_grad]
    with attention.forced(path) if path else torch.enable_grad():
        logits, loss = loss_of(model, x, mask)
        got = torch.autograd.grad(loss, params)
    monkeypatch.setattr("tapecli.model.transformer.attend", naive_attend)
    ref_logits, ref_loss = loss_of(reference, x, mask)
    want = torch.autograd.grad(ref_loss, [p for p in reference.parameters() if p.requires_grad])
    real = torch.ones(2, 15, dtype=torch.bool) if mask is None else mask.bool()
    assert (logits - ref_logits)[real].abs().max() <= TOL
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max() <= TOL * max(1.0, w.abs().max().item())


@pytest.mark.parametrize("name", HYBRIDS)
def test_cached_chunked_prefill_and_decoding_equal_the_reference(small_chunks, monkeypatch, name):
    """A left-padded batch through a windowed KV cache, prefilled 4 tokens at a time, then one token at a time:
    every logit equals the uncached reference; the windowed layers' caches hold their window, not the sequence;
    greedy generation with the cache equals generation without."""
    model = hybrid(name).eval()
    x = torch.randint(0, VOCAB, (2, 22), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 22, dtype=torch.long)
    mask[0, :3] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = model.new_cache()
    pieces = []
    with torch.no_grad():
        for start, end in [(0, 4), (4, 8), (8, 12), (12, 16), *((t, t + 1) for t in range(16, 22))]:
            pieces.append(model(x[:, start:end], start_pos=positions[:, start], cache=cache,
                                attention_mask=mask[:, start:end]))
        monkeypatch.setattr("tapecli.model.transformer.attend", naive_attend)
        want = model(x, attention_mask=mask)
    assert (torch.cat(pieces, 1) - want)[mask.bool()].abs().max() <= TOL
    for layer, cached in zip(model.model.layers, cache.layers, strict=True):
        window = layer.self_attn.window
        held = cached.buffers["k"].shape[2]
        assert (held <= max(2 * window, window + 3) and cached.first > 0) if window else held >= 22
    monkeypatch.undo()  # (the reference attention; and the small chunks: generation runs at its own sizes)
    assert torch.equal(model.generate(x, 6, attention_mask=mask, prefill_chunk=5),
                       model.generate(x, 6, attention_mask=mask, use_cache=False))


@pytest.mark.parametrize("name", HYBRIDS)
def test_flex_forward_equals_the_reference(monkeypatch, name):
    """FlexAttention's block masks (windows over padded positions) and score_mods (temperature), traced by dynamo
    and run unfused (backend "eager"; the compiled kernel's numbers: test_attention.py), forward only (its
    backward is CUDA's)."""
    from tapecli.model.attention import flex

    torch._dynamo.reset()
    monkeypatch.setattr(flex, "compiled_flex", lambda: torch.compile(flex.flex_module().flex_attention,
                                                                      backend="eager"))
    model = hybrid(name).eval()
    x = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(3))
    mask = padding("left", 15)
    with torch.no_grad():
        with attention.forced("flex"), attention.recording() as taken:
            got = model(x, attention_mask=mask)
        monkeypatch.setattr("tapecli.model.transformer.attend", naive_attend)
        want = model(x, attention_mask=mask)
    assert (got - want)[mask.bool()].abs().max() <= TOL
    assert "flex" in taken
    torch._dynamo.reset()


def test_a_schedule_names_each_layer():
    config = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=6, n_heads=4, pe="rope", pe_args={"theta": 1e6},
                         schedule={"every": {"n": 3, "kind": "global", "others": "local"},
                                   "kinds": {"local": {"window": 8, "pe_args": {"theta": 1e4}},
                                             "global": {"pe": "nope", "length_scale": "llama4"}}})
    specs = config.layers()
    assert [s.kind for s in specs] == ["local", "local", "global"] * 2
    assert specs[0].pe_args == {"theta": 1e4} and specs[2].pe_args == {}  # merged over model.pe_args; nope's own
    assert specs[2].length_scale_args == {"floor_scale": 8192.0, "attn_scale": 0.1}
    assert describe(specs) == "rope x4 (window 8) + nope x2 (llama4 scale)"
    pattern = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=5, n_heads=4, pe="rope",
                          schedule={"pattern": ["rope", "rope", "nope"]})
    assert [s.pe for s in pattern.layers()] == ["rope", "rope", "nope", "rope", "rope"]
    joined = ModelConfig(**{**pattern.to_dict(), "schedule": {"pattern": "rope+rope+nope"}})
    assert joined.layers() == pattern.layers()
    plain = ModelConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4)
    assert plain.attention_keys() == {} and describe(plain.layers()) == "rope"


@pytest.mark.parametrize("changes,message", [
    ({"schedule": {"pattern": ["local"]}}, "model.schedule: layer name 'local' is neither"),
    ({"schedule": {"pattern": ["rope"], "layers": ["rope"] * 2}},
     "model.schedule: give exactly one of pattern, every, layers"),
    ({"schedule": {"layers": ["rope"]}}, "model.schedule.layers: names 1 layers, the model has model.n_layers=2"),
    ({"schedule": {"every": {"n": 0, "kind": "rope", "others": "nope"}}}, "model.schedule.every.n: expected a"),
    ({"schedule": {"every": {"n": 3, "kind": "nope", "others": "rope"}}},  # would make no nope layer
     "model.schedule.every.n: 3 is more than model.n_layers=2, so no layer would be 'nope'; give n <= 2"),
    ({"schedule": {"pattern": ["rope", "nope", "rope"]}},  # the third name would be dropped
     "model.schedule.pattern: names 3 layers, more than model.n_layers=2; give at most 2 names"),
    ({"window": 0, "schedule": {"pattern": ["local", "global"], "kinds": {"local": {"window": 4}, "global": {}}}},
     "model.window: expected a positive number of keys"),  # the model-level key, not kinds.global.window
    ({"temperature": 0, "schedule": {"pattern": ["x", "y"], "kinds": {"x": {"temperature": 2.0}, "y": {}}}},
     "model.temperature: the attention temperature must be a number > 0"),
    ({"schedule": {"pattern": ["x"], "kinds": {"x": {"windw": 4}}}}, "model.schedule.kinds.x.windw: not a layer key"),
    ({"schedule": {"pattern": ["x"], "kinds": {"x": {"pe_args": {"thta": 1}}}}},
     "model.schedule.kinds.x.pe_args.thta: not an argument of pe 'rope'"),
    ({"schedule": {"pattern": ["x"], "kinds": {"x": {"pe": "path", "window": 4}}}},
     "model.schedule.kinds.x.window: pe 'path' computes attention itself and does not implement a sliding window"),
    ({"schedule": {"pattern": ["rope", "randpe"]}}, "model.schedule: pe 'randpe' draws its own positions"),
    ({"window": 0}, "model.window: expected a positive number of keys"),
    ({"pe": "randpe", "window": 8}, "model.window: pe 'randpe' trains on random positions"),
    ({"temperature": 0}, "model.temperature: the attention temperature must be a number > 0"),
    ({"length_scale": "qwen"}, "model.length_scale: unknown length scale 'qwen'; allowed: none, llama4, log"),
    ({"length_scale": "log", "length_scale_args": {"length": 1}}, "model.length_scale_args.length: expected"),
    ({"window": 4, "causal": False}, "model.window: a sliding window needs a causal model"),
])
def test_mistakes_name_their_key(changes, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        ModelConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, **changes)


def test_length_scales_follow_their_formulas():
    """Llama 4: 1 + attn_scale log(1 + floor((p + 1) / floor_scale)); log-n: max(1, log(p + 1) / log(L))."""
    p = torch.tensor([[0, 1, 6, 7, 8, 100, 8190, 8191, 20000]])
    llama4 = QueryScale.of("llama4", {}, 512).factors(p, torch.float64)[0].tolist()
    assert llama4 == pytest.approx([1 + 0.1 * math.log(1 + (n + 1) // 8192) for n in p[0].tolist()], abs=1e-15)
    assert llama4[6] == 1.0 and llama4[7] > 1.0
    log = QueryScale.of("log", {}, 8).factors(p, torch.float64)[0].tolist()
    assert log == pytest.approx([max(1.0, math.log(n + 1) / math.log(8)) for n in p[0].tolist()], abs=1e-15)
    assert QueryScale.of("none", {}, 8) is None


def test_the_length_scale_multiplies_each_query(monkeypatch):
    """What reaches attention is the query times s(its position), keys untouched; padding counts no position."""
    seen = {}

    def capture(q, k, v, need, **kwargs):
        seen.setdefault("q", []).append(q)
        seen.setdefault("k", []).append(k)
        return torch.zeros_like(q)

    monkeypatch.setattr("tapecli.model.transformer.attend", capture)
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = padding("left", 12)
    for scale in ("none", "log"):
        tiny("nope", n_layers=1, length_scale=scale, length_scale_args={"length": 3} if scale == "log" else {})(
            x, attention_mask=mask)
    (plain, scaled), (k0, k1) = seen["q"], seen["k"]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    factor = (torch.log(positions.double() + 1) / math.log(3)).clamp(min=1)
    assert torch.allclose(scaled, plain * factor[:, None, :, None].float(), atol=1e-6) and torch.equal(k0, k1)


def test_a_stateful_pe_carries_its_state_through_its_own_layers_only(monkeypatch):
    """[tape, nope, tape]: TAPE's state leaves layer 0 and enters layer 2 unchanged by the NoPE layer between; the
    last TAPE layer's updates are skipped and frozen, as the last layer's in an all-TAPE model; parameter names
    stay model.layers.{i}.pe.*."""
    model = hybrid("tape-nope")
    layers = model.model.layers
    assert [layer.group for layer in layers] == [0, 1, 0]
    assert [layer.carries_state for layer in layers] == [True, False, False]
    frozen = list(layers[2].pe.parameters())
    assert frozen and not any(p.requires_grad for p in frozen)
    names = {name.split(".pe.")[0] for name, _ in model.named_parameters() if ".pe." in name}
    assert names == {"model.layers.0", "model.layers.2"}
    entering = {}
    for i, layer in enumerate(layers):
        original = layer.forward

        def spy(x, state, *args, i=i, original=original):
            entering[i] = state
            out = original(x, state, *args)
            entering[f"{i} out"] = out[1]
            return out

        monkeypatch.setattr(layer, "forward", spy)
    with torch.no_grad():
        _, final = model.run(torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1)))
    assert isinstance(final, HybridState)
    after_first = entering["0 out"].parts[0].rotary
    assert not torch.equal(after_first, entering[0].parts[0].rotary)  # layer 0 updated it
    assert entering[2].parts[0].rotary is after_first  # the NoPE layer passed it on untouched
    assert final.parts[0].rotary is after_first  # the last TAPE layer's updates feed nothing and are skipped
