"""Limits every command checks before any work: what `tape analyze attention` can probe (windowed layers are
probed, a PE that computes its own attention without reporting its weights is refused), PE arguments out of range
(RoPE's theta from --pe-arg or a Hugging Face config.json, factors, scales, llama4's attn_scale), evaluations whose
score is not finite, and long-context prompts that cannot fit the model or the machine.

Each refusal: exit code != 0, exactly one `error:` line naming the input and the fix, no traceback, and nothing
written (the --out folder does not appear). Models: the shared tiny runs (`trained()`: 2 layers, dim 32, byte
tokenizer, 32 tokens), the shipped hybrid smoke recipes (rnope-swa-smoke, irope-smoke: 4 layers, 3 of them
windowed to 8 keys) and a tiny Mistral saved by transformers (every layer windowed to 8 keys).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")
TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs(trained, shared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from hf_helpers import make_hf_model

    mistral = tmp_path_factory.mktemp("mistral") / "hf"
    make_hf_model(mistral, "MistralForCausalLM", sliding_window=8)
    return {"rope": trained(), "fox": trained("tiny", "model.pe=fox"),
            "stickbreaking": trained("tiny", "model.pe=stickbreaking"),
            "swa": trained("rnope-swa-smoke", f"data.source={shared_corpus}", "train.max_steps=2"),
            "irope": trained("irope-smoke", f"data.source={shared_corpus}", "train.max_steps=2"),
            "mistral": mistral, "corpus": shared_corpus}


def attention(runs: dict[str, Path], out: Path, *models: str, seq_len: int = 24) -> list[str]:
    return ["analyze", "attention", *[a for m in models for a in ("-m", str(runs.get(m, m)))], "--data",
            str(runs["corpus"]), "--seq-len", str(seq_len), "--samples", "1", "--device", "cpu", "--out", str(out)]


# 1. tape analyze attention ----------------------------------------------------------------------------------------
def test_windowed_hybrids_and_an_imported_mistral_are_probed(runs: dict[str, Path], tmp_path: Path) -> None:
    """rnope-swa and irope (3 local layers of 8 keys, a global NoPE layer) and Mistral (every layer 8 keys): every
    layer is probed; a windowed layer puts no attention 8 or more tokens back (distance bins 8-15 and 16-31), the
    global layer does."""
    out = tmp_path / "out"
    result = runner.invoke(app, attention(runs, out, "swa", "irope", "mistral", seq_len=32))
    assert result.exit_code == 0, result.output
    models = json.loads((out / "results.json").read_text())["models"]
    assert len(models) == 3
    for model in models:
        histogram = model["stats"]["distance_histogram"]  # [layer][head][bin]: 0, 1, 2-3, 4-7, 8-15, 16-31
        local = histogram if "mistral" in model["source"] or model["source"].endswith("/hf") else histogram[:3]
        assert all(sum(head[4:]) == 0 for layer in local for head in layer), model["name"]
        assert all(abs(sum(head) - 1) < 1e-6 for layer in histogram for head in layer)
    for model in models[:2]:
        assert sum(head[4] + head[5] for head in model["stats"]["distance_histogram"][3]) > 0  # the global layer


def test_fox_is_probed(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = runner.invoke(app, attention(runs, out, "fox"))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "results.json").read_text())["models"][0]["stats"]["entropy"]


def test_a_pe_that_reports_no_weights_is_refused_before_any_work(runs: dict[str, Path], tmp_path: Path) -> None:
    """Stick-breaking computes its own weights and does not report them: refused in one line naming the model and
    the layer, before the rope model before it is probed (no output folder)."""
    out = tmp_path / "out"
    line = one_line_error(runner.invoke(app, attention(runs, out, "rope", "stickbreaking")), 2,
                          f"--model {runs['stickbreaking']}: layer 0's PE 'stickbreaking' computes its own attention",
                          "tape analyze position-loss")
    assert "reports_weights=True" in line
    assert not out.exists()


def test_a_plugin_with_its_own_unreported_attention_is_refused_before_any_work(tmp_path: Path) -> None:
    """A plugin PE (tests/pe/broken_pes.py: OwnAttention without reports_weights), given as a model in memory:
    refused by the check every model gets before the first is opened."""
    from tapecli import trust
    from tapecli.data.tokenizer import ByteTokenizer
    from tapecli.errors import TapeError
    from tapecli.eval.protocol import as_opened, run
    from tapecli.experiments.analyze.attention import AttentionAnalysis
    from tapecli.experiments.analyze.sequences import DataSource
    from tapecli.model import ModelConfig, Transformer

    plugin = tmp_path / "own.py"
    shutil.copy(TESTS / "pe" / "broken_pes.py", plugin)
    trust.allow(str(plugin))
    model = Transformer(ModelConfig(vocab_size=260, dim=32, n_layers=2, n_heads=2, max_seq_len=32,
                                    pe=f"{plugin}:ChunkedMask"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to read " * 50)
    analysis = AttentionAnalysis(source=DataSource(str(corpus), seq_len=16, samples=1), window=4)
    with pytest.raises(TapeError, match=r"--model own: layer 0's PE '.*own.py:ChunkedMask' computes its own "
                                        r"attention and does not report its weights"):
        run(analysis, [as_opened(model, ByteTokenizer(), name="own")], tmp_path / "out", show_progress=False)
    assert not (tmp_path / "out").exists()


def test_a_missing_second_model_is_refused_before_the_first_is_probed(runs: dict[str, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`runs/missing` (a mistyped run) looks like a hub id (owner/name): it is resolved (offline: refused) before the
    first model is opened."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    one_line_error(runner.invoke(app, attention(runs, out, "rope", "runs/missing")), 2,
                   "--model: runs/missing is no directory here, and as a hub id not in the local Hugging Face cache")
    assert not out.exists()


# 2. PE arguments out of range ---------------------------------------------------------------------------------------
PERPLEXITY = ["eval", "perplexity", "--seq-len", "16", "--max-windows", "1", "--device", "cpu"]
THETA = "must be a finite number > 1 (the base wavelength"
PE_ARGS = [
    (["theta=-1"], f"--pe-arg: theta: {THETA}: 10000 in Llama 2, 500000 in Llama 3), got -1.0"),
    (["theta=0"], f"--pe-arg: theta: {THETA}"),
    (["theta=nan"], "--pe-arg: theta: must be a finite number, got nan"),
    (["theta=inf"], "--pe-arg: theta: must be a finite number, got inf"),
    (["scaling=linear", "factor=0.5"], "--pe-arg: factor: must be >= 1 for scaling 'linear', got 0.5"),
    (["scaling=yarn", "factor=2", "beta_fast=-1"], "--pe-arg: beta_fast: must be a finite number > 0, got -1.0"),
    (["scaling=yarn", "factor=2", "attention_factor=0"], "--pe-arg: attention_factor: must be a finite number > 0"),
    (["scaling=llama3", "factor=8", "low_freq_factor=4", "high_freq_factor=1"],
     "--pe-arg: high_freq_factor: must be > low_freq_factor (4.0) for scaling 'llama3', got 1.0"),
    (["fope=true", "fope_sigma=-0.1"], "--pe-arg: fope_sigma: must be a finite number >= 0, got -0.1"),
]


@pytest.mark.parametrize(("pe_args", "fragment"), PE_ARGS, ids=[" ".join(a) for a, _ in PE_ARGS])
def test_pe_arguments_out_of_range_are_one_line(runs: dict[str, Path], tmp_path: Path, pe_args: list[str],
                                                fragment: str) -> None:
    out = tmp_path / "out"
    args = [*PERPLEXITY, "--model", str(runs["rope"]), "--data", str(runs["corpus"]), "--out", str(out)]
    one_line_error(runner.invoke(app, [*args, *[a for arg in pe_args for a in ("--pe-arg", arg)]]), 2, fragment)
    assert not out.exists()


RECIPE_VALUES = [
    ("model.pe_args.theta=-1", f"model.pe_args.theta: {THETA}"),
    ("model.pe=xpos model.pe_args.scale_base=0", "model.pe_args.scale_base: must be a finite number > 0, got 0.0"),
    ("model.pe=fire model.pe_args.init_c=-0.1", "model.pe_args.init_c: must be a finite number > 0 (c in log"),
    ("model.pe=fox model.pe_args.theta=0.5", "model.pe_args.theta: must be a finite number > 1 (the base wave"),
    ("model.length_scale=llama4 model.length_scale_args.attn_scale=-0.1",
     "model.length_scale_args.attn_scale: expected a number >= 0 (finite), got -0.1"),
    ("model.length_scale=llama4 model.length_scale_args.floor_scale=inf",
     "model.length_scale_args.floor_scale: expected a number > 0 (finite), got inf"),
]


@pytest.mark.parametrize(("overrides", "fragment"), RECIPE_VALUES, ids=[o for o, _ in RECIPE_VALUES])
def test_training_refuses_pe_arguments_out_of_range(trained, shared_corpus: Path, tmp_path: Path, overrides: str,
                                                    fragment: str) -> None:
    out = tmp_path / "out"
    args = ["pretrain", "--recipe", str(trained.recipe()), "--out", str(out), f"data.source={shared_corpus}"]
    one_line_error(runner.invoke(app, [*args, *overrides.split()]), 2, fragment)
    assert not out.exists()


@pytest.mark.parametrize(("arch", "value"), [("llama", -1), ("llama", 0), ("smollm3", -1)])
def test_a_hugging_face_rope_theta_out_of_range_is_one_line(tiny_hf_llama: Path, runs: dict[str, Path],
                                                            tmp_path: Path, arch: str, value: float) -> None:
    """rope_parameters.rope_theta of a config.json (a Llama; an imported SmolLM3, NoPE every 4th layer), named as
    config.json names it."""
    directory = tmp_path / "hf"
    if arch == "llama":
        shutil.copytree(tiny_hf_llama, directory)
    else:
        from hf_helpers import make_hf_model

        make_hf_model(directory, "SmolLM3ForCausalLM")
    config = json.loads((directory / "config.json").read_text())
    if "rope_parameters" in config:
        config["rope_parameters"]["rope_theta"] = value
    else:
        config["rope_theta"] = value
    (directory / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    args = [*PERPLEXITY, "--model", str(directory), "--data", str(runs["corpus"]), "--out", str(out)]
    one_line_error(runner.invoke(app, args), 2, f"{directory}/config.json: rope_parameters.rope_theta: {THETA}",
                   f"got {float(value)}")
    assert not out.exists()


# 3. non-finite scores -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nan_run(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny run whose final norm's weights are NaN (a damaged checkpoint): every logit is NaN."""
    from safetensors.torch import load_file, save_file

    run = trained.copy(tmp_path_factory.mktemp("nan") / "run")
    weights = run / "checkpoints" / "step-00000002" / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.norm.weight"].fill_(float("nan"))
    save_file(tensors, weights)
    return run


