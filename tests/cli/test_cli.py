"""The `tape` entry point: fast help, real commands, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()


def test_help_lists_the_commands_and_imports_nothing_heavy():
    code = ("import sys, tapecli.cli as c; "
            "heavy = [m for m in ('torch', 'datasets', 'matplotlib', 'lm_eval', 'transformers') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("pretrain", "finetune", "eval", "bench", "doctor", "recipes", "tokenizer", "extend-context",
                    "export"):
        assert command in result.output


@pytest.mark.slow
def test_bench_runs_and_reports_ratios(tmp_path):
    """Times from this process, peak memory from one child process per PE and length (RoPE's and ALiBi's here),
    the attention path each PE took."""
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--pe", "rope,alibi", "--n-layers", "1", "--dim", "32", "--seq-len", "16",
                                 "--batch-size", "2", "--steps", "1", "--warmup", "0", "--rounds", "1",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "T = 16: training step" in result.output
    data = json.loads(out.read_text())
    assert data["settings"]["seq_lens"] == [16] and data["settings"]["precision"] == "fp32"
    at = data["lengths"]["16"]
    assert at["ratio_to_rope"]["rope"] == 1.0 and set(at["ratio_to_rope"]) == {"rope", "alibi"}
    assert all(v > 0 for v in at["median_step_s"].values())
    assert at["cpu_ratio_to_rope"]["rope"] == 1.0 and all(v > 0 for v in at["median_cpu_s"].values())
    assert all(v is not None and v >= 0 for v in at["peak_bytes"].values()), at["peak_bytes"]
    assert at["memory_ratio_to_rope"]["rope"] in (1.0, None)  # None: RoPE's step grew no resident memory
    assert at["paths"] == {"rope": ["sdpa"], "alibi": ["chunked"]}


@pytest.mark.slow
def test_bench_several_lengths_in_bf16(tmp_path):
    """One table per length; --no-memory skips the child processes. TAPE's last layer does not average its state
    (plain SDPA there)."""
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--pe", "rope,t5,tape,cope", "--n-layers", "2", "--dim", "32",
                                 "--seq-len", "16,24", "--steps", "1", "--warmup", "0", "--rounds", "1",
                                 "--precision", "bf16", "--no-memory", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "T = 16: training step" in result.output and "T = 24: training step" in result.output
    data = json.loads(out.read_text())
    assert data["settings"]["precision"] == "bf16"
    for length in ("16", "24"):
        at = data["lengths"][length]
        assert set(at["peak_bytes"].values()) == {None} and at["ratio_to_rope"]["rope"] == 1.0
        assert at["paths"] == {"rope": ["sdpa"], "t5": ["chunked"], "cope": ["cope-recompute"],
                               "tape (separate)": ["sdpa", "sdpa-separate"], "tape (concat)": ["sdpa", "sdpa-concat"]}


def test_bench_takes_pe_specs_with_pe_args(tmp_path):
    """A --pe spec (name:key=value) is a row of its own, labelled as written; a bad value is one line."""
    out = tmp_path / "bench.json"
    result = runner.invoke(app, ["bench", "--pe", "rope,rope:fope=true,pope,mapwm", "--n-layers", "1", "--dim", "32",
                                 "--seq-len", "16", "--steps", "1", "--warmup", "0", "--rounds", "1", "--no-memory",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    at = json.loads(out.read_text())["lengths"]["16"]
    assert at["paths"] == {"rope": ["sdpa"], "rope:fope=true": ["sdpa"], "pope": ["sdpa"], "mapwm": ["mapwm", "sdpa"]}
    bad = runner.invoke(app, ["bench", "--pe", "rope:frequency_fraction=2", "--seq-len", "16", "--no-memory"])
    assert bad.exit_code == 2 and "model.pe_args.frequency_fraction" in bad.output and bad.output.count("\n") == 1


@pytest.mark.slow
def test_doctor_reports_the_machine_and_checks_each_pe():
    """The environment lines, then one line per PE and per hybrid layout with its paths and four passed checks (the
    hybrids: windows, temperatures, length scales, several PEs in one model); exit 0."""
    result = runner.invoke(app, ["doctor", "--device", "cpu", "--pe", "rope,alibi,cope"])
    assert result.exit_code == 0, result.output
    for key in ("torch", "cuda", "bf16", "flash-attn", "fla", "triton", "torch.compile", "hf import"):
        assert f"  {key} " in result.output, key
    assert "torch.compile  works" in result.output
    lines = {line.split()[0].rstrip(":"): line for line in result.output.splitlines()
             if line.startswith("  ") and " train: " in line}
    assert set(lines) == {"rope", "alibi", "cope", "irope", "bias-mix", "state-mix", "hf-hybrid"}
    assert "Qwen3ForCausalLM" in result.output and "SmolLM3ForCausalLM" in result.output
    assert "train: chunked" in lines["alibi"] and "train: cope-recompute" in lines["cope"]
    assert "train: chunked, cope-recompute, path-recompute" in lines["state-mix"]
    for line in lines.values():
        assert line.count(" ok") == 4 and "FAILED" not in line and " kv-cache ok " in line, line
    assert "all checks passed" in result.output


@pytest.mark.slow
def test_doctor_fails_loudly(monkeypatch):
    """A check that fails marks its line and makes the command exit with 1; an unknown PE is a usage error."""
    monkeypatch.setattr("tapecli.pe.check.subject.FP32_TOLERANCE", {"cpu": 0.0})  # fp32 is not fp64
    monkeypatch.setattr("tapecli.experiments.doctor.compile_works", lambda device: "not checked")
    result = runner.invoke(app, ["doctor", "--device", "cpu", "--pe", "alibi", "--no-hybrids"])
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.output and "failed: alibi" in result.output
    unknown = runner.invoke(app, ["doctor", "--pe", "rotary"])
    assert unknown.exit_code == 2 and "unknown positional encoding 'rotary'" in unknown.output


def test_recipes_lists_and_shows():
    listing = runner.invoke(app, ["recipes"])
    assert listing.exit_code == 0 and "arithmetic" in listing.output and "c4-smoke" in listing.output
    shown = runner.invoke(app, ["recipes", "c4"])
    assert shown.exit_code == 0 and "model:" in shown.output and "#" in shown.output
    missing = runner.invoke(app, ["recipes", "c5"])
    assert missing.exit_code == 2 and "not found" in missing.output


def test_bad_pe_args_are_one_line_errors_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["pretrain", "--recipe", "c4-smoke", "--out", str(out), f"data.source={tmp_path}",
                                 "model.pe=rope", "model.pe_args.scaling=ntk"])
    assert result.exit_code == 2, result.output
    assert "model.pe_args.scaling: unknown RoPE scaling 'ntk'" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_tokenizer_train_command_writes_a_lossless_model(tmp_path, tiny_corpus):
    from tapecli.data.tokenizer import load_tokenizer

    out = tmp_path / "tok.model"
    result = runner.invoke(app, ["tokenizer", "train", "--data", str(tiny_corpus), "--vocab-size", "400",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = (tiny_corpus / "doc00.txt").read_text()
    tok = load_tokenizer(str(out))
    assert tok.vocab_size == 400 and tok.decode(tok.encode(text)) == text
    bad = runner.invoke(app, ["tokenizer", "train", "--data", str(tmp_path / "missing"), "--vocab-size", "300",
                              "--out", str(out)])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_bench_and_doctor_survive_one_failing_pe(monkeypatch):
    """A PE that raises gets one row saying why, the other PEs still run, and the command exits with 1."""
    from tapecli.experiments import bench, doctor

    real_variant, real_check = bench.make_variant, doctor.check_pe

    def broken_variant(spec):
        if spec["pe"] == "alibi":
            raise RuntimeError("alibi broke.\nsecond line")
        return real_variant(spec)

    def broken_check(pe, device, keys=None):
        if pe == "alibi":
            raise ValueError("alibi broke")
        return real_check(pe, device, keys)

    monkeypatch.setattr(bench, "make_variant", broken_variant)
    result = runner.invoke(app, ["bench", "--pe", "rope,alibi,nope", "--n-layers", "1", "--dim", "32", "--seq-len",
                                 "16", "--steps", "1", "--warmup", "0", "--rounds", "1", "--no-memory"])
    assert result.exit_code == 1, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert "failed:" in rows["alibi"] and "second line" not in result.output
    assert "alibi: failed: RuntimeError: alibi broke" in result.output
    assert "sdpa" in rows["nope"] and "1.00" in rows["rope"]
    monkeypatch.setattr(doctor, "check_pe", broken_check)
    monkeypatch.setattr(doctor, "compile_works", lambda device: "not checked")
    result = runner.invoke(app, ["doctor", "--device", "cpu", "--pe", "alibi,nope", "--no-hybrids"])
    assert result.exit_code == 1, result.output
    assert "alibi:   failed: ValueError: alibi broke" in result.output
    assert "nope:    train: sdpa" in result.output and "failed: alibi" in result.output


# ---------------------------------------------------------------------------------------------------------------
# The design card's names, unknown commands


def _options_box(args: list[str]) -> str:
    """The options part of a command's --help (everything from the first option box on)."""
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output[result.output.index("─ Options"):]


