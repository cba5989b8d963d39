"""Files someone else wrote (docs/untrusted-inputs.md): opening them runs no code of theirs and writes nowhere but
where the user said. Each case plants a payload that would leave a marker file if it ran, and checks the one-line
refusal (or the harmless outcome) and that the marker never appears."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error
from hf_helpers import make_hf_llama
from scrolls_helpers import write_scrolls_zip
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError

runner = CliRunner()


class Payload:
    """Pickled, it asks the unpickler to call os.system: what a malicious train_state.pt holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def run(tmp_path: Path, trained) -> tuple[Path, Path]:
    """A finished 2-step run (a private copy of the shared `trained()` run) and its recipe."""
    return trained.copy(tmp_path / "run"), Path(trained.recipe())


def test_a_recipe_with_a_python_tag_is_refused_before_anything_runs(tmp_path):
    marker = tmp_path / "PWNED"
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(f'model: !!python/object/apply:os.system ["touch {marker}"]\n')
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "out")])
    one_line_error(result, 2, "evil.yaml: line 1: the tag !!python/object/apply:os.system is refused")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_pickle_payload_in_a_checkpoint_is_refused_on_resume(run, tmp_path):
    run_dir, recipe = run
    marker = tmp_path / "PWNED"
    state = run_dir / "checkpoints" / "step-00000002" / "train_state.pt"
    torch.save({"payload": Payload(marker)}, state)
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(run_dir), "train.max_steps=3"])
    one_line_error(result, 2, str(state))
    assert not marker.exists()


def test_a_hugging_face_directory_with_remote_code_is_refused_without_importing_it(tmp_path):
    from tapecli.store.door import open_model

    model_dir = tmp_path / "evil-llama"
    make_hf_llama(model_dir)
    marker = tmp_path / "PWNED"
    (model_dir / "modeling_evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    config = json.loads((model_dir / "config.json").read_text())
    config.update(architectures=["EvilForCausalLM"], model_type="evil",
                  auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(TapeError, match="EvilForCausalLM"):
        open_model(str(model_dir), device="cpu")
    assert not marker.exists()


def test_archive_members_are_read_by_name_never_extracted(tmp_path):
    from tapecli.data.scrolls import load_split

    path = write_scrolls_zip(tmp_path / "data")
    with zipfile.ZipFile(path, "a") as z:  # members a careless extractor would write outside the folder
        z.writestr("../../escaped.txt", "x")
        z.writestr(str(tmp_path / "absolute.txt"), "x")
    rows = load_split("qasper", "validation", str(path))
    assert len(rows["id"]) == 6
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()
    assert not (tmp_path / "absolute.txt").exists()


def test_links_inside_a_run_directory_are_not_written_through(run, tmp_path):
    run_dir, recipe = run
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_dir / "eval-passkey").symlink_to(elsewhere)  # `tape eval passkey --model RUN` would write there
    result = runner.invoke(app, ["eval", "passkey", "--model", str(run_dir), "--max-tokens", "200"])
    one_line_error(result, 2, f"{run_dir}/eval-passkey is a symbolic link (to {elsewhere})",
                   "replace it with a real folder or file")
    checkpoints = run_dir / "checkpoints"
    checkpoints.rename(elsewhere / "checkpoints")
    checkpoints.symlink_to(elsewhere / "checkpoints")  # resuming would save and prune checkpoints there
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(run_dir), "train.max_steps=4"])
    one_line_error(result, 2, f"{checkpoints} is a symbolic link")
    assert sorted(p.name for p in (elsewhere / "checkpoints").iterdir()) == ["step-00000002"]
    assert list(elsewhere.iterdir()) == [elsewhere / "checkpoints"]