NAN_EVALS = [
    (["eval", "perplexity", "--seq-len", "16", "--data", "{corpus}"], "perplexity computed nll=nan on window (16, 0) "
     "(the first non-finite value; not written): the model computes NaN or infinity there"),
    (["analyze", "position-loss", "--seq-len", "16", "--data", "{corpus}", "--samples", "2"], "position-loss computed"),
    (["eval", "kv-retrieval", "--keys", "2", "--samples", "1"], "kv-retrieval: its logits are not finite (NaN or "
     "infinity) at generation step 0 (0: the prompt) on prompt (2, 0, 0) (nothing of it written)"),
    (["eval", "passkey", "--budgets", "64", "--trials", "1"], "passkey: its logits are not finite"),
]


@pytest.mark.parametrize(("args", "what"), NAN_EVALS, ids=[a[1] for a, _ in NAN_EVALS])
def test_a_non_finite_score_is_an_error_not_a_result(nan_run: Path, runs: dict[str, Path], tmp_path: Path,
                                                      args: list[str], what: str) -> None:
    """Perplexity and position-loss score the model's log-probabilities, the generating evaluations its greedy
    tokens: NaN is refused in one line naming the model, where it appeared and the first unit, and no results.json
    is written (a NaN row is never logged; greedy decoding would have turned NaN logits into a token, and the score
    into a meaningless 0)."""
    out = tmp_path / "out"
    command = [*[a.format(corpus=runs["corpus"]) for a in args], "--model", str(nan_run), "--device", "cpu",
               "--out", str(out)]
    line = one_line_error(runner.invoke(app, command), 2, f"--model {nan_run}: {what}", "check its weights and its "
                          "PE (`tape pe check`, a --pe-arg), or evaluate an earlier checkpoint")
    assert "Traceback" not in line
    assert not (out / "results.json").exists()
    if (out / "samples.jsonl").exists():
        assert "NaN" not in (out / "samples.jsonl").read_text()


