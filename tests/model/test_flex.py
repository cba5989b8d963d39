"""FlexAttention's contract, checked on the CPU (its compiled backward is CUDA-only in torch 2.13):

- every bias PE's `ScoreMod` equals its defining `pairs` bias, in values and in gradients to the layer's
  parameters (the score_mod evaluated on every (head, query, key) with torch.vmap, as FlexAttention's own unfused
  path does), and reads each argument that requires gradients once (the CUDA backward refuses several reads);
- (FlexAttention's own unfused forward and backward with each score_mod: `tape pe check`'s score-mod check, run for
  every built-in by tests/pe/test_pe_check.py);
- one compiled flex_attention serves every layer of a 12-layer model (dynamo's frame counter, backend "eager" so
  no kernel is built), and reaching the recompile limit raises instead of falling back to the unfused kernel.
The compiled forward's numbers are checked against the fp64 reference in test_attention.py.
"""

from __future__ import annotations

import collections

import pytest
import torch
from test_model import VOCAB, randomize_tape, tiny
from torch.overrides import TorchFunctionMode

from tapecli.model import attention
from tapecli.model.attention import flex

BIAS_PES = {"alibi": {}, "t5": {"num_buckets": 8, "max_distance": 6}, "fire": {"hidden": 5}}


def bias_layer(pe: str):
    layer = randomize_tape(tiny(pe, pe_args=BIAS_PES[pe]), std=0.5).double().model.layers[0].pe
    if pe == "fire":
        with torch.no_grad():
            layer.threshold_scale.fill_(0.01)  # L = 5.12: most rows get their own normaliser
    return layer


def every_pair(mod, heads: int, q_pos, k_pos):
    """[H, Tq, Tk]: the score_mod's bias of every (head, query, key), through vmap like FlexAttention's math path."""
    def one(h, q, k):
        return mod.fn(h, q, k, *mod.args)

    over_keys = torch.vmap(one, in_dims=(None, None, 0))
    over_queries = torch.vmap(over_keys, in_dims=(None, 0, None))
    return torch.vmap(over_queries, in_dims=(0, None, None))(torch.arange(heads), q_pos, k_pos)


@pytest.mark.parametrize("pe", BIAS_PES)
def test_score_mod_equals_the_pair_bias_in_values_and_gradients(pe):
    layer = bias_layer(pe)
    q_pos, k_pos = torch.arange(3, 40), torch.arange(3, 40)
    need = layer.need(None, False)
    got = every_pair(need.score_mod, 4, q_pos, k_pos)
    want = layer.bias(q_pos[None], k_pos[None])[0]
    causal = q_pos[:, None] >= k_pos[None, :]
    assert (got - want)[:, causal].abs().max() <= 1e-12
    params = [p for p in layer.parameters() if p.requires_grad]
    if not params:
        return
    weight = torch.randn(got.shape, dtype=got.dtype, generator=torch.Generator().manual_seed(0)) * causal
    got_grads = torch.autograd.grad((got * weight).sum(), params, allow_unused=True)
    want_grads = torch.autograd.grad((want * weight).sum(), params, allow_unused=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert (g - w).abs().max() <= 1e-10 * max(1.0, w.abs().max().item())


class Reads(TorchFunctionMode):
    """Counts the torch operations that read each watched tensor (metadata such as .dtype does not count)."""

    def __init__(self, watched):
        super().__init__()
        self.index = {id(t): i for i, t in enumerate(watched)}
        self.count = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") != "__get__":
            for arg in (*args, *kwargs.values()):
                if id(arg) in self.index:
                    self.count[self.index[id(arg)]] += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("pe", BIAS_PES)
def test_score_mod_reads_each_tensor_that_needs_gradients_once(pe):
    mod = bias_layer(pe).need(None, False).score_mod
    watched = [a for a in mod.args if isinstance(a, torch.Tensor) and a.requires_grad]
    assert pe == "alibi" or watched  # T5's table, FIRE's MLP
    with Reads(watched) as reads:
        mod.fn(torch.tensor(1), torch.tensor(9), torch.tensor(2), *mod.args)
    assert sorted(reads.count.values()) == [1] * len(watched)


def test_fire_spreads_the_gradients_of_its_learned_values_over_copies():
    """FlexAttention's backward adds each score's gradient into what the score_mod read, one atomic addition per
    score: FIRE reads c, L and its segments' lines from one of FLEX_COPIES copies per pair (autograd sums them), so
    that the pairs of one kernel tile (64 queries x 32 keys) add into every copy, at most twice as many into one as
    an even spread would, instead of all into one address per head. (The bias is linear in the intercepts: their
    gradient counts the pairs that read each copy.)"""
    from tapecli.model.pe.fire import FLEX_COPIES

    mod = bias_layer("fire").need(None, False).score_mod
    args = [a.detach().requires_grad_() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in mod.args]
    c_distance, intercepts = args[0], args[4]
    assert c_distance.shape == (4, FLEX_COPIES) and intercepts.shape[1] % FLEX_COPIES == 0
    bias = every_pair(type(mod)(mod.fn, tuple(args)), 4, torch.arange(1000, 1064), torch.arange(600, 632))
    per_line = torch.autograd.grad(bias.sum(), intercepts)[0]  # [H, segments x copies]: pairs that read each
    per_copy = per_line.unflatten(1, (-1, FLEX_COPIES)).sum(1)
    assert per_copy.sum().item() == 4 * 64 * 32
    assert per_copy.min().item() > 0 and per_copy.max().item() <= 2 * 64 * 32 / FLEX_COPIES


@pytest.fixture
def counted_flex(monkeypatch):
    """flex_attention compiled with dynamo's frame counter (backend "eager": traced and guarded like the real
    kernel, run unfused), from a clean dynamo cache."""
    from torch._dynamo.testing import CompileCounter  # imports torch._dynamo (~2 s): not when the file is collected

    torch._dynamo.reset()
    counter = CompileCounter()
    monkeypatch.setattr(flex, "compiled_flex", lambda: torch.compile(flex.flex_module().flex_attention,
                                                                      backend=counter))
    yield counter
    torch._dynamo.reset()


@pytest.mark.parametrize("pe", ["alibi", "t5", "fire", "tape"])
def test_one_compiled_kernel_serves_every_layer(counted_flex, pe):
    model = randomize_tape(tiny(pe, n_layers=12, pe_args={"hidden": 2} if pe == "fire" else {}), std=0.3).eval()
    x = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), attention.forced("flex"), attention.recording() as taken:
        model(x)
    assert taken == ["flex"] * 12
    # TAPE's last layer averages no state (nothing reads it after): its values are narrower, a second variant.
    assert counted_flex.frame_count == (2 if pe == "tape" else 1)


