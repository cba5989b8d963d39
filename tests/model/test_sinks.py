"""Learned attention sinks (`model.sinks`): one logit per head in each softmax's denominator, equal to an fp64
reference with every score materialised and the sink's column written out (outputs, and gradients of q, k, v, the
bias and the sinks), on every attention path the CPU has (chunked, several chunks included; dense; probe) and on
FlexAttention's (CUDA's) through its unfused eager form, with biases given as tables (ALiBi, T5 with a table
shorter than the keys) or pairs (FIRE), TAPE's wide values, windows, padding, a prefill offset and a temperature;
transformers' GPT-OSS attention gives the same; exact through the KV cache, chunked prefill and padding (`tape pe
check`'s checks), in hybrid schedules; refused in one line where it cannot be exact.
"""

from __future__ import annotations

import math

import pytest
import torch
from cli_helpers import one_line_error
from test_attention import grads, layer_of, left_padding, qkv
from test_model import tiny, tokens
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.model import ModelConfig, attention
from tapecli.model.attention import chunked
from tapecli.model.attention.probe import probing
from tapecli.model.hf.export import check_exportable
from tapecli.pe.check import Subject, run_check
from tapecli.recipe import load_recipe

H, G = 4, 2
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)


def reference(q, k, v, sinks, bias=None, q_pos=None, k_pos=None, key_mask=None, window=None, temperature=1.0):
    """GPT-OSS's attention written out in fp64: logits l_ij = (q_i . k_j / sqrt(d) + bias_ij) / T over the keys
    query i sees (causal over the last Tq of Tk keys, within `window` positions, padded keys hidden except itself),
    the sink logit s_h appended as one more column, softmax over all, the sink's column dropped, times v."""
    B, _, Tq, d = q.shape
    Tk = k.shape[2]
    k, v = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)
    if bias is not None:
        logits = logits + bias.pairs(q_pos, k_pos)
    logits = logits / temperature
    for b in range(B):
        for i in range(Tq):
            for j in range(Tk):
                seen = j <= Tk - Tq + i and (window is None or q_pos[min(b, len(q_pos) - 1), i]
                                             - k_pos[min(b, len(k_pos) - 1), j] < window)
                if key_mask is not None and not key_mask[b, j] and j != Tk - Tq + i:
                    seen = False
                if not seen:
                    logits[b, :, i, j] = float("-inf")
    column = sinks[None, :, None, None].expand(B, H, Tq, 1)
    return torch.cat((logits, column), -1).softmax(-1)[..., :-1] @ v


CASES = {  # name: (pe or None, pe_args, dv, window, padded, offset, temperature)
    "plain": (None, {}, None, None, False, 0, 1.0),
    "alibi-window-padded": ("alibi", {}, None, 4, True, 0, 1.0),
    "t5-short-table": ("t5", {"num_buckets": 8, "max_distance": 16}, None, None, False, 0, 0.7),
    "fire-padded-offset": ("fire", {"hidden": 4}, None, None, True, 5, 1.0),
    "wide-values-window": (None, {}, 16, 4, False, 0, 1.0),
}


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("T", [3, 11, 40])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["chunked", "dense", "flex"])
def test_every_path_equals_the_reference_in_outputs_and_gradients(path, case, T, monkeypatch, request):
    """flex: through flex_attention's eager form (`eager_flex`), T5's learned table through its band gradient."""
    pe, pe_args, dv, window, padded, offset, temperature = CASES[case]
    if path == "flex":
        request.getfixturevalue("eager_flex")
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", 2 * H * 16 * (T + offset))  # several chunks of 16 queries
    monkeypatch.setattr(chunked, "PAIRS_ELEMENTS", 2 * H * 16 * (T + offset))
    q, k, v = qkv(Tq=T, Tk=T + offset, dv=dv, seed=T)
    sinks = SINKS.clone().requires_grad_()
    layer = layer_of(pe, pe_args=pe_args) if pe else None
    need = layer.need(None, False) if layer else None
    Tk = T + offset
    key_mask = left_padding(2, Tk, 3) if padded else None
    k_pos = torch.arange(Tk)[None] if key_mask is None else (key_mask.long().cumsum(-1) - 1).clamp(min=0)
    q_pos = k_pos[:, Tk - T:]
    bias_params = [] if layer is None else [p for p in layer.parameters() if p.requires_grad]
    with attention.forced(path), attention.recording() as taken:
        got = attention.attend(q, k, v, need, x=None, q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, cache=None,
                               window=window, temperature=temperature, sinks=sinks)
    assert taken == [path]
    want = reference(q, k, v, sinks, need, q_pos, k_pos, key_mask, window, temperature)
    rows = slice(None) if key_mask is None else key_mask[:, Tk - T:]  # padded queries' outputs are meaningless
    assert (got - want).transpose(1, 2)[rows].abs().max() <= 1e-12
    weight = torch.linspace(-1, 1, got.numel(), dtype=got.dtype).view_as(got)
    if key_mask is not None:
        weight = weight * key_mask[:, None, Tk - T:, None]
    inputs = [q, k, v, sinks, *bias_params]
    for a, b in zip(grads(got * weight, inputs), grads(want * weight, inputs), strict=True):
        assert (a - b).abs().max() <= 1e-11