def test_each_alias_lists_the_same_options_as_its_twin():
    from tapecli.cli import ALIASES

    assert set(ALIASES) == {"eval-addition", "eval-scrolls", "passkey", "perplexity"}
    for alias, twin in ALIASES.items():
        assert _options_box([alias]) == _options_box(["eval", twin]), alias
        assert f"The same as `tape eval {twin}`" in runner.invoke(app, [alias, "--help"]).output


def test_aliases_are_listed_once_in_the_help():
    """Hidden as commands; the eval row names them."""
    listing = runner.invoke(app, ["--help"]).output
    rows = [line.split()[1] for line in listing.splitlines() if line.startswith("│ ") and line.split()[1:2]]
    assert "perplexity" not in rows and "eval-addition" not in rows and "eval" in rows
    flat = " ".join(listing.replace("│", " ").split())
    assert "(aliases: `tape eval-addition`, `tape eval-scrolls`, `tape passkey`, `tape perplexity`)" in flat


def test_an_alias_writes_what_its_twin_writes(tmp_path, tiny_corpus):
    from train_helpers import write_recipe

    from tapecli.recipe import load_recipe
    from tapecli.train import engine

    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus, train={"max_steps": 1, "save_every": 1, "warmup": 0,
                                                                   "eval_every": 0})
    run = engine.pretrain(load_recipe(str(recipe)), tmp_path / "run")
    outputs = {}
    for args in (["passkey"], ["eval", "passkey"]):
        out = tmp_path / "-".join(args)
        result = runner.invoke(app, [*args, "--model", str(run), "--budgets", "40", "--trials", "2",
                                     "--out", str(out)])
        assert result.exit_code == 0, result.output
        results = json.loads((out / "results.json").read_text())
        results.pop("seconds_this_session")
        outputs[" ".join(args)] = (results, (out / "samples.jsonl").read_text())
    assert outputs["passkey"] == outputs["eval passkey"]


