"""Generation for long contexts: left-padded batches equal each prompt alone, for every PE; chunked prefill, the
preallocated cache and dynamic NTK give what full recomputation gives; attention memory stays linear."""

from __future__ import annotations

import pytest
import torch
from test_model import TRAINED_LIKE, VOCAB, randomize_tape, tiny, tokens

from tapecli.model import PE_NAMES, KVCache

PAD = 0  # also a digit id in the Abacus case: padding must not count as a digit

BATCH_CASES = [(pe, {}) for pe in PE_NAMES] + [
    ("tape", {"pe_args": {"aggregation": "separate"}}),
    ("tape", {"n_kv_heads": 2}),
    ("cope", {"n_kv_heads": 2, "pe_args": {"npos_max": 4}}),
    ("path", {"n_kv_heads": 2, "pe_args": {"chunk_size": 2}}),
    ("path", {"pe_args": {"short_conv": False}}),
    ("fox", {"n_kv_heads": 2, "pe_args": {"rope": True, "qk_norm": True, "k_shift": True, "v_shift": True,
                                          "output_gate": True, "output_norm": True}}),
    ("stickbreaking", {"pe_args": {"attend_current": True, "remainder": True}}),
    ("rope", {"abacus": True, "abacus_digit_ids": list(range(10))}),
    ("rope", {"max_seq_len": 8, "pe_args": {"scaling": "dynamic", "factor": 2.0}}),
    ("tape", {"max_seq_len": 8, "pe_args": {"scaling": "dynamic", "factor": 2.0}}),
    ("rope", {"n_kv_heads": 2, "pe_args": {"fope": True}}),
    ("rope", {"pe_args": {"partial_rotary_factor": 0.5, "frequency_fraction": 0.5}}),
]
IDS = [f"{p}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for p, o in BATCH_CASES]


def model_for(pe: str, overrides: dict):
    model = tiny(pe, **overrides)
    if pe in TRAINED_LIKE:
        randomize_tape(model, std=0.2)  # make TAPE's state updates, CoPE's table and PaTH's maps matter
    return model.eval()


def pad(prompts: list[torch.Tensor], right: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [1, n_i] -> input_ids [B, max n] padded on the left (or right) with PAD, and the 0/1 attention mask."""
    width = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        real = slice(0, p.shape[1]) if right else slice(width - p.shape[1], width)
        ids[i, real], mask[i, real] = p[0], 1
    return ids, mask


def prompts_with_digits() -> list[torch.Tensor]:
    rows = [tokens(1, n, seed=10 + n) for n in (3, 7, 5)]
    rows[1][0, 1:4] = torch.tensor([4, 5, 6])  # a digit run (Abacus)
    return rows


@pytest.mark.parametrize("pe,overrides", BATCH_CASES, ids=IDS)
def test_left_padded_batch_generates_what_each_prompt_generates_alone(pe, overrides):
    model = model_for(pe, overrides)
    prompts = prompts_with_digits()
    ids, mask = pad(prompts)
    new = 6
    alone = [model.generate(p, new) for p in prompts]
    variants = {"cached": model.generate(ids, new, attention_mask=mask),
                "chunked prefill": model.generate(ids, new, attention_mask=mask, prefill_chunk=2),
                "uncached": model.generate(ids, new, attention_mask=mask, use_cache=False)}
    for name, out in variants.items():
        assert out.shape == (3, ids.shape[1] + new)
        assert torch.equal(out[:, :ids.shape[1]], ids), name  # the input comes back as given, padding included
        for i, p in enumerate(prompts):
            assert torch.equal(out[i, ids.shape[1] - p.shape[1]:], alone[i][0]), (name, i)
    # Scoring a padded batch (no generation), padded on either side: every real token's logits are its own.
    left_ids, left_mask = pad(alone)
    right_ids, right_mask = pad(alone, right=True)
    with torch.no_grad():
        left, right = model(left_ids, attention_mask=left_mask), model(right_ids, attention_mask=right_mask)
        assert torch.isfinite(left).all() and torch.isfinite(right).all()  # padded positions too
        for i, row in enumerate(alone):
            own, n = model(row)[0], row.shape[1]
            assert torch.allclose(left[i, left_ids.shape[1] - n:], own, atol=1e-5), i
            assert torch.allclose(right[i, :n], own, atol=1e-5), i


def test_start_pos_counts_from_the_first_real_token():
    # Absolute positions change the output of FIRE (its normaliser) and of dynamic NTK (its length).
    fire = model_for("fire", {"pe_args": {"threshold": 4.0}})
    rope = model_for("rope", {"pe_args": {"scaling": "dynamic", "factor": 2.0}, "max_seq_len": 8})
    prompt = tokens(1, 5)
    ids, mask = pad([prompt, tokens(1, 2)])
    for m in (fire, rope):
        out = m.generate(ids, 4, attention_mask=mask, start_pos=3)
        assert torch.equal(out[0, ids.shape[1] - 5:], m.generate(prompt, 4, start_pos=3)[0])


def test_bad_attention_masks_are_refused():
    model = model_for("rope", {})
    ids = tokens(2, 4)
    with pytest.raises(ValueError, match="left padding"):
        model.generate(ids, 2, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="0 .padding. or 1"):
        model.generate(ids, 2, attention_mask=torch.full((2, 4), 2))
    with pytest.raises(ValueError, match="shape"):
        model.generate(ids, 2, attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="prefill_chunk"):
        model.generate(ids, 2, use_cache=False, prefill_chunk=2)


def test_dynamic_ntk_cache_is_recomputed_or_refused():
    """Past the original context every key's rotation changes: cached decoding must still equal recomputation."""
    model = model_for("rope", {"max_seq_len": 8, "pe_args": {"scaling": "dynamic", "factor": 4.0}})
    prompt = tokens(2, 6, seed=2)
    cached, uncached = model.generate(prompt, 8), model.generate(prompt, 8, use_cache=False)
    assert torch.equal(cached, uncached)
    cache = KVCache(model.config.n_layers)
    with torch.no_grad():
        step = model(cached[:, :8], cache=cache)  # 8 tokens: still inside the original context
        assert torch.allclose(step, model(cached[:, :8]), atol=1e-5)
        with pytest.raises(ValueError, match="KV cache: the positional encoding changed"):
            model(cached[:, 8:9], start_pos=8, cache=cache)


def test_cache_buffers_are_allocated_once():
    model = model_for("tape", {})
    prompt = tokens(2, 5)
    cache = KVCache(model.config.n_layers, capacity=9)
    with torch.no_grad():
        model(prompt, cache=cache)
        buffers = {name: t.data_ptr() for name, t in cache.layers[0].buffers.items()}
        assert set(buffers) == {"k", "v"} and cache.layers[0].buffers["k"].shape[2] == 9
        for t in range(5, 9):
            model(tokens(2, 1, seed=t), start_pos=t, cache=cache)
    assert {name: t.data_ptr() for name, t in cache.layers[0].buffers.items()} == buffers  # written in place
    assert len(cache) == 9
    with torch.no_grad():  # past the capacity it grows (doubling) and keeps the past
        model(tokens(2, 1, seed=9), start_pos=9, cache=cache)
    assert cache.layers[0].buffers["k"].shape[2] == 18 and len(cache) == 10


def largest_tensor(fn) -> int:
    """The largest number of elements of any tensor an aten op produced while running fn()."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    with Largest():
        fn()
    return Largest.numel


BIAS_PES = ("alibi", "fire", "t5")


@pytest.mark.parametrize("pe", PE_NAMES)
def test_chunked_prefill_memory_is_linear_in_the_context(pe, monkeypatch):
    """Doubling a padded prompt doubles the largest tensor of a chunked prefill + decoding, for every PE. Without
    chunks only SDPA-fused PEs and those computing attention themselves one chunk of queries at a time stay linear
    (their chunk budget shrunk so that these lengths take several chunks): a bias PE materialises its [H, T, T]
    bias (4x for 2x the tokens)."""
    from tapecli.model.attention import recompute

    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 1 << 14)
    model = model_for(pe, {"max_seq_len": 512, "dim": 16, "n_heads": 2, "n_layers": 1})

    def peak(T: int, chunk: int | None) -> int:
        ids = torch.randint(1, VOCAB, (1, T), generator=torch.Generator().manual_seed(0))
        mask = torch.ones(1, T, dtype=torch.long)
        mask[0, :3] = 0
        return largest_tensor(lambda: model.generate(ids, 2, attention_mask=mask if chunk else None,
                                                     prefill_chunk=chunk))

    assert peak(512, 16) <= 2.2 * peak(256, 16)
    ratio = peak(512, None) / peak(256, None)
    assert ratio >= 3.9 if pe in BIAS_PES else ratio <= 2.2


def test_bench_decode_reports_ratios_to_rope(tmp_path):
    import json

    from typer.testing import CliRunner

    from tapecli.cli import app

    out = tmp_path / "decode.json"
    result = CliRunner().invoke(app, ["bench", "--decode", "--pe", "rope,alibi,tape", "--no-tape-paths",
                                      "--n-layers", "2", "--dim", "32", "--prompt-len", "24", "--new-tokens", "3",
                                      "--uncached-tokens", "2", "--prefill-chunk", "8", "--rounds", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["token_ratio_to_rope"]) == {"rope", "alibi", "tape", "tape (no cache)"}
    assert data["token_ratio_to_rope"]["rope"] == 1.0 and data["prefill_ratio_to_rope"]["rope"] == 1.0
    assert set(data["median_prefill_s"]) == {"rope", "alibi", "tape"}
    assert data["tape_cache_speedup"] > 0 and data["settings"]["prompt_len"] == 24
    assert "ms / token" in result.output