def test_the_sinks_take_weight_and_transformers_gpt_oss_attention_agrees():
    """With a large sink a head attends to almost nothing; transformers' GPT-OSS eager attention (its own module's
    `sinks`) computes what tape does, through the chunked path and the dense one."""
    from torch import nn
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    q, k, v = (t.detach() for t in qkv(Tq=9, Tk=9))
    module = nn.Module()
    module.sinks, module.num_key_value_groups = nn.Parameter(SINKS.clone()), H // G
    causal = torch.zeros(9, 9, dtype=torch.float64).masked_fill(~torch.ones(9, 9, dtype=torch.bool).tril(), -math.inf)
    want, _ = eager_attention_forward(module.eval(), q, k, v, causal, 8 ** -0.5)
    for path in ("chunked", "dense"):
        with attention.forced(path):
            got = attention.attend(q, k, v, None, x=None, q_pos=torch.arange(9)[None], k_pos=torch.arange(9)[None],
                                   key_mask=None, cache=None, sinks=module.sinks.detach())
        assert (got.transpose(1, 2) - want).abs().max() <= 1e-12
    loud = torch.full((H,), 30.0, dtype=torch.float64)
    quiet = attention.attend(q, k, v, None, x=None, q_pos=torch.arange(9)[None], k_pos=torch.arange(9)[None],
                             key_mask=None, cache=None, sinks=loud)
    assert quiet.abs().max() < 1e-9


def test_probing_reports_the_weights_the_sinks_leave():
    model = tiny("alibi", sinks=True).double()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.copy_(SINKS)
    x = tokens(2, 12)
    reported = []
    with torch.inference_mode():
        plain = model(x)
        with probing(lambda chunk: reported.append(chunk.weights)):
            probed = model(x)
    assert (probed - plain).abs().max() <= 1e-12
    sums = torch.cat([w.sum(-1).flatten() for w in reported])
    assert len(reported) == 2 and bool((sums < 1 - 1e-3).all()) and bool((sums > 0).all())


@pytest.mark.parametrize(("pe", "keys"), [
    ("rope", {"sinks": True}),
    ("alibi", {"sinks": True, "window": 6}),
    ("tape", {"sinks": True}),
    ("rope", {"schedule": {"pattern": ["local", "global"], "kinds": {
        "local": {"window": 5, "sinks": True}, "global": {"pe": "nope"}}}}),
])
def test_tape_pe_checks_pass_with_sinks(pe, keys):
    """tape pe check's exact checks on a model with sinks (in every layer, or in a hybrid's local layers only): the
    paths it takes vs every score materialised (outputs and gradients, padded or not), the KV cache and chunked
    prefill vs the full forward, padding and save-load."""
    subject = Subject(pe, device=torch.device("cpu"), keys=keys)
    model = subject.model()
    assert [layer.self_attn.sinks is not None for layer in model.model.layers] == (
        [True] * 2 if "schedule" not in keys else [True, False] * 2)
    for name in ("dense", "kv-cache", "chunked-prefill", "padding", "save-load"):
        outcome = run_check(name, subject)
        assert outcome.ok, (name, outcome.text)
        if name == "dense":
            assert set(outcome.info["paths"]["train"]) == {"chunked"} | ({"sdpa"} if "schedule" in keys else set())


