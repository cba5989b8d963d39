"""CoPE and PaTH: equal to naive fp64 loops over all (i, j), exact under the KV cache, counted, selectable.

The generic tests in test_model.py (forward/backward, cached generation, bf16 autocast) loop over PE_NAMES and
cover both PEs too; these add the definitions and the cache with non-trivial PE weights.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import KVCache, ModelConfig, Transformer, count_parameters
from tapecli.model.pe.path import path_attention


def randomize_pe(model: Transformer, std: float = 0.5) -> Transformer:
    """Non-trivial PE weights (CoPE's table starts at zero, PaTH's w at nearly zero), as after training."""
    return randomize_tape(model, std)


def householder_product(w: torch.Tensor, beta: torch.Tensor, j: int, i: int) -> torch.Tensor:
    """H_i H_{i-1} ... H_{j+1} as a d x d matrix, H_s = I - beta_s w_s w_s^T (identity when j == i)."""
    d = w.shape[-1]
    product = torch.eye(d, dtype=w.dtype)
    for s in range(j + 1, i + 1):
        product = (torch.eye(d, dtype=w.dtype) - beta[s] * torch.outer(w[s], w[s])) @ product
    return product


def naive_path(q, k, v, w, beta, mask=None):
    """softmax_j(q_i^T H_i ... H_{j+1} k_j / sqrt(d)) v_j for the keys j <= i that mask [T, T] (default: causal)
    shows, one (b, h, i, j) at a time."""
    return naive_path_weights(q, k, w, beta, mask) @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)


def naive_path_weights(q, k, w, beta, mask=None):
    """The weights [B, H, T, T] of `naive_path` (0 for keys a query cannot see)."""
    B, H, T, d = q.shape
    group = H // k.shape[1]
    weights = q.new_zeros(B, H, T, T)
    for b in range(B):
        for h in range(H):
            g = h // group
            for i in range(T):
                keys = [j for j in range(i + 1) if mask is None or mask[i, j]]
                logits = torch.stack([q[b, h, i] @ householder_product(w[b, g], beta[b, g], j, i) @ k[b, g, j]
                                      for j in keys]) / math.sqrt(d)
                weights[b, h, i, keys] = logits.softmax(0)
    return weights


def random_path_inputs(B=2, H=4, G=2, T=9, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, w = (torch.randn(B, n, T, d, generator=gen, dtype=torch.float64) for n in (H, G, G, G))
    w = w / w.norm(dim=-1, keepdim=True)
    beta = 2 * torch.rand(B, G, T, generator=gen, dtype=torch.float64)
    return q, k, v, w, beta


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_path_attention_equals_the_naive_loop(chunk_size):
    q, k, v, w, beta = random_path_inputs()
    want = naive_path(q, k, v, w, beta)
    got, _ = path_attention(q, k, v, w, beta, None, chunk_size, keep_keys=False)
    assert (got - want).abs().max() <= 1e-12
    # The same with an explicit mask that hides key 2 from every query after it (its output is still its own).
    T = q.shape[2]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    mask[3:, 2] = False
    hidden = naive_path(q, k, v, w, beta, mask)
    got, _ = path_attention(q, k, v, w, beta, mask[None, None], chunk_size, keep_keys=False)
    assert (got - hidden).abs().max() <= 1e-12 and (hidden - want).abs().max() > 1e-3


def test_path_cached_keys_are_the_transformed_keys_and_continue_exactly():
    q, k, v, w, beta = random_path_inputs(T=10)
    full, keys = path_attention(q, k, v, w, beta, None, 3, True)
    for j in range(10):  # each key carries the maps of every later token: H_9 ... H_{j+1} k_j
        expected = torch.einsum("bgde,bge->bgd", torch.stack([torch.stack([
            householder_product(w[b, g], beta[b, g], j, 9) for g in range(2)]) for b in range(2)]), k[:, :, j])
        assert (keys[:, :, j] - expected).abs().max() <= 1e-12
    # Prefill 6 tokens, then 3, then 1: the same outputs as all 10 at once.
    past, outs, start = k[:, :, :0], [], 0
    for stop in (6, 9, 10):
        out, past = path_attention(q[:, :, start:stop], torch.cat((past, k[:, :, start:stop]), dim=2),
                                   v[:, :, :stop], w[:, :, start:stop], beta[:, :, start:stop], None, 4, True)
        outs.append(out)
        start = stop
    assert (torch.cat(outs, dim=2) - full).abs().max() <= 1e-12


def test_path_layer_builds_its_maps_as_documented():
    """beta = 2 sigmoid(W_beta x + b), w = u / sqrt(|u|^2 + 1e-6) with u the SiLU'd causal conv of W_w x; then the
    naive loop. The convolution is checked against torch's own padded Conv1d."""
    model = randomize_pe(tiny("path", n_kv_heads=2)).double()
    layer = model.model.layers[0].pe
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 6, 32, generator=gen, dtype=torch.float64)
    q = torch.randn(1, 4, 6, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 6, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    conv = torch.nn.functional.conv1d(layer.w_proj(x).transpose(1, 2), layer.w_conv1d.weight, padding=2,
                                      groups=16)[..., :6]
    u = torch.nn.functional.silu(conv).transpose(1, 2).reshape(1, 6, 2, 8).transpose(1, 2)
    w = u / (u.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    beta = 2 * torch.sigmoid(x @ layer.bt_proj.weight.T + layer.bt_proj.bias).transpose(1, 2)
    with torch.no_grad():
        got = layer.attend(x, q, k, v, None, True, None, None)
        assert (got - naive_path(q, k, v, w, beta)).abs().max() <= 1e-12


def test_path_with_identity_maps_is_nope():
    path = randomize_pe(tiny("path")).double()
    with torch.no_grad():
        for layer in path.model.layers:
            layer.pe.w_proj[1].weight.zero_()  # w = 0: every H_t is the identity
    nope = tiny("nope").double()
    nope.load_state_dict(path.state_dict(), strict=False)
    x = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(7))
    assert (path(x) - nope(x)).abs().max() <= 1e-12


def naive_cope(layer, q, k, v):
    """The CoPE definition with e[p] materialised, one (b, h, i, j) at a time."""
    return naive_cope_weights(layer, q, k)[0] @ v


def naive_cope_weights(layer, q, k):
    """The weights [B, H, T, T] of `naive_cope` and the contextual positions p_ij (0 for keys a query cannot see);
    keys one per query head."""
    B, H, T, d = q.shape
    e, npos_max = layer.pos_emb.detach().double(), layer.npos_max
    weights, positions = q.new_zeros(B, H, T, T), q.new_zeros(B, H, T, T)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                gates = torch.sigmoid(torch.stack([q[b, h, i] @ k[b, h, t] for t in range(i + 1)]) / math.sqrt(d))
                logits = []
                for j in range(i + 1):
                    p = min(float(gates[j:].sum()), npos_max)
                    positions[b, h, i, j] = p
                    lo, hi = math.floor(p), math.ceil(p)
                    embedding = (1 - (p - lo)) * e[lo] + (p - lo) * e[hi]
                    logits.append((q[b, h, i] @ k[b, h, j] + q[b, h, i] @ embedding) / math.sqrt(d))
                weights[b, h, i, :i + 1] = torch.stack(logits).softmax(0)
    return weights, positions


@pytest.mark.parametrize("npos_max", [3, 32])
def test_cope_attention_equals_the_naive_loop(npos_max):
    layer = randomize_pe(tiny("cope", pe_args={"npos_max": npos_max})).double().model.layers[0].pe
    gen = torch.Generator().manual_seed(2)
    q, k, v = (3 * torch.randn(2, 4, 9, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    got = layer.attend(None, q, k, v, None, True, None, None)
    assert (got - naive_cope(layer, q, k, v)).abs().max() <= 1e-12


def cope_case(case):
    """Inputs of CoPE's attention for one case of the function test below: (layer, q, k, v, mask, temperature)."""
    npos_max, T, past, G, scale = {"causal": (32, 23, 0, 4, 1.0), "saturated": (3, 40, 0, 4, 1.0),
                                   "padded-window": (4, 23, 0, 2, 2.0), "prefill-gqa": (5, 19, 7, 2, 2.0)}[case]
    layer = randomize_pe(tiny("cope", pe_args={"npos_max": npos_max})).double().model.layers[0].pe
    gen = torch.Generator().manual_seed(5)
    q = scale * torch.randn(2, 4, T, 8, generator=gen, dtype=torch.float64)
    k, v = (scale * torch.randn(2, G, past + T, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = None
    if case == "padded-window":  # two left-padded keys in the first row (a padded query sees itself), window 9
        i, j = torch.arange(T)[:, None], torch.arange(T)
        mask = ((j <= i) & (i - j < 9)).expand(2, 1, T, T).clone()
        mask[0, :, :, :2] = False
        mask[0, :, [0, 1], [0, 1]] = True
    return layer, q, k, v, mask, 0.7 if case == "prefill-gqa" else 1.0


@pytest.mark.parametrize("case", ["causal", "saturated", "padded-window", "prefill-gqa"])
def test_cope_training_function_gives_the_gradients_of_the_plain_formulas(monkeypatch, case):
    """CoPE's training path (`CoPEAttention`: its own backward, each chunk recomputed once, the gates computed in
    pieces of columns until every row's position reached npos_max) gives the output and the gradients (queries,
    keys, values, table) that autograd gives through the plain formulas (`CoPELayer.chunk_attention` on one chunk,
    attention.forced("dense")): fp64, to 1e-12. Chunks of 5 queries; "saturated" has positions clamped after a few
    keys (skipped gates), "padded-window" a padding and window mask, "prefill-gqa" 7 earlier keys, grouped keys
    and a temperature."""
    from tapecli.model import attention
    from tapecli.model.attention import recompute
    from tapecli.model.pe import cope_ops

    layer, q, k, v, mask, temperature = cope_case(case)
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * k.shape[2] * 5)
    seen, logits = [], cope_ops.chunk_logits

    def recorded(*args):
        out = logits(*args)
        seen.append((out[0].shape[-1], out[2], len(out[1])))
        return out

    monkeypatch.setattr(cope_ops, "chunk_logits", recorded)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)] + [layer.pos_emb]
    grad = torch.randn(2, 4, q.shape[2], 8, generator=torch.Generator().manual_seed(6), dtype=torch.float64)

    def run():
        out = layer.attend(None, *inputs[:3], mask, mask is None, None, None, temperature=temperature)
        return (out, *torch.autograd.grad(out, inputs, grad))

    got = run()
    with attention.forced("dense"):
        want = run()
    assert len(seen) == 2 * math.ceil(q.shape[2] / 5)  # the function's forward and backward, chunks of 5
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max() <= 1e-12
    assert min(g.abs().max() for g in got) > 1e-3  # every gradient is non-trivial
    if case == "saturated":  # later columns skipped, gates in more than one piece
        assert any(stop < width for width, stop, _ in seen) and max(pieces for *_, pieces in seen) > 1


def test_cope_training_function_passes_gradcheck():
    """`CoPEAttention` against finite differences (fp64), positions clamped at npos_max = 3 after a few keys."""
    from tapecli.model.pe.cope_ops import CoPEAttention, Hidden

    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(4, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, table: CoPEAttention.apply(q, k.flip(2), v.flip(2), table, Hidden(None, 0, q.device), 3,
                                                   0.7), (q, k, v, table))


@pytest.mark.parametrize("pe,overrides", [
    ("cope", {}), ("cope", {"n_kv_heads": 2, "pe_args": {"npos_max": 4}}),
    ("path", {"pe_args": {"chunk_size": 3}}), ("path", {"n_kv_heads": 2, "pe_args": {"conv_size": 4}}),
    ("path", {"pe_args": {"short_conv": False, "w_rank": 0}}),
], ids=["cope", "cope-gqa-npos4", "path-chunk3", "path-gqa-conv4", "path-noconv-fullrank"])
def test_cached_logits_equal_recomputation_with_trained_like_weights(pe, overrides):
    model = randomize_pe(tiny(pe, **overrides)).eval()
    x = torch.randint(0, VOCAB, (2, 15), generator=torch.Generator().manual_seed(3))
    cache = KVCache(model.config.n_layers)
    with torch.no_grad():
        full = model(x)
        pieces = [model(x[:, :7], cache=cache), model(x[:, 7:11], start_pos=7, cache=cache)]
        pieces += [model(x[:, t:t + 1], start_pos=t, cache=cache) for t in range(11, 15)]
    assert (torch.cat(pieces, dim=1) - full).abs().max() <= 1e-5
    reference = tiny(pe, **overrides).eval()  # the PE weights really change the output
    with torch.no_grad():
        assert (reference(x) - full).abs().max() > 1e-4  # 10x the cache tolerance above
    assert torch.equal(model.generate(x[:, :5], 8), model.generate(x[:, :5], 8, use_cache=False))


def test_path_cache_holds_only_transformed_keys_written_in_place():
    """The key buffer holds the transformed keys (no raw copy), rewritten in place each step: after 6 + 1 + 1 + 1
    tokens it equals a one-shot prefill's; the conv tail is PaTH's only other state; fp32 keys under autocast."""
    model = randomize_pe(tiny("path", n_kv_heads=2), std=0.3).eval()
    x = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(8))
    stepwise, oneshot, raw = (KVCache(model.config.n_layers, capacity=9) for _ in range(3))
    with torch.no_grad():
        model(x[:, :6], cache=stepwise)
        layer = stepwise.layers[1]
        pointers = {name: t.data_ptr() for name, t in layer.buffers.items()}
        for t in range(6, 9):
            model(x[:, t:t + 1], start_pos=t, cache=stepwise)
        model(x, cache=oneshot)
        model(x[:, :1], cache=raw)  # one token: its key is still untransformed
    assert set(layer.buffers) == {"k", "v"} and set(layer.state) == {"path_conv"}
    assert {name: t.data_ptr() for name, t in layer.buffers.items()} == pointers
    assert layer.state["path_conv"].shape == (2, 2, 16)  # [B, conv_size - 1, kv_dim]
    keys = layer.buffers["k"]
    assert (keys - oneshot.layers[1].buffers["k"]).abs().max() <= 1e-5
    assert (keys[:, :, :1] - raw.layers[1].buffers["k"][:, :, :1]).abs().max() > 1e-2  # 8 later maps acted
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        half = KVCache(model.config.n_layers)
        model(x, cache=half)
    assert half.layers[1].buffers["k"].dtype == torch.float32 and half.layers[1].buffers["v"].dtype == torch.bfloat16


@pytest.mark.parametrize("pe", ["cope", "path", "mapwm", "pope"])
def test_gradients_reach_every_pe_parameter(pe):
    model = randomize_pe(tiny(pe, n_kv_heads=2), std=0.3)
    model(torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))).pow(2).mean().backward()
    for name, p in model.named_parameters():
        if ".pe." in name:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_parameter_counts():
    cope = count_parameters(tiny("cope"))["pe"]
    assert cope == 2 * (32 + 1) * 8  # n_layers x (npos_max + 1) x head_dim, npos_max = min(max_seq_len, 1024)
    assert count_parameters(tiny("cope", pe_args={"npos_max": 64}))["pe"] == 2 * 65 * 8
    # Per layer: W_w low-rank (32 x 32 + 32 x 32), conv (kv_dim x 3), W_beta (dim x H_kv) + b_beta (H_kv).
    assert count_parameters(tiny("path"))["pe"] == 2 * (32 * 32 + 32 * 32 + 32 * 3 + 32 * 4 + 4)
    # Grouped-query (kv_dim 16), and a full-rank W_w.
    assert count_parameters(tiny("path", n_kv_heads=2))["pe"] == 2 * (32 * 32 + 32 * 16 + 16 * 3 + 32 * 2 + 2)
    assert count_parameters(tiny("path", n_kv_heads=2, pe_args={"w_rank": 0}))["pe"] == 2 * (32 * 16 + 16 * 3 + 66)
    with torch.device("meta"):
        big = Transformer(ModelConfig(vocab_size=32000, dim=768, n_layers=12, n_heads=12, ffn_dim=3072,
                                      max_seq_len=1024, pe="path"))
    assert count_parameters(big)["pe"] == 12 * (768 * 32 + 32 * 768 + 768 * 3 + 768 * 12 + 12) == 728_208


