"""Every attention path equals the naive fp64 reference, in outputs and gradients, for every PE.

The reference materialises all [Tq, Tk] scores in fp64 with each PE's defining bias (FIRE: its MLP on every pair,
not the piecewise form the chunked path uses). Chunk budgets are shrunk (`small_chunks`) so every path really runs
several chunks at these tiny shapes. Covered: padding on the left and right, grouped-query heads, a KV cache with
chunked prefill, dynamic NTK RoPE, the bias table's band gradients (T5 past max_distance), FlexAttention's forward
(compiled on the CPU; slow), and the path each PE takes (`attention.plan`).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny

from tapecli.model import PE_NAMES, KVCache, attention
from tapecli.model.attention import chunked, chunked_grads, flex, recompute
from tapecli.model.pe import fire

BIAS_PES = ("alibi", "t5", "fire")
TOL = 1e-10  # fp64
PATH_CHUNKS = {"path": {"pe_args": {"chunk_size": 4}}}  # PaTH: several chunks at test lengths, then merged


@pytest.fixture
def small_chunks(monkeypatch):
    """A few queries per chunk at test sizes (the chunked path, CoPE's and PaTH's query groups)."""
    monkeypatch.setattr(chunked, "chunk_rows", lambda b, h, tq, tk, elements=0, window=None: max(1, min(5, tq)))
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 2 * 4 * 24 * 5)


def naive_attention(q, k, v, bias, q_pos, k_pos, key_mask=None):
    """softmax(q k^T / sqrt(d) + bias(q_pos, k_pos)) v with every score materialised (fp64): causal over the last
    Tq of Tk keys, padded keys hidden except each query itself."""
    return naive_weights(q, k, bias, q_pos, k_pos, key_mask) @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)


def naive_weights(q, k, bias, q_pos, k_pos, key_mask=None):
    """The weights [B, H, Tq, Tk] of `naive_attention` (0 for keys a query cannot see)."""
    H, G = q.shape[1], k.shape[1]
    k = k.repeat_interleave(H // G, 1)
    Tq, Tk = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias(q_pos, k_pos)
    rows = torch.arange(Tk - Tq, Tk)[:, None]
    allowed = torch.arange(Tk) <= rows
    if key_mask is not None:
        allowed = allowed & (key_mask[:, None, :] | (torch.arange(Tk) == rows))
        allowed = allowed[:, None]
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


def layer_of(pe: str, **overrides):
    layer = randomize_tape(tiny(pe, **overrides), std=0.5).double().model.layers[0].pe
    if pe == "fire":
        with torch.no_grad():
            layer.threshold_scale.fill_(0.01)  # L = 5.12: most rows get their own normaliser
    return layer


def qkv(B=2, H=4, G=2, Tq=23, Tk=23, d=8, seed=0, dv=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, d, generator=gen, dtype=torch.float64)
    k = torch.randn(B, G, Tk, d, generator=gen, dtype=torch.float64)
    v = torch.randn(B, G, Tk, dv or d, generator=gen, dtype=torch.float64)
    return [t.requires_grad_() for t in (q, k, v)]


def left_padding(B: int, T: int, pad: int) -> torch.Tensor:
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[-1, :pad] = False
    return mask


def grads(out, inputs):
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return torch.autograd.grad((out * weight).sum(), inputs, allow_unused=True)


def assert_close(got, want, tol=TOL):
    for g, w in zip(got, want, strict=True):
        if w is None:
            assert g is None or g.abs().max() == 0
        else:
            assert (g - w).abs().max() <= tol * max(1.0, w.abs().max().item()), (g - w).abs().max()


@pytest.mark.parametrize("pe", BIAS_PES)
@pytest.mark.parametrize("case", ["plain", "left-padded", "cache-offset", "gqa-1"])
def test_chunked_path_equals_the_naive_reference(small_chunks, pe, case):
    """Outputs and gradients (queries, keys, values and the PE's own parameters) of the chunked CPU path."""
    layer = layer_of(pe, pe_args={"num_buckets": 8, "max_distance": 6} if pe == "t5" else {})
    Tq, Tk = (9, 23) if case == "cache-offset" else (23, 23)
    q, k, v = qkv(Tq=Tq, Tk=Tk, G=1 if case == "gqa-1" else 2)
    k_pos = (torch.arange(Tk) + 3)[None]
    key_mask = left_padding(2, Tk, 5) if case == "left-padded" else None
    if key_mask is not None:  # positions count real tokens only, as the model gives them
        k_pos = (key_mask.long().cumsum(-1) - 1).clamp(min=0)
    q_pos = k_pos[:, Tk - Tq:]
    need = layer.need(None, False)
    params = list(layer.parameters())
    got = chunked.chunked_attention(q, k, v, need, q_pos, k_pos, key_mask, 8 ** -0.5)
    want = naive_attention(q, k, v, layer.bias, q_pos, k_pos, key_mask)
    rows = torch.ones(2, Tq, dtype=torch.bool) if key_mask is None else key_mask[:, -Tq:]
    assert (got - want).transpose(1, 2)[rows].abs().max() <= TOL
    keep = rows[:, None, :, None].to(got.dtype)  # padded query rows are meaningless by contract
    assert_close(grads(got * keep, [q, k, v, *params]), grads(want * keep, [q, k, v, *params]))


def test_t5_table_gradients_cover_distances_past_max_distance(small_chunks):
    """T5 passes one table whose last entry stands for every distance >= max_distance; its gradient there comes
    from the band's complement (rows of dS sum to zero): equal to the naive gradient through the bucket lookup."""
    layer = layer_of("t5", pe_args={"num_buckets": 8, "max_distance": 6})
    q, k, v = qkv(Tq=30, Tk=30)
    pos = torch.arange(30)[None]
    need = layer.need(None, False)
    weight = layer.relative_attention_bias.weight
    got = chunked.chunked_attention(q, k, v, need, pos, pos, None, 8 ** -0.5)
    want = naive_attention(q, k, v, layer.bias, pos, pos)
    expected = grads(want, [q, k, v, weight])
    assert_close(grads(got, [q, k, v, weight]), expected)
    assert (expected[3][-1].abs() > 1e-3).all()  # the far bucket really carries gradient


@pytest.mark.parametrize("band_rows", [1, 2, 3])
@pytest.mark.parametrize(("Tq", "Tk", "window"), [(23, 23, None), (19, 22, None), (23, 23, 4)])
def test_t5_table_gradients_from_blocks_of_the_band(small_chunks, monkeypatch, band_rows, Tq, Tk, window):
    """The table's gradient scores only the band: blocks of `BAND_ROWS` queries, each over the m - 2 keys before it
    (zeros before key 0, masked) and its own. Blocks smaller than a chunk and a last, shorter block, from the first
    query on or after a KV cache, with grouped heads and with a window: the naive gradient."""
    monkeypatch.setattr(chunked_grads, "BAND_ROWS", band_rows)
    layer = layer_of("t5", pe_args={"num_buckets": 8, "max_distance": 6})
    q, k, v = qkv(Tq=Tq, Tk=Tk)
    k_pos = torch.arange(Tk)[None]
    q_pos = k_pos[:, Tk - Tq:]
    weight = layer.relative_attention_bias.weight

    def windowed(q_pos, k_pos):
        bias = layer.bias(q_pos, k_pos)
        far = q_pos[..., :, None] - k_pos[..., None, :] >= (window or Tk)
        return bias.masked_fill(far[:, None], float("-inf"))

    got = chunked.chunked_attention(q, k, v, layer.need(None, False), q_pos, k_pos, None, 8 ** -0.5, window=window)
    want = naive_attention(q, k, v, windowed, q_pos, k_pos)
    assert (got - want).abs().max() <= TOL
    assert_close(grads(got, [q, k, v, weight]), grads(want, [q, k, v, weight]))


def test_the_table_path_needs_consecutive_positions(small_chunks, monkeypatch):
    """ALiBi's table view is used for consecutive positions only; with a gap it builds each chunk from pairs."""
    layer = layer_of("alibi")
    q, k, v = qkv(Tq=12, Tk=12)
    gap = torch.cat((torch.arange(6), torch.arange(9, 15)))[None]
    used = []
    original = chunked.ChunkMasks.view
    monkeypatch.setattr(chunked.ChunkMasks, "view", lambda self, *a: used.append(1) or original(self, *a))
    for pos, table in ((torch.arange(12)[None], True), (gap, False)):
        used.clear()
        got = chunked.chunked_attention(q, k, v, layer.need(None, False), pos, pos, None, 8 ** -0.5)
        assert (got - naive_attention(q, k, v, layer.bias, pos, pos)).abs().max() <= TOL
        assert bool(used) == table


def test_a_bias_that_pairs_keeps_gets_its_values_back(small_chunks):
    """The chunk's causal mask is written into the bias `pairs` returned (no copy of the block); a tensor that
    `pairs` keeps (a cache) has its values back after each chunk's forward and backward, and the attention is
    still the reference's."""
    from tapecli.model.attention import ScoreBias

    layer = layer_of("alibi")
    returned = []

    def keeping(q_pos, k_pos):
        bias = layer.bias(q_pos, k_pos).contiguous()
        returned.append((bias, bias.clone()))
        return bias

    q, k, v = qkv(Tq=12, Tk=12)
    pos = torch.arange(12)[None]
    got = chunked.chunked_attention(q, k, v, ScoreBias(pairs=keeping), pos, pos, None, 8 ** -0.5)
    want = naive_attention(q, k, v, layer.bias, pos, pos)
    assert (got - want).abs().max() <= TOL
    assert_close(grads(got, [q, k, v]), grads(want, [q, k, v]))
    assert len(returned) == 6 and all(torch.equal(bias, values) for bias, values in returned)  # 3 chunks, twice


def test_input_grads_add_into_key_and_value_gradients_of_any_layout():
    """A chunk's dk and dv are added inside their matmuls where the gradients' first two dimensions merge, else
    added after: both give the hand-written products (fp64; a [B, T, G, d] layout transposed, and bf16 buffers)."""
    gen = torch.Generator().manual_seed(0)
    B, H, G, C, K, d = 2, 4, 2, 5, 9, 8
    q, do = (torch.randn(B, H, C, d, generator=gen, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, G, K, d, generator=gen, dtype=torch.float64) for _ in range(2))
    probs, ds = (torch.randn(B, H, C, K, generator=gen, dtype=torch.float64) for _ in range(2))
    start = torch.randn(B, G, K, d, generator=gen, dtype=torch.float64)
    grouped = (B, G, H // G, C)
    want_dk = start + 0.3 * torch.einsum("bgrck,bgrcd->bgkd", ds.view(*grouped, K), q.view(*grouped, d))
    want_dv = start + torch.einsum("bgrck,bgrcd->bgkd", probs.view(*grouped, K), do.view(*grouped, d))
    want_dq = 0.3 * ds @ k.repeat_interleave(H // G, 1)
    for layout in ("contiguous", "transposed", "bf16"):
        if layout == "transposed":  # [B, T, G, d] storage: B and G do not merge
            dk, dv = (start.transpose(1, 2).contiguous().transpose(1, 2) for _ in range(2))
            assert not chunked_grads.mergeable(dk)
        else:
            dtype = torch.bfloat16 if layout == "bf16" else torch.float64
            dk, dv = start.to(dtype, copy=True), start.to(dtype, copy=True)
        dq = chunked_grads.input_grads(q, k, v, do, probs, ds, 0.3, dk, dv)
        tol = 1e-2 if layout == "bf16" else 1e-12
        for got, want in ((dq, want_dq), (dk, want_dk), (dv, want_dv)):
            assert (got.double() - want).abs().max() <= tol * want.abs().max(), layout


def test_fire_piecewise_bias_is_its_mlp():
    layer = layer_of("fire")
    with torch.no_grad():
        layer.c.fill_(0.7)
        layer.threshold_scale.fill_(0.01)  # L = 5.12: rows past it use their own normaliser
    q_pos, k_pos = torch.arange(40)[None], torch.arange(40)[None]
    definition, piecewise = layer.bias(q_pos, k_pos), layer.piecewise_bias(q_pos, k_pos)
    assert (definition - piecewise).abs().max() <= 1e-12
    g = torch.randn_like(definition)
    params = list(layer.parameters())
    assert_close(torch.autograd.grad(piecewise, params, g), torch.autograd.grad(definition, params, g), 1e-11)



def test_fire_features_of_a_chunk_read_one_table_of_distances():
    """A chunk's queries latest first and its keys in order (how the chunked path asks): z is read as diagonals of
    one table of psi per distance, equal to psi of every pair's distance, values and gradients (c and L), in fp64;
    positions that do not step by one take the per-pair formula."""
    layer = layer_of("fire")
    with torch.no_grad():
        layer.c.fill_(0.7)
        layer.threshold_scale.fill_(0.01)  # L = 5.12
    q_pos, k_pos = torch.arange(30, 14, -1)[None], torch.arange(3, 31)[None]

    def per_pair(q_pos, k_pos):
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).double()
        threshold = torch.abs(layer.threshold_scale * layer.threshold)
        return layer.psi(distance) / (layer.psi(torch.maximum(q_pos.double(), threshold))[..., :, None] + fire.EPS)

    assert fire.steps_apart(q_pos, k_pos) and not fire.steps_apart(k_pos, k_pos)
    got, want = layer.features(q_pos, k_pos), per_pair(q_pos, k_pos)
    assert got.shape == want.shape == (1, 16, 28) and got.is_contiguous()  # searchsorted copies what is not
    assert (got - want).abs().max() <= 1e-15
    g = torch.randn_like(want)
    params = [layer.c, layer.threshold_scale]
    assert_close(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g), 1e-12)

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fire_segments_of_a_chunk_as_runs_equal_the_search_per_pair(dtype):
    """A chunk's segments found per row and break (`segment_runs`) are those of `torch.searchsorted` on every
    pair's z, so the bias is the same floats as SegmentLines' (fp32 and fp64; rows with future keys, keys that
    start past the queries' reach or after position 0, one unit that never switches: an infinite break); the
    gradients (summed per run instead of scattered per pair) agree to rounding."""
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for c, threshold, q_last, rows, k_first, keys in ((0.7, 0.01, 40, 16, 0, 41), (0.1, 1.0, 700, 32, 600, 101),
                                                      (2.0, 0.002, 30, 12, 5, 20), (0.05, 0.01, 25, 8, 30, 6)):
        layer = layer_of("fire").to(dtype)
        with torch.no_grad():
            for weight in layer.mlp.parameters():
                weight.copy_(torch.randn(weight.shape, generator=gen, dtype=dtype))
            layer.mlp[0].weight[3] = 0
            layer.c.fill_(c)
            layer.threshold_scale.fill_(threshold)
        q_pos, k_pos = torch.arange(q_last, q_last - rows, -1)[None], torch.arange(k_first, k_first + keys)[None]
        z, diagonals = layer.normalised(q_pos, k_pos)
        breaks, slopes, intercepts = layer.pieces()
        ids, lengths = fire.segment_runs(*diagonals[:2], breaks, diagonals[2], keys)
        want = torch.searchsorted(breaks, z.detach())
        assert torch.equal(ids.repeat(rows).repeat_interleave(lengths.reshape(-1)).view_as(want), want)
        checked += int(want.max() > want.min())
        got, ref = fire.SegmentRuns.apply(z, slopes, intercepts, ids, lengths), fire.SegmentLines.apply(
            z, slopes, intercepts, want)
        assert torch.equal(got, ref)
        g = torch.randn(got.shape, generator=gen, dtype=dtype)
        params = list(layer.parameters())
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        assert_close(torch.autograd.grad(got, params, g, retain_graph=True), torch.autograd.grad(ref, params, g), tol)
    assert checked == 4  # every case crosses breaks
    # Ties: z equal to a break stays below it, as in the search (a table |distance| for distances 6 .. -3).
    psi, normaliser = torch.tensor([6, 5, 4, 3, 2, 1, 0, 1, 2, 3], dtype=dtype), torch.tensor([1, 2, 0.5], dtype=dtype)
    breaks = torch.tensor([0.5, 1, 2, 3, 4, float("inf")], dtype=dtype)
    ids, lengths = fire.segment_runs(psi, normaliser, breaks, 6, 8)
    want = torch.searchsorted(breaks, fire.Diagonals.apply(psi, normaliser[:, None], 3, 8))
    assert torch.equal(ids.repeat(3).repeat_interleave(lengths.reshape(-1)).view_as(want), want)
    assert fire.segment_runs(torch.tensor([1.0, 3.0, 2.0]), torch.ones(2), breaks.float(), 2, 2) is None


def model_loss(model, x, mask):
    logits = model(x, attention_mask=mask)
    keep = torch.ones_like(logits[..., :1]) if mask is None else mask[..., None].to(logits.dtype)
    return logits, (logits * keep * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype)).sum()


