"""Recipes and run directories written by tape 0.1 -- every key of every section spelled, `extend.method: null` --
keep loading, resuming, evaluating and fine-tuning. The fixtures in tests/fixtures/v0.1 were made by 0.1's own code
(see the README there); nothing in them was written by hand."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from scrolls_helpers import write_scrolls_zip
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.recipe import Recipe, list_recipes, load_recipe
from tapecli.recipe.legacy import is_legacy, legacy_hash, legacy_yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "v0.1"
DUMPS = sorted((FIXTURES / "recipes").glob("*.yaml"))
RUNS = {"c4-smoke": "text", "selective-copy-smoke": "selective-copy", "arithmetic-smoke": "addition"}
# What each dump is today: a shipped recipe, or the one 0.1 dump made with overrides.
TODAY = {name: (name, []) for name, _ in list_recipes()}
TODAY["context-extension-smoke-tape"] = ("context-extension-smoke", ["extend.method=tape", "model.max_seq_len=128"])
# 0.1 loaded context-extension recipes without --method as "no extension" (method null): no run was ever made so.
NOT_A_RUN = {"context-extension", "context-extension-smoke"}

runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def old(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the fixtures as the working directory, where the runs were made (data.source=corpus)."""
    copy = tmp_path / "v0.1"
    shutil.copytree(FIXTURES, copy)
    monkeypatch.chdir(copy)
    return copy


def used_values(recipe: Recipe) -> dict[str, dict]:
    """The recipe's values less the keys its run ignores (Recipe.ignored_keys), which shipped recipes leave out."""
    values = recipe.to_dict()
    for key in recipe.ignored_keys():
        section, name = key.split(".")
        values[section].pop(name)
    return values


def original_command(run: Path) -> list[str]:
    """The command line that made a run (its run.json), without the leading `tape`."""
    return shlex.split(json.loads((run / "run.json").read_text())["command"])[1:]


@pytest.mark.parametrize("dump", DUMPS, ids=lambda p: p.stem)
def test_a_dump_of_0_1_reads_as_today_s_recipe(dump: Path):
    text = dump.read_text()
    assert is_legacy(yaml.safe_load(text))
    loaded = load_recipe(str(dump))
    assert loaded.notes == (f"{dump}: read in tape 0.1's recipe format; the keys kind {loaded.data.kind} does not "
                            "use are left out",)
    name, overrides = TODAY[dump.stem]
    if dump.stem not in NOT_A_RUN:  # the rewritten shipped recipes kept every value their run uses
        assert used_values(loaded) == used_values(load_recipe(name, overrides))
    assert not is_legacy(yaml.safe_load(loaded.to_yaml()))
    assert Recipe.from_dict(yaml.safe_load(text), origin=str(dump)) == loaded
    if loaded.data.kind == "text":
        assert loaded.eval is None and "blanks" not in loaded.to_dict()["data"]
    assert (loaded.extend is not None) == (dump.stem == "context-extension-smoke-tape")


@pytest.mark.parametrize("dump", [d for d in DUMPS if d.stem not in NOT_A_RUN], ids=lambda p: p.stem)
def test_legacy_yaml_reproduces_0_1_s_bytes_and_hash(dump: Path):
    """The hash a 0.1 checkpoint stores is recognised for today's recipe, so a resumed run prints no false note."""
    name, overrides = TODAY[dump.stem]
    today, text = load_recipe(name, overrides), dump.read_text()
    assert legacy_yaml(today, yaml.safe_load(text)) == text
    assert legacy_hash(today, dump) == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert legacy_hash(today, dump) != legacy_hash(load_recipe(name, [*overrides, "train.seed=7"]), dump)


def test_without_the_run_s_own_yaml_0_1_s_defaults_stand_in():
    text = (FIXTURES / "recipes" / "grid-1d.yaml").read_text()  # its unused keys all hold 0.1's defaults
    assert legacy_yaml(load_recipe("grid-1d")) == text


def test_only_the_exact_0_1_form_counts_as_legacy(tmp_path: Path):
    data = yaml.safe_load((FIXTURES / "c4-smoke" / "recipe.yaml").read_text())
    del data["train"]["seed"]  # one key short: a recipe of today's format, holding keys kind text does not use
    assert not is_legacy(data)
    with pytest.raises(TapeError, match=r"^recipe: data.prompt_field is not a key of kind text$"):
        Recipe.from_dict(data)
    assert not is_legacy(yaml.safe_load(load_recipe("c4-smoke").to_yaml()))


