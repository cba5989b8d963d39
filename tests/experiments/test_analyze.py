"""`tape analyze`: every statistic and picture equals a direct computation from the materialised attention (or the
PE's definition) on short inputs, position-loss equals a naive per-token loop, the long path keeps linear memory,
files are written atomically, bad input is one line.

The materialised weights come from the probe's chunks assembled into [T, T] (tests/model/test_probe.py checks them
against the naive fp64 weights of every PE and path); the statistics are then recomputed from them with plain
formulas, one query at a time where that is clearer, and compared with what the streamed accumulators gave.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics

import numpy as np
import pytest
import torch
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.synthetic import SyntheticDataset
from tapecli.data.tokenizer import ByteTokenizer
from tapecli.eval.perplexity import load_stream
from tapecli.eval.protocol import run
from tapecli.experiments.analyze import position_loss
from tapecli.experiments.analyze.attention import record
from tapecli.experiments.analyze.pictures import PICTURES, finish
from tapecli.experiments.analyze.position_loss import PositionLoss, log_bins
from tapecli.experiments.analyze.sequences import DataSource, stretched
from tapecli.experiments.analyze.stats import finish as finish_stats
from tapecli.experiments.analyze.stats import merge
from tapecli.model import ModelConfig, Transformer, attention
from tapecli.model.attention import probe, recompute
from tapecli.store.checkpoint import save_model
from tapecli.store.door import open_model

pytestmark = pytest.mark.usefixtures("one_thread")
runner = CliRunner()
VOCAB = 259
TOL = 1e-9


def tiny(pe: str, seed: int = 0, **overrides) -> Transformer:
    """A tiny fp64 model whose PE parameters are random (TAPE's, CoPE's and PaTH's zero starts would hide them)."""
    torch.manual_seed(seed)
    config = dict(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, pe=pe)
    model = Transformer(ModelConfig(**{**config, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".pe." in name:
                p.normal_(0, 0.5)
    return model.double().eval()


def sequences(count: int, T: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (T,), generator=gen) for _ in range(count)]


@contextlib.contextmanager
def materialised(model: Transformer, T: int):
    """The weights [L, H, T, T] of a probed forward of one sequence, assembled from the chunks."""
    maps = torch.zeros(len(model.model.layers), model.config.n_heads, T, T, dtype=torch.float64)
    layer = [0]

    def observe(chunk):
        C, K = chunk.weights.shape[-2:]
        maps[layer[0], :, chunk.first : chunk.first + C, :K] = chunk.weights[0]

    handles = [block.register_forward_pre_hook(lambda m, a, k=k: layer.__setitem__(0, k))
               for k, block in enumerate(model.model.layers)]
    try:
        with probe.probing(observe):
            yield maps
    finally:
        for handle in handles:
            handle.remove()


def bit_length_bins(values: list[int]) -> list[int]:
    return [int(v).bit_length() for v in values]


def direct_statistics(P: torch.Tensor, sink: int, window: int) -> dict:
    """The statistics of stats.py from weights P [S, L, H, T, T], straight from their definitions."""
    S, L, H, T, _ = P.shape
    out = {k: torch.zeros(L, H, dtype=torch.float64) for k in ("mean_distance", "entropy", "sink_mass", "local_mass",
                                                               "entropy_slope")}
    bins = int(T - 1).bit_length() + 1
    histogram = torch.zeros(L, H, bins, dtype=torch.float64)
    lengths = int(T).bit_length()
    by_length = torch.zeros(L, H, lengths, dtype=torch.float64)
    per_length = torch.zeros(lengths, dtype=torch.float64)
    for layer in range(L):
        for head in range(H):
            entropies, xs = [], []
            for s in range(S):
                for i in range(T):
                    row = P[s, layer, head, i, : i + 1]  # the keys it sees
                    distance = torch.arange(i, -1, -1, dtype=torch.float64)
                    entropy = -float(torch.special.xlogy(row, row).sum())
                    entropies.append(entropy)
                    xs.append(math.log(i + 1))
                    out["mean_distance"][layer, head] += float((row * distance).sum())
                    out["entropy"][layer, head] += entropy
                    histogram[layer, head].index_add_(0, torch.tensor(bit_length_bins(range(i, -1, -1))), row)
                    by_length[layer, head, (i + 1).bit_length() - 1] += entropy
                    if layer == head == 0:
                        per_length[(i + 1).bit_length() - 1] += 1
                    if i >= sink:
                        out["sink_mass"][layer, head] += float(row[:sink].sum())
                    if i >= window:
                        out["local_mass"][layer, head] += float(row[i - window + 1 :].sum())
            out["entropy_slope"][layer, head] = float(np.polyfit(xs, entropies, 1)[0])
    queries = S * T
    for key in ("mean_distance", "entropy"):
        out[key] /= queries
    out["sink_mass"] /= S * (T - sink)
    out["local_mass"] /= S * (T - window)
    out["distance_histogram"] = histogram / queries
    out["entropy_by_length"] = by_length / per_length
    return out


CASES = [("rope", None), ("alibi", None), ("fire", None), ("tape", None), ("cope", None), ("cope", "dense"),
         ("path", None)]


@pytest.mark.parametrize("pe,path", CASES)
def test_each_statistic_equals_a_direct_computation(monkeypatch, pe, path):
    """Streamed over chunks of 5 queries (the probe path, CoPE's chunked path and PaTH's chunks; CoPE's reference
    path under forced("dense") in one chunk), two sequences, sink 2, window 5."""
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 4 * 24 * 5)
    overrides = {"pe_args": {"chunk_size": 5}} if pe == "path" else {}
    model = tiny(pe, **overrides)
    T, sink, window = 24, 2, 5
    rows, maps = [], []
    for ids in sequences(2, T):
        with attention.forced(path) if path else contextlib.nullcontext(), materialised(model, T) as weights:
            rows.append(record(model, ids, T, sink, window, maps=False))
        maps.append(weights)
    got = finish_stats(merge([row["stats"] for row in rows]))
    want = direct_statistics(torch.stack(maps), sink, window)
    for key, values in want.items():
        assert (torch.tensor(got[key], dtype=torch.float64) - values).abs().max() <= TOL, key
    assert got["queries"] == [2.0 * T] * 2


def test_maps_are_the_first_sequences_weights(monkeypatch):
    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 4 * 12 * 5)
    model = tiny("alibi")
    ids = sequences(1, 12)[0]
    with materialised(model, 12) as weights:
        row = record(model, ids, 12, 1, 4, maps=True)
    assert (torch.tensor(row["maps"]) - weights).abs().max() <= 5e-5  # rounded to 4 decimals
    assert "maps" not in record(model, ids, 12, 1, 4, maps=False)


def binned_means(values: dict[int, list[float]], bins: int) -> list[float | None]:
    return [sum(values[b]) / len(values[b]) if values.get(b) else None for b in range(bins)]


def capture_inputs(model: Transformer) -> tuple[list, list]:
    """Forward pre-hooks on every layer's attention: (the attention module, a copy of its normalised input x that
    autograd may use, its LayerPE)."""
    seen = []

    def hook(module, args):
        with torch.inference_mode(False):
            seen.append((module, args[0].clone(), args[1]))

    handles = [block.self_attn.register_forward_pre_hook(hook) for block in model.model.layers]
    return seen, handles


def assert_curves(got: list, want: list) -> None:
    for layer_got, layer_want in zip(got, want, strict=True):
        for head_got, head_want in zip(layer_got, layer_want, strict=True):
            for g, w in zip(head_got, head_want, strict=True):
                assert (g is None and w is None) or abs(g - w) <= TOL, (head_got, head_want)


@torch.no_grad()
def test_cope_picture_is_the_mean_contextual_position_per_distance():
    model = tiny("cope", pe_args={"npos_max": 6})
    T = 12
    ids = sequences(1, T)[0]
    seen, handles = capture_inputs(model)
    row = record(model, ids, T, 1, 4, maps=False)
    for handle in handles:
        handle.remove()
    picture = finish(PICTURES["cope"], model, [row["picture"]])
    d = model.config.head_dim
    positions, absolute = [], []
    for attn, x, _ in seen:
        q = attn.q_proj(x).view(1, T, 4, d).transpose(1, 2)[0]
        k = attn.k_proj(x).view(1, T, 2, d).transpose(1, 2)[0].repeat_interleave(2, 0)
        per_head, reference = [], {}
        for h in range(4):
            sums: dict[int, list[float]] = {}
            for i in range(T):
                for j in range(i + 1):
                    gates = [torch.sigmoid(q[h, i] @ k[h, t] / math.sqrt(d)) for t in range(j, i + 1)]
                    b = (i - j).bit_length()
                    sums.setdefault(b, []).append(min(float(sum(gates)), 6.0))
                    if h == 0:
                        reference.setdefault(b, []).append(i - j + 1.0)
            per_head.append(binned_means(sums, 5))  # distances 0..11: bins 0, 1, 2-3, 4-7, 8-11
        positions.append(per_head)
        absolute.append([binned_means(reference, 5)] * 4)
    assert_curves(picture["curves"]["position"]["values"], positions)
    assert_curves(picture["curves"]["absolute"]["values"], absolute)


@torch.no_grad()
def test_tape_picture_is_the_state_against_ropes_per_position():
    model = tiny("tape", n_layers=3)
    T = 12
    states = []
    handles = [model.model.layers[0].register_forward_pre_hook(lambda m, a: states.append(a[1].rotary))]
    handles += [block.register_forward_hook(lambda m, a, out: states.append(out[1].rotary))
                for block in model.model.layers[:2]]
    row = record(model, sequences(1, T)[0], T, 1, 4, maps=False)
    for handle in handles:
        handle.remove()
    picture = finish(PICTURES["tape"], model, [row["picture"]])
    assert picture["layers"] == ["after layer 0", "after layer 1"]  # the last layer updates nothing
    start = torch.complex(*states[0].chunk(2, -1))
    for row_index, state in enumerate(states[1:]):
        z = torch.complex(*state.chunk(2, -1)) / start  # [1, H, T, d/2]: each pair against RoPE's
        for name, values in (("norm_ratio", z.abs()), ("angle_drift", z.angle().abs())):
            want = []
            for h in range(4):
                sums: dict[int, list[float]] = {}
                for position in range(T):
                    sums.setdefault((position + 1).bit_length() - 1, []).append(float(values[0, h, position].mean()))
                want.append(binned_means(sums, 4))
            assert_curves([picture["curves"][name]["values"][row_index]], [want])


@torch.no_grad()
def test_path_picture_carries_keys_through_the_householder_products():
    model = tiny("path")
    T = 10
    seen, handles = capture_inputs(model)
    row = record(model, sequences(1, T)[0], T, 1, 4, maps=False)
    for handle in handles:
        handle.remove()
    picture = finish(PICTURES["path"], model, [row["picture"]])
    d = model.config.head_dim
    for layer, (attn, x, pe) in enumerate(seen):
        keys = attn.k_proj(x).view(T, 2, d).double()
        u, beta = pe.householder(x, None, None)
        w = u / (u.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
        sources = sorted(set(np.linspace(0, T // 2 - 1, 8).astype(int).tolist()))
        for name in ("displacement", "norm_ratio"):
            want = []
            for g in range(2):
                sums: dict[int, list[float]] = {}
                for j in sources:
                    product = torch.eye(d, dtype=torch.float64)
                    for i in range(j + 1, T):
                        product = (torch.eye(d, dtype=torch.float64) - beta[0, g, i] * torch.outer(
                            w[0, g, i], w[0, g, i])) @ product
                        key = keys[j, g]
                        moved = product @ key
                        value = (moved - key).norm() if name == "displacement" else moved.norm()
                        sums.setdefault((i - j).bit_length(), []).append(float(value / key.norm()))
                want.append(binned_means(sums, 5))  # distances 1..9: bins 1, 2-3, 4-7, 8-9 (0 stays empty)
            assert_curves([picture["curves"][name]["values"][layer]], [want])


# ---------------------------------------------------------------------------------------------------------------
# position-loss


@pytest.fixture
def text_models(tmp_path):
    paths = []
    for pe in ("rope", "alibi"):
        model = tiny(pe, seed=1).float()
        paths.append(str(save_model(model, ByteTokenizer(), tmp_path / pe)))
    text = tmp_path / "book.txt"
    text.write_text(" ".join(f"word{i % 37} and number {i}." for i in range(80)))
    return paths, text


def test_position_loss_equals_a_naive_loop(monkeypatch, tmp_path, text_models):
    """Text: every position's loss from full logits in one piece (logits formed 16 positions at a time by the
    command), per-sequence bin means, their mean and 95% band over sequences; the ranges likewise."""
    monkeypatch.setattr(position_loss, "LOGIT_ROWS", 16)
    models, text = text_models
    T, samples = 40, 3
    evaluation = PositionLoss(DataSource(str(text), T, samples), bins_per_octave=2)
    results = run(evaluation, models, tmp_path / "out", device="cpu", show_progress=False).results["position-loss"]
    edges = [*log_bins(T, 2), T + 1]
    assert edges[:6] == [1, 2, 4, 5, 8, 11]
    for spec, entry in zip(models, results["models"], strict=True):
        opened = open_model(spec, device="cpu")
        tokens = load_stream(str(text), opened.tokenizer)
        per_sequence = []
        for s in range(samples):
            window = torch.tensor(np.asarray(tokens[s * (T + 1) : (s + 1) * (T + 1)], dtype=np.int64))
            with torch.no_grad():
                logits = opened.model(window[None, :-1])[0]
            per_sequence.append(torch.nn.functional.cross_entropy(logits, window[1:], reduction="none"))
        assert entry["training_length"] == 64  # no run recipe: the model's max_seq_len
        for k, (a, b) in enumerate(zip(edges, edges[1:], strict=False)):
            means = [float(loss[a - 1 : b - 1].mean()) for loss in per_sequence]
            got = entry["bins"][k]
            assert (got["first"], got["last"]) == (a, b - 1)
            assert got["loss"] == pytest.approx(statistics.mean(means), abs=1e-5)
            half = 1.96 * statistics.stdev(means) / math.sqrt(samples)
            assert got["loss_band"] == pytest.approx([statistics.mean(means) - half, statistics.mean(means) + half],
                                                     abs=1e-5)
        assert [r["label"] for r in entry["ranges"]] == ["<= L"]
        assert entry["ranges"][0]["loss"] == pytest.approx(statistics.mean(float(x.mean()) for x in per_sequence),
                                                           abs=1e-5)
    assert (tmp_path / "out" / "position-loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.fixture(scope="module")
def synthetic_runs(tmp_path_factory):
    """Selective-copy runs (ALiBi, CoPE, TAPE) and a grid-1d run (ALiBi), 2 steps each."""
    root = tmp_path_factory.mktemp("runs")
    for name, recipe, pe in (("copy", "selective-copy-smoke", "alibi"), ("cope", "selective-copy-smoke", "cope"),
                             ("tape", "selective-copy-smoke", "tape"), ("grid", "grid-1d-smoke", "alibi")):
        result = runner.invoke(app, ["pretrain", "--recipe", recipe, "--out", str(root / name), f"model.pe={pe}",
                                     "train.max_steps=2"])
        assert result.exit_code == 0, result.output
    return root


def test_synthetic_position_loss_and_accuracy_through_the_cli(tmp_path, synthetic_runs, monkeypatch):
    """Selective copy stretched to 30 tokens: loss and accuracy on the copied symbols only; the training length is
    the run's data.seq_len; results.json and every PNG are renamed into place (written atomically)."""
    import os

    from tapecli.eval.synthetic import synthetic_recipe

    renamed = []
    real_replace = os.replace
    monkeypatch.setattr("tapecli.files.os.replace", lambda a, b: (renamed.append(str(b)), real_replace(a, b))[1])
    run_dir, out = synthetic_runs / "copy", tmp_path / "loss"
    result = runner.invoke(app, ["analyze", "position-loss", "--model", str(run_dir), "--data", "selective-copy",
                                 "--seq-len", "30", "--samples", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "<= L" in result.output and "position-loss.png" in result.output
    entry = json.loads((out / "results.json").read_text())["models"][0]
    assert entry["training_length"] == 13 and [r["label"] for r in entry["ranges"]] == ["<= L", "L-2L", "2L-4L"]
    opened = open_model(str(run_dir), device="cpu")
    spec = stretched("selective-copy", synthetic_recipe(opened).data, 30)
    assert (spec.n_tokens, spec.blanks) == (9, 11)  # 4 of 13 tokens are symbols in training: round(4 x 30 / 13)
    data = SyntheticDataset("selective-copy", spec, 1234, "analyze-30", 3, 30)
    losses, hits = [], []
    for i in range(3):
        ids, labels = data[i]
        with torch.no_grad():
            logits = opened.model(ids[None])[0]
        scored = labels != -100
        losses.append(torch.nn.functional.cross_entropy(logits[scored], labels[scored], reduction="none"))
        hits.append((logits[scored].argmax(-1) == labels[scored]).double())
        assert int(scored.sum()) == 9 and bool(scored[-9:].all())  # the copied symbols
    last = entry["ranges"][-1]  # positions 27..30 hold copied symbols 6..9 of each sequence
    assert last["loss"] == pytest.approx(statistics.mean(float(x[-4:].mean()) for x in losses), abs=1e-5)
    assert last["accuracy"] == pytest.approx(statistics.mean(float(x[-4:].mean()) for x in hits), abs=1e-9)
    assert entry["ranges"][0]["loss"] is None  # no copied symbol in the first 13 positions
    assert {str(out / f) for f in ("results.json", "position-loss.png", "settings.json")} <= set(renamed)
    assert not list(out.glob(".*tmp*"))
    # A second run resumes: nothing to redo, the same numbers.
    again = runner.invoke(app, ["analyze", "position-loss", "--model", str(run_dir), "--data", "selective-copy",
                                "--seq-len", "30", "--samples", "3", "--out", str(out)])
    assert again.exit_code == 0 and json.loads((out / "results.json").read_text())["models"][0]["bins"] == \
        entry["bins"]


def test_attention_command_compares_models_and_draws_every_picture(tmp_path, synthetic_runs, monkeypatch):
    """CoPE and TAPE side by side: the table, results.json and every PNG, each renamed into place (atomic)."""
    renamed = []
    real_replace = __import__("os").replace
    monkeypatch.setattr("tapecli.files.os.replace", lambda a, b: (renamed.append(b.name), real_replace(a, b))[1])
    out = tmp_path / "attention"
    result = runner.invoke(app, ["analyze", "attention", "-m", str(synthetic_runs / "cope"), "-m",
                                 str(synthetic_runs / "tape"), "--data", "selective-copy", "--seq-len", "20",
                                 "--samples", "1", "--sink", "2", "--window", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    pngs = ["heatmaps.png", "distance.png", "entropy.png", "maps-cope.png", "maps-tape.png", "pe-cope.png",
            "pe-tape.png"]
    for png in pngs:
        assert (out / png).read_bytes()[:4] == b"\x89PNG" and png in renamed
    results = json.loads((out / "results.json").read_text())
    assert [m["name"] for m in results["models"]] == ["cope", "tape"] and "results.json" in renamed
    assert [m["picture"]["pe"] for m in results["models"]] == ["cope", "tape"]
    assert results["models"][0]["distance_bins"] == ["0", "1", "2-3", "4-7", "8-15", "16-19"]
    assert "first 2" in result.output and "within 4" in result.output  # the table's columns


@pytest.mark.parametrize("args,fragments", [
    (["--seq-len", "1"], ("--seq-len must be at least 2",)),
    (["--samples", "0"], ("'--samples'", "greater than or equal to 1")),
    (["--data", "grid-1d"], ("trained on selective-copy, not on --data grid-1d",)),
    (["--data", "missing.txt"], ("missing.txt",)),
    (["--sink", "20"], ("--sink must be between 1 and --seq-len - 1",)),
    (["--window", "0"], ("'--window'", "greater than or equal to 1")),
    (["--maps-max", "-1"], ("--maps-max",)),
])
def test_bad_input_is_one_line(tmp_path, synthetic_runs, args, fragments):
    base = {"--data": "selective-copy", "--seq-len": "20"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    command = ["analyze", "attention", "--model", str(synthetic_runs / "copy"), "--out", str(tmp_path / "out")]
    result = runner.invoke(app, [*command, *(x for pair in base.items() for x in pair)])
    one_line_error(result, 2, *fragments)
    assert not (tmp_path / "out").exists()


def test_text_models_need_a_synthetic_run_for_a_synthetic_task(tmp_path, text_models):
    models, _ = text_models
    result = runner.invoke(app, ["analyze", "position-loss", "--model", models[0], "--data", "selective-copy",
                                 "--seq-len", "20", "--out", str(tmp_path / "out")])
    one_line_error(result, 2, "not from a run trained on a synthetic task")


def test_long_sequences_keep_linear_memory(monkeypatch):
    """The whole analysis of one 512-token sequence (probe or CoPE's own path, statistics, CoPE's picture) with
    chunks of 64 queries: no allocation reaches one head's [T, T] map in fp32 (the CPU profiler sees every
    allocation), so nothing [T, T] is ever formed. About 5 s: the profiler records every allocation of both
    analyses."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.setattr(recompute, "SCORE_ELEMENTS", 1 << 16)
    T = 512
    for pe in ("alibi", "cope"):
        model = tiny(pe, n_heads=2, n_kv_heads=2).float()
        ids = torch.randint(0, VOCAB, (T,), generator=torch.Generator().manual_seed(0))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            row = record(model, ids, T, 1, 16, maps=False)
        assert 0 < max(event.cpu_memory_usage for event in prof.events()) < T * T * 4
        assert finish_stats(merge([row["stats"]]))["queries"] == [float(T)] * 2