def test_cope_npos_max_default_is_capped_recorded_and_old_configs_keep_theirs(tmp_path):
    """The default is min(max_seq_len, 1024), recorded in the config; a model_config.json without npos_max (what
    earlier versions wrote, when the default was max_seq_len) opens, resumes and computes as it did."""
    import json

    from tapecli.data.tokenizer import load_tokenizer
    from tapecli.model.merge import merge_model_config
    from tapecli.store.checkpoint import read_model_config, save_model
    from tapecli.store.door import open_model

    long = tiny("cope", max_seq_len=2048)
    assert long.model.layers[0].pe.npos_max == 1024 and long.config.to_dict()["pe_args"] == {"npos_max": 1024}
    assert tiny("cope", max_seq_len=64).model.layers[0].pe.npos_max == 64
    args = {}
    ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, max_seq_len=8, pe="cope", pe_args=args)
    assert args == {}  # the caller's dict is not touched
    old = randomize_pe(tiny("cope", max_seq_len=1100, pe_args={"npos_max": 1100}), std=0.3)
    save_model(old, load_tokenizer("byte"), tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "model_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "pe_args": {}}))  # as earlier versions wrote it
    assert read_model_config(tmp_path / "ckpt")["pe_args"] == {"npos_max": 1100}
    opened = open_model(str(tmp_path / "ckpt"), device="cpu").model
    x = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(opened(x), old.eval()(x))
    resumed, _ = merge_model_config(read_model_config(tmp_path / "ckpt"), {"pe": "cope", "pe_args": {}}, "ckpt")
    assert resumed.pe_args == {"npos_max": 1100}


def test_cope_npos_max_is_recorded_for_a_cope_layer_inside_a_schedule():
    """A CoPE kind of a schedule, and a layer named `cope`, record the npos_max they resolved in their kind, as the
    model's own CoPE records it in model.pe_args; the caller's schedule is not touched."""
    given = {"pattern": ["rope", "cope", "local"], "kinds": {"local": {"pe": "cope", "window": 4}}}
    config = ModelConfig(vocab_size=61, dim=32, n_layers=3, n_heads=2, max_seq_len=2048, pe="rope", schedule=given)
    assert config.schedule["kinds"] == {"local": {"pe": "cope", "window": 4, "pe_args": {"npos_max": 1024}},
                                        "cope": {"pe": "cope", "pe_args": {"npos_max": 1024}}}
    assert given == {"pattern": ["rope", "cope", "local"], "kinds": {"local": {"pe": "cope", "window": 4}}}
    assert config.pe_args == {}  # the model's PE (RoPE) resolves nothing
    assert ModelConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert [layer.pe.npos_max for layer in Transformer(config).model.layers[1:]] == [1024, 1024]


def test_fresh_cope_attends_like_nope():
    """The official init (a zero table) makes a fresh CoPE model compute NoPE's logits exactly."""
    cope, nope = tiny("cope").double(), tiny("nope").double()
    nope.load_state_dict(cope.state_dict(), strict=False)
    x = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(5))
    assert (cope(x) - nope(x)).abs().max() <= 1e-12


