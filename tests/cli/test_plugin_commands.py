"""A PE from outside the package works in every command: pretrain, resume, finetune, eval, sweep, bench, doctor,
export (refused in one line). Given as a file (named on the command line) or installed (an entry point). Opening
a run never imports a file that this command line did not name; a missing installed plugin is one line naming the
package to install."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from plugin_helpers import NAME, PACKAGE, VERSION, write_plugin
from train_helpers import REPO, subprocess_env
from typer.testing import CliRunner

from tapecli import trust
from tapecli.cli import app

runner = CliRunner()
SMOKE = ("--recipe", "selective-copy-smoke")
SHORT = ("train.max_steps=2", "train.save_every=2", "train.eval_every=2")


def one_error_line(out: str) -> bool:
    """One `error:` line and no traceback (a computing command prints its startup line on stdout first)."""
    return len([line for line in out.splitlines() if line.startswith("error:")]) == 1 and "Traceback" not in out


def invoke(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture(autouse=True)
def nothing_allowed(monkeypatch):
    monkeypatch.delenv(trust.ALLOW_ENV, raising=False)


@pytest.fixture(scope="module")
def file_run(tmp_path_factory):
    """A selective-copy smoke run (2 steps) of the plugin given as FILE.py:CLASS: (plugin file, run directory)."""
    tmp = tmp_path_factory.mktemp("file-plugin")
    plugin = write_plugin(tmp / "plugins")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(trust.ALLOW_ENV, raising=False)
        invoke("pretrain", *SMOKE, "--out", str(tmp / "run"), f"model.pe={plugin}:LearnedALiBi", *SHORT)
    return plugin, tmp / "run"


def test_a_file_plugin_trains_records_itself_and_resumes(file_run):
    plugin, run = file_run
    saved = json.loads((run / "checkpoints" / "step-00000002" / "model_config.json").read_text())
    assert saved["pe"] == f"{plugin}:LearnedALiBi"
    assert saved["pe_plugin"]["kind"] == "file" and saved["pe_plugin"]["path"] == str(plugin.resolve())
    out = invoke("pretrain", *SMOKE, "--out", str(run), f"model.pe={plugin}:LearnedALiBi", "train.max_steps=3",
                 "train.save_every=2", "train.eval_every=2")
    assert "resuming from" in out and (run / "checkpoints" / "step-00000003").is_dir()


def test_opening_a_run_imports_its_plugin_file_only_when_named(file_run, tmp_path):
    """In a fresh process (nothing imported yet): the refused command never ran the file; --allow-pe lets it."""
    plugin, run = file_run
    marker = plugin.with_suffix(".imported")
    marker.unlink(missing_ok=True)  # written when this process imported the file (an earlier test may have)
    env = {k: v for k, v in subprocess_env().items() if k != trust.ALLOW_ENV}
    evaluate = [sys.executable, "-m", "tapecli", "eval", "synthetic", "--model", str(run), "--device", "cpu",
                "--out", str(tmp_path / "eval")]
    refused = subprocess.run(evaluate, cwd=REPO, env=env, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()  # (stdout: the startup line)
    assert len(lines) == 1 and "is code in a file" in lines[0] and "--allow-pe" in lines[0], lines
    assert not marker.exists()
    allowed = subprocess.run([evaluate[0], "-m", "tapecli", "--allow-pe", str(plugin), *evaluate[3:]], cwd=REPO,
                             env=env, capture_output=True, text=True)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert marker.exists()


def test_a_recipe_naming_a_file_imports_nothing(file_run, tmp_path):
    plugin, _ = file_run
    recipe = tmp_path / "theirs.yaml"
    text = (REPO / "recipes" / "selective-copy-smoke.yaml").read_text()
    recipe.write_text(text.replace("  pe: tape ", f"  pe: {plugin}:LearnedALiBi ", 1))
    out = invoke("pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"), code=2)
    assert "is code in a file" in out and "--allow-pe" in out and one_error_line(out)
    assert not (tmp_path / "run").exists()


def test_finetune_and_export(file_run, tmp_path):
    plugin, run = file_run
    out = invoke("--allow-pe", str(plugin), "export", "--checkpoint", str(run), "--out", str(tmp_path / "hf"), code=2)
    assert "has no Hugging Face Llama equivalent" in out and one_error_line(out)
    invoke("finetune", "--checkpoint", str(run), *SMOKE, "--out", str(tmp_path / "ft"),
           f"model.pe={plugin}:LearnedALiBi", "train.max_steps=1", "train.save_every=1", "train.eval_every=1")
    saved = json.loads((tmp_path / "ft" / "checkpoints" / "step-00000001" / "model_config.json").read_text())
    assert saved["pe_plugin"]["sha256"] == json.loads(
        (run / "checkpoints" / "step-00000002" / "model_config.json").read_text())["pe_plugin"]["sha256"]


def test_sweep_bench_and_doctor_take_a_plugin_file(file_run, tmp_path, monkeypatch):
    plugin, _ = file_run
    value = f"{plugin}:LearnedALiBi"
    out = invoke("sweep", *SMOKE, "--pe", f"rope,{value}", "--seeds", "0", "--out", str(tmp_path / "sweep"), *SHORT)
    assert "LearnedALiBi" in out and (tmp_path / "sweep" / "LearnedALiBi-seed0" / "checkpoints").is_dir()
    cells = {cell["name"]: cell for cell in json.loads((tmp_path / "sweep" / "results.json").read_text())["cells"]}
    assert set(cells) == {"rope-seed0", "LearnedALiBi-seed0"} and cells["LearnedALiBi-seed0"]["pe"] == value
    monkeypatch.delenv(trust.ALLOW_ENV)
    refused = invoke("sweep", "--report", str(tmp_path / "sweep"), code=2)  # sweep.json names it: not a permission
    assert "is code in a file" in refused
    (tmp_path / "sweep" / "results.json").unlink()
    invoke("--allow-pe", str(plugin), "sweep", "--report", str(tmp_path / "sweep"))
    assert json.loads((tmp_path / "sweep" / "results.json").read_text())["cells"][1]["name"] == "LearnedALiBi-seed0"
    monkeypatch.delenv(trust.ALLOW_ENV)
    bench = tmp_path / "bench.json"  # peak memory from a child process, which inherits the permission
    invoke("bench", "--pe", value, "--n-layers", "1", "--dim", "32", "--seq-len", "16", "--steps", "1", "--warmup",
           "0", "--rounds", "1", "--out", str(bench))
    at = json.loads(bench.read_text())["lengths"]["16"]
    assert at["paths"] == {"rope": ["sdpa"], "LearnedALiBi": ["chunked"]} and at["peak_bytes"]["LearnedALiBi"] >= 0
    monkeypatch.setattr("tapecli.experiments.doctor.compile_works", lambda device: "not checked")
    assert "all checks passed" in invoke("doctor", "--device", "cpu", "--pe", value, "--no-hybrids")
    # --jobs: checked in a spawned worker process, which inherits the permission (TAPE_ALLOW_PE)
    assert "all checks passed" in invoke("doctor", "--device", "cpu", "--pe", value, "--no-hybrids", "--jobs", "2")


def test_an_installed_plugin_is_a_name_and_a_missing_one_says_what_to_install(tmp_path, monkeypatch, plugin_site):
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(plugin_site))
        invoke("pretrain", *SMOKE, "--out", str(tmp_path / "run"), f"model.pe={NAME}", *SHORT)
        invoke("eval", "synthetic", "--model", str(tmp_path / "run"), "--device", "cpu")
    sys.modules.pop("learned_alibi_pe", None)
    out = invoke("eval", "synthetic", "--model", str(tmp_path / "run"), "--device", "cpu", code=2)
    assert f"pip install '{PACKAGE}=={VERSION}'" in out and one_error_line(out)


def test_a_per_layer_plugin_given_as_an_override_is_named_on_the_command_line(file_run, tmp_path):
    """`model.schedule.kinds.X.pe=FILE:CLASS` names the file as `model.pe=FILE:CLASS` does (it was refused as not
    named on the command line)."""
    plugin, _ = file_run
    invoke("pretrain", *SMOKE, "--out", str(tmp_path / "run"), "model.schedule.pattern=[rope,mine]",
           f"model.schedule.kinds.mine.pe={plugin}:LearnedALiBi", "train.max_steps=1", "train.save_every=1",
           "train.eval_every=1")
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-00000001" / "model_config.json").read_text())
    assert saved["schedule"]["kinds"]["mine"]["pe"] == f"{plugin}:LearnedALiBi"
