"""Every shipped smoke recipe runs end to end through the real CLI (the full-size ones are validated in
test_recipes.py; they need GPUs)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scrolls_helpers import write_scrolls_zip
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.recipe import list_recipes

runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def last_loss(run: Path) -> float:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r][-1]


def test_every_smoke_recipe_is_exercised_here():
    smoke = {name for name, _ in list_recipes() if name.endswith("-smoke")}
    assert smoke == {"arithmetic-smoke", "c4-smoke", "scrolls-smoke", "context-extension-smoke", "drope-smoke",
                     "irope-smoke", "rnope-swa-smoke",
                     # run through the CLI in test_synthetic.py
                     "selective-copy-smoke", "grid-1d-smoke", "grid-2d-smoke", "flip-flop-smoke", "counting-smoke"}


def test_c4_then_scrolls_smoke(tmp_path: Path, tiny_corpus: Path):
    c4 = tmp_path / "c4"
    invoke("pretrain", "--recipe", "c4-smoke", "--out", str(c4), f"data.source={tiny_corpus}", "model.pe=rope")
    assert (c4 / "checkpoints").is_dir() and last_loss(c4) < 6.0  # below uniform over 259 bytes (5.56 + margin)

    scrolls = write_scrolls_zip(tmp_path / "scrolls")  # qasper.zip in the tau/scrolls layout
    ft = tmp_path / "ft"
    out = invoke("finetune", "--recipe", "scrolls-smoke", "--checkpoint", str(c4), "--out", str(ft),
                 f"data.source={scrolls}", "data.task=qasper")
    assert "trainable" in out and (ft / "checkpoints").is_dir()
    # The SCROLLS recipes leave the model to the checkpoint: each PE's C4 model is fine-tuned as that PE (a recipe
    # that wrote `pe: tape` would silently grow a RoPE checkpoint into TAPE).
    config = json.loads(next((ft / "checkpoints").glob("step-*/model_config.json")).read_text())
    assert config["pe"] == "rope" and config["max_seq_len"] == 128



def test_context_extension_smoke_extends_a_hugging_face_llama(tmp_path: Path, tiny_corpus: Path):
    pytest.importorskip("transformers")
    from hf_helpers import make_hf_llama

    make_hf_llama(tmp_path / "hf", max_position_embeddings=64)
    ext = tmp_path / "ext"
    out = invoke("extend-context", "--base", str(tmp_path / "hf"), "--recipe", "context-extension-smoke", "--out",
                 str(ext), f"data.source={tiny_corpus}")
    assert "from 64 to 128 tokens; method tape, scaling pi" in out and (ext / "checkpoints").is_dir()


def test_drope_smoke_drops_the_positional_embedding_of_a_hugging_face_llama(tmp_path: Path, tiny_corpus: Path):
    pytest.importorskip("transformers")
    from hf_helpers import make_hf_llama

    make_hf_llama(tmp_path / "hf", max_position_embeddings=64)
    out = invoke("extend-context", "--base", str(tmp_path / "hf"), "--method", "drope", "--recipe", "drope-smoke",
                 "--out", str(tmp_path / "drope"), f"data.source={tiny_corpus}")
    assert "to 128 tokens; method drope" in out and "layers rope -> nope" in out
    assert (tmp_path / "drope" / "checkpoints" / "step-00000003").is_dir()



def test_drope_ruler_example_recalibrates_on_prompt_answer_rows(tmp_path: Path):
    """drope-ruler-example (docs/results/drope-cpu.md) on a tiny Llama, shrunk to 2 steps: DroPE on the `pairs` data
    kind (the loss on the answer only), which no other DroPE recipe uses."""
    pytest.importorskip("transformers")
    from hf_helpers import make_hf_llama

    make_hf_llama(tmp_path / "hf", max_position_embeddings=64)
    rows = [{"prompt": f"The grass is green. The key {i} is", "target": f" {1000 + 37 * i}"} for i in range(40)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = invoke("extend-context", "--base", str(tmp_path / "hf"), "--method", "drope", "--recipe",
                 "drope-ruler-example", "--out", str(tmp_path / "drope"), f"data.source={tmp_path / 'pairs.jsonl'}",
                 "data.seq_len=48", "model.max_seq_len=128", "train.max_steps=2", "train.batch_size=2",
                 "train.micro_batch_size=2", "train.save_every=2", "train.eval_every=2", "train.eval_batches=1")
    assert "to 128 tokens; method drope" in out and "layers rope -> nope" in out
    assert (tmp_path / "drope" / "checkpoints" / "step-00000002").is_dir()
    assert math.isfinite(last_loss(tmp_path / "drope"))


def test_arithmetic_smoke_trains_and_evaluates(tmp_path: Path):
    run = tmp_path / "add"
    invoke("pretrain", "--recipe", "arithmetic-smoke", "--out", str(run))
    out = invoke("eval", "addition", "--checkpoint", str(run), "--max-len", "3", "--samples", "2",
                 "--out", str(tmp_path / "eval"))
    assert "mean accuracy" in out
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert len(results["grid"]) == 3 and all(len(row) == 3 for row in results["grid"])


def test_hybrid_smoke_recipes_train_resume_and_evaluate(tmp_path: Path, tiny_corpus: Path):
    """The hybrid recipes through the CLI: training prints each layer's kind and records the layout; a run resumes
    (more steps); perplexity past the training length and passkey retrieval evaluate it, their settings recording
    the layout."""
    for name in ("rnope-swa-smoke", "irope-smoke"):
        run = tmp_path / name
        out = invoke("pretrain", "--recipe", name, "--out", str(run), f"data.source={tiny_corpus}")
        scale = " (llama4 scale)" if name == "irope-smoke" else ""
        assert f"layers: rope x3 (window 8) + nope x1{scale}" in out
    config = json.loads(next((run / "checkpoints").glob("step-*/model_config.json")).read_text())
    assert config["schedule"]["kinds"]["global"]["length_scale"] == "llama4"
    out = invoke("pretrain", "--recipe", "irope-smoke", "--out", str(run), f"data.source={tiny_corpus}",
                 "train.max_steps=6")
    assert "resuming from" in out and (run / "checkpoints" / "step-00000006").is_dir()
    heldout = next(tiny_corpus.iterdir())
    invoke("eval", "perplexity", "--model", str(run), "--data", str(heldout), "--seq-len", "32,96", "--stride", "32",
           "--device", "cpu", "--out", str(tmp_path / "ppl"))
    results = json.loads((tmp_path / "ppl" / "results.json").read_text())
    assert results["models"][0]["schedule"]["pattern"] == ["local", "local", "local", "global"]
    assert all(math.isfinite(entry["perplexity"]) for entry in results["models"][0]["lengths"].values())
    invoke("eval", "passkey", "--model", str(run), "--budgets", "16,48", "--trials", "1", "--depths", "0,1",
           "--device", "cpu", "--out", str(tmp_path / "passkey"))
    settings = json.loads((tmp_path / "passkey" / "settings.json").read_text())
    assert settings["model"]["schedule"]["kinds"]["local"]["window"] == 8