def test_bad_pe_args_are_clear():
    with pytest.raises(ValueError, match=r"model.pe_args.npos_max: expected a positive integer, got 0"):
        tiny("cope", pe_args={"npos_max": 0})
    with pytest.raises(ValueError, match=r"model.pe_args.kernel: unknown value 'cuda'; allowed: auto, torch"):
        tiny("path", pe_args={"kernel": "cuda"})
    with pytest.raises(ValueError, match=r"model.pe_args.chunk_size: expected an integer >= 1, got 0"):
        tiny("path", pe_args={"chunk_size": 0})
    for pe in ("cope", "path", "mapwm"):
        with pytest.raises(ValueError, match=rf"model.causal: pe '{pe}'"):
            tiny(pe, causal=False)


def test_every_recipe_can_select_them():
    from tapecli.recipe import list_recipes, load_recipe

    # (the context-extension recipes hold RoPE's pe_args: cleared; the hybrids' layer schedules and the protocol
    # recipe's temperature too: PaTH takes no window, FoX and stick-breaking no temperature)
    plain = ["model.pe_args={}", "model.schedule={}", "model.temperature=1.0"]
    for name, _ in list_recipes():
        for pe in ("cope", "path", "fox", "stickbreaking", "mapwm", "pope"):
            recipe = load_recipe(name, [f"model.pe={pe}", *plain])
            assert ModelConfig(**recipe.model_config_kwargs(tokenizer_vocab_size=1000)).pe == pe


