"""docs/write-your-own-pe.md runs as written: its files (the code blocks with a title) are written into a fresh
directory and every line of its bash blocks runs there, in order, as a reader would run it: `tape ...` through the
CLI (in this process, with nothing allowed beyond what each command line names), `pip install` into a target
directory put on the Python path (not into this environment), anything else with bash. Then what the page says
happened is checked: the check passed, the run recorded its plugin, the sweep compared three PEs, the installed
plugin is listed and trains."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tapecli import trust
from tapecli.cli import app

PAGE = Path(__file__).resolve().parents[1] / "docs" / "write-your-own-pe.md"
_FENCE = re.compile(r'^```(\w*)(?:\s+title="([^"]+)")?\s*$')


def blocks(markdown: str) -> list[tuple[str, str | None, str]]:
    """(language, title or None, body) of every fenced block."""
    found, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        opening = _FENCE.match(lines[i].strip())
        if opening and lines[i].strip() != "```":
            body, i = [], i + 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            found.append((opening.group(1), opening.group(2), "\n".join(body) + "\n"))
        i += 1
    return found


def test_the_tutorial_runs_as_written(tmp_path, monkeypatch):
    page = blocks(PAGE.read_text(encoding="utf-8"))
    files = {title: body for _, title, body in page if title}
    commands = [line for language, title, body in page if language == "bash" and not title
                for line in body.splitlines() if line.strip() and not line.startswith("#")]
    assert set(files) == {"kerple.py", "kerple-pe/pyproject.toml"} and len(commands) == 8, commands
    monkeypatch.chdir(tmp_path)
    for name, body in files.items():
        Path(name).parent.mkdir(parents=True, exist_ok=True)
        Path(name).write_text(body)
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))  # where `pip install` goes (importlib.metadata reads sys.path)
    outputs = {}
    runner = CliRunner(env={"COLUMNS": "200"})
    for command in commands:
        words = shlex.split(command)
        if words[0] == "tape":
            monkeypatch.delenv(trust.ALLOW_ENV, raising=False)  # each command is its own invocation
            result = runner.invoke(app, words[1:])
            assert result.exit_code == 0, f"{command}\n{result.output}"
            outputs[command] = result.output
        elif words[:2] == ["pip", "install"]:
            subprocess.run([sys.executable, "-m", "pip", "install", *words[2:], "--no-build-isolation", "--no-index",
                            "--target", str(site)], check=True, capture_output=True)
            importlib.invalidate_caches()  # the finder of `site` cached its listing before the install
        else:
            subprocess.run(["bash", "-c", command], check=True)
    check, = (out for command, out in outputs.items() if command.startswith("tape pe check"))
    assert "all 11 checks passed" in check
    assert "shift-invariance       ok" in check and "score-mod              ok" in check
    record = json.loads(next((tmp_path / "runs/kerple/checkpoints").glob("step-*/model_config.json")).read_text())
    assert record["pe"] == "kerple.py:Kerple" and record["pe_plugin"]["path"] == str(tmp_path / "kerple.py")
    cells = json.loads((tmp_path / "runs/compare/results.json").read_text())["cells"]
    assert sorted(cell["name"] for cell in cells) == ["Kerple-seed0", "alibi-seed0", "rope-seed0"]
    listing, = (out for command, out in outputs.items() if command == "tape pe list")
    assert "kerple" in listing and "kerple-pe 0.1.0" in listing
    installed = json.loads(next((tmp_path / "runs/kerple-installed/checkpoints").glob("step-*/model_config.json"))
                           .read_text())
    assert installed["pe_plugin"] == {"kind": "entry-point", "name": "kerple", "object": "kerple_pe:Kerple",
                                      "package": "kerple-pe", "version": "0.1.0"}
    sys.modules.pop("kerple_pe", None)