# 4. long-context prompts that cannot fit ----------------------------------------------------------------------------
LONG = [
    (["eval", "kv-retrieval", "--keys", "100000", "--samples", "1"], "--keys 100000 makes prompts of about 8,100,257 "
     "tokens", "lower --keys"),
    (["eval", "latent-list", "--lengths", "1000000", "--samples", "1"], "--lengths 1000000 makes prompts of about "
     "1,000,256 tokens", "lower --lengths"),
    (["eval", "babilong", "--lengths", "1000000", "--samples", "1", "--tasks", "qa1"], "--lengths 1000000 makes "
     "prompts of about 1,000,015 tokens", "lower --lengths"),
    (["eval", "ruler", "--lengths", "1000000", "--samples", "1", "--tasks", "niah_single_1"], "--lengths 1000000 "
     "makes prompts of about 1,000,000 tokens", "lower --lengths"),
    (["eval", "passkey", "--max-tokens", "1000000", "--trials", "1"], "--max-tokens 1000000 makes prompts of about "
     "1,000,000 tokens", "lower --max-tokens"),
    (["eval", "kv-retrieval", "--keys", "1000", "--samples", "1", "--batch-size", "64"], "--keys 1000 makes prompts "
     "of about 81,257 tokens x 64 prompts at a time", "lower --keys or --batch-size"),
]