def test_the_recompile_limit_raises_instead_of_falling_back(counted_flex, monkeypatch):
    monkeypatch.setattr(flex, "RECOMPILE_LIMIT", 1)
    q = torch.randn(1, 2, 16, 8)
    pos = torch.arange(16)[None]
    flex.flex(q, q, q, None, pos, pos, None, 8 ** -0.5)
    with pytest.raises(flex.FlexRecompileLimit, match="refusing its unfused fallback"):
        flex.flex(q.double(), q.double(), q.double(), None, pos, pos, None, 8 ** -0.5)


def test_chunked_prefill_and_windows_do_not_recompile_per_offset(counted_flex):
    """The block mask's rules hold their offsets and windows as tensors: a prompt prefilled in chunks (a new offset
    each), with windowed and global layers, compiles once per shape regime (static, then dynamic shapes, then one
    query per step: dynamo specialises a length of 1), not per chunk."""
    model = randomize_tape(tiny("alibi", n_layers=4, schedule={"pattern": ["local", "global"],
                                                                "kinds": {"local": {"window": 6}, "global": {}}}),
                             std=0.3).eval()
    x = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with attention.forced("flex"):
        model.generate(x, 2, prefill_chunk=4)
    assert counted_flex.frame_count <= 6  # 3 regimes x (a window or not), for 10 chunks and 2 decoding steps


def test_fire_asks_for_its_own_tiles_and_only_cuda_calls_get_them():
    """FIRE's score_mod compiles on an H200 only with tiles smaller than FlexAttention's defaults (FLEX_TILES): its
    ScoreMod carries them, and every CUDA call with it passes them on; the CPU's kernels keep their own."""
    from tapecli.model.attention.needs import ScoreBias, ScoreMod
    from tapecli.model.pe.fire import FLEX_TILES, FIRELayer, fire_score

    bias = FIRELayer(n_heads=2, hidden=3, init_c=0.1, threshold=512.0).need(None, False)
    assert bias.score_mod.fn is fire_score and bias.score_mod.kernel_options == FLEX_TILES
    assert flex.kernel_options(bias, torch.device("cuda")) == {"kernel_options": FLEX_TILES}
    assert flex.kernel_options(bias, torch.device("cpu")) == {}
    plain = ScoreBias(pairs=bias.pairs, score_mod=ScoreMod(fire_score, bias.score_mod.args))
    assert flex.kernel_options(plain, torch.device("cuda")) == flex.kernel_options(None, torch.device("cuda")) == {}
    with pytest.raises(ValueError, match=r"ScoreMod.kernel_options takes a dict .* got \[\('BLOCK_M', 64\)\]"):
        ScoreMod(fire_score, (), [("BLOCK_M", 64)])