# RoPE's frequency options (test_rotary_family) beside every PE: they change the rotary state's layout.
OPTION_CASES = [(pe, {}) for pe in PE_NAMES] + [("rope", {"pe_args": {"fope": True}}),
                                                ("rope", {"pe_args": {"partial_rotary_factor": 0.5, "hope": True}})]
OPTION_IDS = [pe if not o else f"{pe}-{'-'.join(o['pe_args'])}" for pe, o in OPTION_CASES]


@pytest.mark.parametrize("pe,overrides", OPTION_CASES, ids=OPTION_IDS)
@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_model_training_paths_equal_the_dense_reference(small_chunks, pe, overrides, padding):
    """Every PE's training step (the default paths, several chunks) equals the same model with every score
    materialised (attention.forced("dense"); CoPE: one chunk; PaTH: its key-carrying path, neither recomputed),
    logits and gradients, with grouped-query heads and padding on either side."""
    overrides = {**PATH_CHUNKS.get(pe, {}), **overrides}
    model = randomize_tape(tiny(pe, n_kv_heads=2, **overrides), std=0.3).double().train()
    x = torch.randint(0, VOCAB, (2, 22), generator=torch.Generator().manual_seed(4))
    mask = None
    if padding:
        mask = torch.ones(2, 22, dtype=torch.long)
        mask[1, :5] = 0 if padding == "left" else 1
        if padding == "right":
            mask[1, -5:] = 0
    reference = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    torch.manual_seed(0)  # RandPE draws its training positions
    with attention.recording() as taken:
        logits, loss = model_loss(model, x, mask)
    got = torch.autograd.grad(loss, params)
    torch.manual_seed(0)
    with attention.forced("dense"):
        ref_logits, ref_loss = model_loss(reference, x, mask)
        want = torch.autograd.grad(ref_loss, [p for p in reference.parameters() if p.requires_grad])
    real = torch.ones(2, 22, dtype=torch.bool) if mask is None else mask.bool()
    assert (logits - ref_logits)[real].abs().max() <= TOL
    assert_close(got, want)
    expected = {"alibi": "chunked", "t5": "chunked", "fire": "chunked", "cope": "cope-recompute",
                "path": "path-recompute", "fox": "fox-flash", "stickbreaking": "stickbreaking-recompute",
                "dape": "dape-chunked", "grape-ap": "grape-ap-chunked"}.get(pe, "chunked" if padding else "sdpa")
    assert expected in taken