@pytest.mark.parametrize(("args", "line"), [
    (["eval", "pass"], "error: no such command 'pass'; did you mean `tape eval passkey`? (see `tape eval --help`)"),
    (["evaluate"], "error: no such command 'evaluate'; did you mean `tape eval`? (see `tape --help`)"),
    (["addition"], "error: no such command 'addition'; did you mean `tape eval addition`? (see `tape --help`)"),
    (["eval-additon"], "error: no such command 'eval-additon'; did you mean `tape eval-addition`? (see `tape --help`)"),
    (["tokenizer", "trian"], "error: no such command 'trian'; did you mean `tape tokenizer train`? (see `tape "
                             "tokenizer --help`)"),
    (["zzzz"], "error: no such command 'zzzz' (see `tape --help`)"),
    # the root's own options: one line too; a command's option before the command says where it goes
    (["--threads", "1", "bench"], "error: --threads is an option of the commands: put it after the command's name "
                                  "(`tape COMMAND --threads ...`) (see `tape --help`)"),
    (["--bogus", "bench"], "error: No such option: --bogus (see `tape --help`)"),
])
def test_an_unknown_command_names_the_nearest(args, line):
    result = runner.invoke(app, args, prog_name="tape")
    assert result.exit_code == 2 and result.stderr.strip() == line


def test_every_group_suggests():
    """A new group must be `typer.Typer(cls=Group, ...)` to answer a typo with the nearest command."""
    from typer.core import TyperGroup

    from tapecli.cli.app import Group

    def groups(command):
        if isinstance(command, TyperGroup):
            yield command
            for sub in command.commands.values():
                yield from groups(sub)

    found = list(groups(typer.main.get_command(app)))
    assert len(found) >= 3 and all(isinstance(g, Group) for g in found), [g.name for g in found]


def test_the_cli_reference_names_every_command():
    from pathlib import Path

    from tapecli.cli import ALIASES

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()

    def paths(command, prefix=""):
        for name, sub in getattr(command, "commands", {}).items():
            if hasattr(sub, "commands"):
                yield from paths(sub, f"{prefix}{name} ")
            elif not sub.hidden:
                yield prefix + name

    names = list(paths(typer.main.get_command(app)))
    assert len(names) > 15
    missing = [name for name in [*names, *ALIASES] if f"`tape {name}`" not in text]
    assert not missing, missing


def test_every_number_option_declares_its_range():
    """Every int option has a range and every float option is finite (tapecli.cli.options): a new option without
    them fails here."""
    import typing

    def leaves(command, prefix="tape"):
        for name, sub in getattr(command, "commands", {}).items():
            if hasattr(sub, "commands"):
                yield from leaves(sub, f"{prefix} {name}")
            else:
                yield f"{prefix} {name}", sub

    missing, checked = [], 0
    for path, command in leaves(typer.main.get_command(app)):
        for param in command.params:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            kinds = set(typing.get_args(annotation)) | {annotation} | {
                inner for arg in typing.get_args(annotation) for inner in typing.get_args(arg)}
            if int in kinds and bool not in kinds:
                checked += 1
                if param.min is None:
                    missing.append(f"{path} {param.opts[0]}: int without a range (tapecli.cli.options.integer)")
            if float in kinds:
                checked += 1
                if not getattr(getattr(param.callback, "__wrapped__", param.callback), "checks_finite", False):
                    missing.append(f"{path} {param.opts[0]}: float not checked finite (tapecli.cli.options.number)")
    assert checked > 40 and not missing, "\n".join(missing)


def test_the_base_help_names_every_imported_family():
    """--base's help lists the families the door imports (model.hf.arch.ARCHITECTURES), none left out."""
    import re

    from tapecli.cli.train import _BASE_HELP
    from tapecli.model.hf.arch import ARCHITECTURES

    def squashed(text: str) -> str:
        return re.sub(r"[^a-z0-9]", "", text.lower())

    missing = [a for a in ARCHITECTURES if squashed(a.removesuffix("ForCausalLM")) not in squashed(_BASE_HELP)]
    assert not missing
