"""`tape pe check`, `tape pe new` and `tape pe list` through the CLI: exit codes, one line per check, skeletons
that pass the check as written, and the listing of built-ins and installed plugins with their arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from plugin_helpers import NAME, PACKAGE, VERSION
from typer.testing import CliRunner

from tapecli import trust
from tapecli.cli import app

runner = CliRunner()
BROKEN = Path(__file__).resolve().parents[1] / "pe" / "broken_pes.py"


@pytest.fixture(autouse=True)
def nothing_allowed(monkeypatch):
    monkeypatch.delenv(trust.ALLOW_ENV, raising=False)


def invoke(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result.output


@pytest.mark.parametrize("kind, name, cls, checks", [("bias", "my_bias", "MyBias", 11), ("rotary", "spin", "Spin", 12)])
def test_new_writes_a_skeleton_that_passes_the_check(tmp_path, monkeypatch, kind, name, cls, checks):
    monkeypatch.chdir(tmp_path)
    out = invoke("pe", "new", name, "--kind", kind)
    assert f"wrote {name}.py: class {cls}" in out
    source = (tmp_path / f"{name}.py").read_text()
    assert f"class {cls}(PositionalEncoding)" in source and "from tapecli.pe import" in source
    checked = invoke("pe", "check", f"{name}.py", "--no-speed", "--device", "cpu")  # FILE.py: its one PE class
    lines = [line for line in checked.splitlines() if line.startswith("  ")]
    assert len(lines) == checks and all(" ok " in line for line in lines), checked  # its claims checked too
    assert f"all {checks} checks passed" in checked
    assert "already exists" in invoke("pe", "new", name, code=2)


def test_check_fails_with_exit_1_on_the_right_line_and_refuses_what_it_cannot_check(tmp_path):
    out = invoke("pe", "check", f"{BROKEN}:BatchMixing", "--no-speed", "--device", "cpu", code=1)
    failed = [line.split()[0] for line in out.splitlines() if " FAILED " in line]
    assert failed == ["batch"] and "failed: batch" in out
    assert "rows in a batch of 3 vs alone: max |diff|" in out
    several = invoke("pe", "check", str(BROKEN), "--no-speed", code=2)
    assert "PositionalEncoding classes" in several and f"{BROKEN}:CLASS" in several
    assert "unknown positional encoding 'rotary'" in invoke("pe", "check", "rotary", code=2)
    assert "not an argument of pe 'rope'" in invoke("pe", "check", "rope", "--pe-arg", "nope=1", code=2)


def test_list_shows_built_ins_and_installed_plugins_with_their_arguments(plugin_site, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_site))
    runner_wide = CliRunner(env={"COLUMNS": "250"})
    result = runner_wide.invoke(app, ["pe", "list"])
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") >= 4}
    assert {"nope", "rope", "alibi", "tape", "cope", "path", NAME} <= set(rows)
    assert "theta=10000.0" in rows["rope"] and "built in" in rows["rope"]
    assert "init=0.25" in rows[NAME] and f"{PACKAGE} {VERSION}" in rows[NAME]