def test_cached_generation_equals_uncached():
    model = tiny("rope", sinks=True, window=5)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 2.0)
    x = tokens(2, 7)
    assert torch.equal(model.generate(x, 12, use_cache=True), model.generate(x, 12, use_cache=False))


def test_parameters_names_init_and_saved_config():
    model = tiny("rope", sinks=True)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters() if "sinks" in n}
    assert shapes == {f"model.layers.{i}.self_attn.sinks": (4,) for i in range(2)}
    assert 0 < model.model.layers[0].self_attn.sinks.abs().max() < 0.2  # N(0, init_std), as GPT-OSS's
    assert not any("sinks" in n for n, _ in tiny("rope").named_parameters())
    model(tokens()).logsumexp(-1).sum().backward()
    assert all(layer.self_attn.sinks.grad.abs().sum() > 0 for layer in model.model.layers)
    saved = model.config.to_dict()
    assert saved["sinks"] is True and ModelConfig.from_dict(saved).sinks is True
    del saved["sinks"]  # a config written before the key existed
    assert ModelConfig.from_dict(saved).sinks is False
    assert "sinks" not in tiny("rope").config.attention_keys()
    assert model.config.attention_keys() == {"sinks": True}


def test_what_cannot_be_exact_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^model.sinks: expected true or false \(a learned sink logit per head\), "
                                         r"got 'yes'$"):
        ModelConfig(vocab_size=61, dim=32, n_layers=1, n_heads=2, sinks="yes")
    with pytest.raises(ValueError, match="^model.schedule.kinds.local.sinks: pe 'cope' computes attention itself and "
                                         "does not implement attention sinks$"):
        ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=2, pe="cope",
                    schedule={"pattern": ["local"], "kinds": {"local": {"sinks": True}}})
    with pytest.raises(TapeError, match="^model.sinks: pe 'fox' computes attention itself and does not implement "
                                        "attention sinks$"):
        load_recipe("selective-copy-smoke", ["model.pe=fox", "model.sinks=true"])
    assert load_recipe("selective-copy-smoke", ["model.sinks=true"]).model.sinks is True
    model = tiny("rope", sinks=True)
    for path in ("sdpa", "flash-attn", "sdpa-concat", "sdpa-separate"):
        with attention.forced(path), pytest.raises(ValueError, match=f"^attention path {path}: returns no "
                                                                     "log-sum-exp, which attention sinks"):
            model(tokens())
    with pytest.raises(TapeError, match="^model.sinks: the only Hugging Face architecture with attention sinks, "
                                        "GptOssForCausalLM, needs a mixture-of-experts MLP"):
        check_exportable(model)


def test_the_planner_sends_sinks_to_paths_with_a_log_sum_exp():
    plan = attention.plan
    assert plan(None, "cpu", torch.float32, 64, 64, True, False, sinks=True) == "chunked"
    assert plan(None, "cpu", torch.float32, 64, 64, True, False) == "sdpa"
    assert plan(None, "cpu", torch.float32, 1, 64, False, False, sinks=True) == "dense"
    assert plan(None, "cuda", torch.bfloat16, 64, 64, True, False, sinks=True) == "flex"


def test_tape_pe_check_with_sinks_on_the_command_line():
    """`tape pe check --sinks` builds every checked model with sinks; a PE that computes its own attention is refused
    in one line."""
    result = CliRunner().invoke(app, ["pe", "check", "alibi", "--sinks", "--no-speed"])
    assert result.exit_code == 0, result.output
    assert "model.sinks=True" in result.output and "all 11 checks passed" in result.output
    assert "chunked" in result.output  # the dense check's paths: sinks take the chunked path on the CPU
    result = CliRunner().invoke(app, ["pe", "check", "cope", "--sinks", "--no-speed"])
    one_line_error(result, 2, "model.sinks: pe 'cope' computes attention itself and does not implement attention "
                              "sinks")


@pytest.mark.slow
def test_a_compiled_training_step_with_sinks_equals_the_eager_one():
    """tape pe check's compile check (aot_eager: the same tracing, no C++ build): the chunked path's autograd
    Function, sinks among its inputs, traced into the graph."""
    outcome = run_check("compile", Subject("t5", keys={"sinks": True}, compile_backend="aot_eager"))
    assert outcome.ok, outcome.text