@pytest.mark.parametrize("pe,overrides", [*OPTION_CASES,
    ("rope", {"pe_args": {"scaling": "dynamic", "factor": 2.0, "original_max_len": 8}}),
    ("tape", {"pe_args": {"aggregation": "separate"}}), ("alibi", {"n_kv_heads": 1})],
    ids=[*OPTION_IDS, "rope-dynamic-ntk", "tape-separate", "alibi-mqa"])
def test_cached_chunked_prefill_equals_recomputation(small_chunks, pe, overrides):
    """A left-padded batch prefilled through the KV cache in chunks of 4, then decoded: the logits of full
    recomputation (fp64), and greedy tokens equal."""
    model = randomize_tape(tiny(pe, n_kv_heads=overrides.pop("n_kv_heads", 2), **overrides), std=0.3).double()
    model.eval()
    x = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(6))
    mask = torch.ones(2, 14, dtype=torch.long)
    mask[0, :3] = 0
    with torch.no_grad():
        full = model(x, attention_mask=mask)
        if pe == "rope" and overrides:  # dynamic NTK changes every key past the original length: no cache there
            pieces = [model(x[:, :8], attention_mask=mask[:, :8])]
            cache = None
        else:
            cache = KVCache(model.config.n_layers)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            pieces = []
            for start in range(0, 14, 4):
                end = min(start + 4, 14)
                pieces.append(model(x[:, start:end], start_pos=positions[:, start], cache=cache,
                                    attention_mask=mask[:, :end][:, start:end]))
        if cache is not None:
            real = mask.bool()
            assert (torch.cat(pieces, 1) - full)[real].abs().max() <= 1e-9
    assert torch.equal(model.generate(x, 5, attention_mask=mask, prefill_chunk=4),
                       model.generate(x, 5, attention_mask=mask, use_cache=False))