@pytest.fixture
def score_mod_fns(monkeypatch) -> list:
    """The function of every score_mod flex builds (`score_mod_of`), in order."""
    fns = []
    original = flex.score_mod_of
    monkeypatch.setattr(flex, "score_mod_of", lambda mod, *args: fns.append(mod.fn) or original(mod, *args))
    return fns


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize(("case", "Tq", "Tk", "window", "temperature"), [
    ("plain", 23, 23, None, 1.0), ("cache-offset", 9, 23, None, 0.7), ("window", 23, 23, 4, 1.0),
    ("left-padded", 23, 23, None, 1.0)])
def test_a_learned_table_gets_its_gradient_from_the_band_not_from_the_kernel(monkeypatch, eager_flex, score_mod_fns,
                                                                             case, Tq, Tk, window, temperature):
    """T5's table enters FlexAttention detached (`table_score`: no atomic addition per score into it on CUDA) and
    `TableGrad` gives it the band's gradient, in slices of queries (BAND_ELEMENTS), with grouped heads, after a
    KV cache, with a window and a temperature: outputs and gradients equal the fp64 reference (the gradient of the far
    bucket included). Padding keeps T5's own score_mod, whose gradient FlexAttention sums itself; so do a forward
    without gradients and ALiBi's table, which learns nothing."""
    from test_attention import grads, layer_of, left_padding, qkv
    from test_sinks import reference

    from tapecli.model.attention import chunked_grads, table_grad
    from tapecli.model.pe.alibi import alibi_score
    from tapecli.model.pe.t5 import t5_score

    monkeypatch.setattr(chunked_grads, "BAND_ROWS", 2)
    monkeypatch.setattr(table_grad, "BAND_ELEMENTS", 2 * 4 * (2 + 7 - 2) * 4)  # slices of 4 queries (2 blocks)
    layer = layer_of("t5", pe_args={"num_buckets": 8, "max_distance": 6})
    weight = layer.relative_attention_bias.weight
    q, k, v = qkv(Tq=Tq, Tk=Tk)
    key_mask = left_padding(2, Tk, 5) if case == "left-padded" else None
    k_pos = (torch.arange(Tk) + 3)[None] if key_mask is None else (key_mask.long().cumsum(-1) - 1).clamp(min=0)
    q_pos = k_pos[:, Tk - Tq:]
    need = layer.need(None, False)
    got = flex.flex(q, k, v, need, q_pos, k_pos, key_mask, 8 ** -0.5 / temperature, window, 1 / temperature)
    assert score_mod_fns == [t5_score if key_mask is not None else flex.table_score]
    want = reference(q, k, v, torch.full((4,), float("-inf"), dtype=torch.float64), need, q_pos, k_pos, key_mask,
                     window, temperature)
    keep = (torch.ones(2, Tq) if key_mask is None else key_mask[:, -Tq:])[:, None, :, None].double()
    assert ((got - want) * keep).abs().max() <= 1e-12
    got_grads, want_grads = (grads(out * keep, [q, k, v, weight]) for out in (got, want))
    assert window is not None or want_grads[3][-1].abs().min() > 1e-3  # the far bucket carries gradient
    for a, b in zip(got_grads, want_grads, strict=True):
        assert (a - b).abs().max() <= 1e-11
    with torch.no_grad():
        flex.flex(q, k, v, need, q_pos, k_pos, key_mask, 8 ** -0.5)
    flex.flex(q, k, v, layer_of("alibi").need(None, False), q_pos, k_pos, key_mask, 8 ** -0.5)
    assert score_mod_fns[1:] == [t5_score, alibi_score]


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_under_torch_compile_a_learned_table_leaves_the_graph_for_its_band_gradient(eager_flex, score_mod_fns):
    """Under torch.compile (train.compile) a graph cannot check that positions are consecutive: T5's FlexAttention
    call runs eagerly (a graph break per layer) and still reads its table detached, with the band's gradient; the
    compiled training step (AOTAutograd, the rest of the model in graphs) equals the eager one."""
    torch._dynamo.reset()
    x = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    results = []
    for compiled in (False, True):
        model = randomize_tape(tiny("t5", n_layers=2, n_kv_heads=2), std=0.3).train()
        run = torch.compile(model, backend="aot_eager") if compiled else model
        with attention.forced("flex"):
            logits = run(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch._dynamo.reset()
    assert set(score_mod_fns) == {flex.table_score} and len(score_mod_fns) == 4
    (want_loss, want), (got_loss, got) = results
    assert torch.allclose(got_loss, want_loss, atol=1e-6)
    assert got.keys() == want.keys() and any("relative_attention_bias" in n for n in got)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6, rtol=1e-5), name