@pytest.mark.parametrize("run", RUNS)
def test_an_old_run_resumed_with_its_original_command_prints_no_note(old: Path, run: str):
    recipe = load_recipe(f"{run}/recipe.yaml")
    assert recipe.notes and recipe.data.kind == RUNS[run]
    state = torch.load(old / run / "checkpoints" / "step-00000004" / "train_state.pt", weights_only=False)
    assert state["recipe_hash"] == hashlib.sha256((old / run / "recipe.yaml").read_bytes()).hexdigest()[:16]
    out = invoke(*original_command(old / run))
    assert "nothing to do" in out and "recipe differs" not in out and "note:" not in out


def test_an_old_run_resumes_to_more_steps(old: Path):
    before = json.loads((old / "c4-smoke" / "run.json").read_text())
    out = invoke(*original_command(old / "c4-smoke"), "train.max_steps=6")
    assert "resuming from c4-smoke/checkpoints/step-00000004 (step 4 of 6)" in out
    assert "note: the recipe differs" in out  # it does: max_steps changed
    assert (old / "c4-smoke" / "checkpoints" / "step-00000006").is_dir()
    steps = [row["step"] for row in map(json.loads, (old / "c4-smoke" / "metrics.jsonl").read_text().splitlines())
             if "loss" in row]
    assert steps == [1, 2, 3, 4, 5, 6]
    resolved = yaml.safe_load((old / "c4-smoke" / "recipe.yaml").read_text())
    assert not is_legacy(resolved) and "blanks" not in resolved["data"] and "eval" not in resolved
    info = json.loads((old / "c4-smoke" / "run.json").read_text())
    assert info["start_time"] == before["start_time"] and len(info["resumes"]) == 1


def test_an_old_synthetic_run_evaluates_with_its_splits(old: Path):
    out = invoke("eval", "synthetic", "--model", "selective-copy-smoke", "--out", "ev")
    assert "accuracy" in out.lower()
    results = json.loads((old / "ev" / "results.json").read_text())
    settings = results["settings"]
    assert settings["samples"] == 4  # eval.samples of the old recipe
    assert settings["splits"] == {"iid": {"n_tokens": 4, "blanks": 4}, "ood-dense": {"n_tokens": 4, "blanks": 2},
                                  "ood-sparse": {"n_tokens": 4, "blanks": 8}}
    assert set(results["splits"]) == {"iid", "ood-dense", "ood-sparse"}


def test_an_old_addition_run_evaluates_with_its_grid(old: Path):
    invoke("eval", "addition", "--checkpoint", "arithmetic-smoke", "--out", "ev")
    results = json.loads((old / "ev" / "results.json").read_text())
    assert len(results["grid"]) == 10 and all(len(row) == 10 for row in results["grid"])  # eval.max_len 10
    assert results["settings"]["samples"] == 2 and results["settings"]["train_digits"] == 5


def test_an_old_run_fine_tunes(old: Path):
    scrolls = write_scrolls_zip(old / "scrolls")
    out = invoke("finetune", "--recipe", "scrolls-smoke", "--checkpoint", "c4-smoke", "--out", "ft",
                 f"data.source={scrolls}", "train.max_steps=1")
    assert "initialised from c4-smoke/checkpoints/step-00000004" in out
    config = json.loads((old / "ft" / "checkpoints" / "step-00000001" / "model_config.json").read_text())
    assert (config["dim"], config["n_heads"], config["max_seq_len"]) == (32, 2, 128)  # the old model, grown context
    out = invoke("finetune", "--recipe", "selective-copy-smoke", "--checkpoint", "selective-copy-smoke",
                 "--out", "ft-copy", "train.max_steps=1")
    assert "note: train.warmup: 1 warm-up steps do not fit train.max_steps=1; warming up for 0" in out
    assert (old / "ft-copy" / "checkpoints" / "step-00000001").is_dir()


def test_an_old_rope_run_exports_to_hugging_face(old: Path):
    """The RoPE run of 0.1 exports through model/hf, and transformers computes its logits."""
    transformers = pytest.importorskip("transformers")
    from tapecli.store.door import open_model

    invoke("export", "--checkpoint", "arithmetic-smoke", "--out", "hf")
    assert json.loads((old / "hf" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    ours = open_model("arithmetic-smoke", device="cpu", dtype="fp32").model
    theirs = transformers.AutoModelForCausalLM.from_pretrained(old / "hf").eval()
    x = torch.randint(0, ours.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(x).logits, ours(x), rtol=1e-5, atol=1e-5)