@pytest.mark.parametrize("pe", ["cope", "path", "stickbreaking"])
def test_own_attention_recompute_gradients_equal_one_chunk(small_chunks, pe):
    """CoPE's, PaTH's and stick-breaking's training paths (several recomputed query groups) give the gradients of
    one unchunked pass (whose forward test_contextual_pe and test_new_pes check against naive loops)."""
    model = randomize_tape(tiny(pe, n_kv_heads=2, **PATH_CHUNKS.get(pe, {})), std=0.3).double().train()
    x = torch.randint(0, VOCAB, (2, 21), generator=torch.Generator().manual_seed(2))
    params = [p for p in model.parameters() if p.requires_grad]
    with attention.recording() as taken:
        got = torch.autograd.grad(model_loss(model, x, None)[1], params)
    assert taken == [f"{pe}-recompute"] * 2
    recompute.SCORE_ELEMENTS = 1 << 30  # monkeypatched by the fixture: restored after the test
    want = torch.autograd.grad(model_loss(model, x, None)[1], params)
    assert_close(got, want)


def test_plan_names_the_path_of_every_need():
    from tapecli.model.attention import OwnAttention, ScoreBias, WideValue

    bias, wide = ScoreBias(pairs=lambda q, k: None), WideValue(torch.zeros(1))
    cpu = dict(device_type="cpu", dtype=torch.float32, q_len=64, k_len=64, grad=True, padded=False)
    assert attention.plan(None, **cpu) == "sdpa"
    assert attention.plan(bias, **cpu) == "chunked"
    assert attention.plan(wide, **cpu) == "sdpa-concat"
    assert attention.plan(WideValue(torch.zeros(1), "separate"), **cpu) == "sdpa-separate"
    assert attention.plan(None, **{**cpu, "padded": True}) == "chunked"
    assert attention.plan(None, **{**cpu, "q_len": 16}) == "chunked"  # a chunked prefill after cached keys
    assert attention.plan(bias, **{**cpu, "q_len": 1}) == "dense"  # a decoding step
    assert attention.plan(OwnAttention(attend=None, plan=lambda *a: "mine"), **cpu) == "mine"
    with attention.forced("dense"):
        assert attention.plan(bias, **cpu) == "dense"
    with pytest.raises(ValueError, match="attention path 'fast'"):
        with attention.forced("fast"):
            pass