@pytest.mark.parametrize("chunk_size,budget,merge", [(1, 60, 3), (3, 144, 2), (4, 1, 1), (4, 1 << 30, 8)])
@pytest.mark.parametrize("masked", [None, "holes", "left-padding"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "materialised"])
def test_path_training_arrangement_equals_the_naive_loop(monkeypatch, chunk_size, budget, merge, masked, fused):
    """PaTH's training arrangement (chunks merged, queries carried back, a hand-written backward): outputs equal
    the naive loop, and gradients of every input equal autograd through the key-carrying path, with grouped-query
    heads and a mask, the earlier chunks' blocks through the CPU's fused flash kernel or materialised (as on other
    devices). The budget sets the merge: 4 merged chunks of 3 x 1 tokens, 2 of 2 x 3, 3 chunks of 4 unmerged, one
    of 3 x 4 (the fused path without a mask merges up to `merge` chunks whatever the budget, the same S here).
    Left padding hides whole chunks of keys from later queries (rows of a block that see no key)."""
    from tapecli.model.attention import recompute
    from tapecli.model.pe import path_ops

    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", budget)
    monkeypatch.setattr(path_ops, "fused_available", lambda device: fused)
    monkeypatch.setattr(path_ops, "MERGE", merge)
    inputs = [t.requires_grad_() for t in random_path_inputs(T=10)]
    T = inputs[0].shape[2]
    mask = None
    if masked:
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        if masked == "holes":
            mask[3:, 2] = False
            mask[7:, 5] = False
        else:  # six padding tokens first: each sees itself only, and no real token sees them
            mask[:, :6] = False
            mask.diagonal()[:6] = True
        mask = mask[None, None]
    got = path_ops.path_attention_by_queries(*inputs, mask, chunk_size)
    assert (got - naive_path(*inputs[:5], None if mask is None else mask[0, 0])).abs().max() <= 1e-12
    want, _ = path_attention(*inputs, mask, chunk_size, keep_keys=False)
    g = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad(got, inputs, g), torch.autograd.grad(want, inputs, g), strict=True):
        assert (a - b).abs().max() <= 1e-11