@pytest.mark.parametrize(("args", "numbers", "fix"), LONG, ids=[" ".join(a[1:4]) for a, _, _ in LONG])
def test_a_prompt_that_cannot_fit_is_refused_before_it_is_built(runs: dict[str, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, args: list[str],
                                                                 numbers: str, fix: str) -> None:
    """With 1 GiB free (the check's reading of the machine, replaced), every long-context evaluation refuses its
    longest prompt in one line with the estimate (tokens from the byte tokenizer; memory at dim 32, 2 layers) before
    any prompt is built or model opened. The numbers of the tiny run: kv-retrieval's 81 tokens per pair, the
    activations' 8 x 32 + 4 x 128 values per token."""
    from tapecli.eval import budget

    monkeypatch.setattr(budget, "available", lambda device: (1 << 30, "available on this machine"))
    monkeypatch.setattr("tapecli.eval.protocol.open_model", lambda *a, **k: pytest.fail("a model was opened"))
    out = tmp_path / "out"
    line = one_line_error(runner.invoke(app, [*args, "--model", str(runs["rope"]), "--device", "cpu", "--out",
                                              str(out)]), 2, f"--model {runs['rope']}: {numbers}",
                          "at this model's width (dim 32, 2 layers; weights ", "and 1.0 GiB is available on this "
                          "machine; " + fix)
    assert "activations" in line and "kv cache" in line
    assert not out.exists()


def test_a_prompt_no_machine_holds_is_refused_in_a_real_process(runs: dict[str, Path], tmp_path: Path) -> None:
    """Ten million pairs (about 810 million tokens): refused on any machine, from the real memory reading."""
    import subprocess
    import sys

    from train_helpers import subprocess_env

    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "tapecli", "eval", "kv-retrieval", "--keys", "10000000",
                             "--model", str(runs["rope"]), "--device", "cpu", "--out", str(out)],
                            capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--keys 10000000 makes prompts of about 810,0" in lines[0], result.stderr
    assert not out.exists()