@pytest.mark.slow
def test_flex_forward_on_cpu_equals_the_reference(tmp_path, monkeypatch):
    """FlexAttention (CUDA's path for bias PEs and TAPE) runs its forward on the CPU through torch.compile: FIRE's
    score_mod with padding, a prefill offset and grouped keys; T5's score_mod with values twice the query width
    (TAPE's [V | E]). fp32, against the fp64 reference. Its backward is CUDA-only in torch 2.13."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # (FIRE with 4 hidden units: its score_mod unrolls them, and 32 take minutes to compile on the CPU, where
    # inductor 2.13 also miscompiles that large a score_mod together with padding and an offset. Lengths: inductor
    # 2.13's CPU FlexAttention template returns wrong outputs for some key lengths, measured at 24 and 40 keys even
    # without a score_mod, and right ones at 28, 30, 32, 47, 48, 64, 128 and 200; CUDA compiles Triton templates.)
    # Each case compiles afresh: a second shape would recompile with dynamic shapes, which the CPU template fails to
    # build in 2.13 (C++ error "cur_kvSplitSize1 was not declared").
    for pe, Tq, Tk, dv, padded in (("fire", 20, 28, 8, True), ("t5", 48, 48, 16, False)):
        torch._dynamo.reset()
        layer = layer_of(pe, pe_args={"hidden": 4} if pe == "fire" else {}).float()
        q, k, v = (t.detach() for t in qkv(Tq=Tq, Tk=Tk, dv=dv))
        k_pos = torch.arange(Tk)[None].expand(2, -1)
        key_mask = left_padding(2, Tk, 4) if padded else None
        if key_mask is not None:
            k_pos = (key_mask.long().cumsum(-1) - 1).clamp(min=0)
        q_pos = k_pos[:, Tk - Tq:]
        with torch.no_grad():
            got = flex.flex(q.float(), k.float(), v.float(), layer.need(None, False), q_pos, k_pos, key_mask,
                            8 ** -0.5)
        want = naive_attention(q, k, v, layer.double().bias, q_pos, k_pos, key_mask)
        real = torch.ones(2, Tq, dtype=torch.bool) if key_mask is None else key_mask[:, -Tq:]
        assert (got.double() - want).transpose(1, 2)[real].abs().max() <= 1e-5


def test_the_dense_mask_of_queries_after_cached_keys_is_causal():
    """A chunk prefilled after cached keys, without padding: query i (of 3, after 2 cached keys) sees keys <= 2 + i
    (it used to see every key, on the dense path and in an OwnAttention PE's mask)."""
    from tapecli.model.attention.dense import dense_mask

    mask, is_causal = dense_mask(None, None, 3, 5, torch.float32, torch.device("cpu"))
    assert not is_causal and mask.shape == (1, 1, 3, 5)
    assert mask[0, 0].tolist() == [[True] * 3 + [False] * 2, [True] * 4 + [False], [True] * 5]
    assert dense_mask(None, None, 3, 5, torch.float32, torch.device("cpu"), causal=False) == (None, False)
