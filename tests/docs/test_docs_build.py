"""The docs step of scripts/test.sh (scripts/docs.sh) fails on any mkdocs warning: a dead link, a nav entry naming no
page, a missing anchor; and passes on the shipped docs. Each case builds a copy of mkdocs.yml and docs/ in a
temporary directory with the same script test.sh runs (a few seconds a build)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _copy(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def _check(site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MKDOCS": str(Path(sys.executable).parent / "mkdocs")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "docs.sh"), str(site / "mkdocs.yml")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def test_shipped_docs_build_without_a_warning(tmp_path):
    done = _check(_copy(tmp_path))
    assert done.returncode == 0, done.stderr


BREAKAGES = {
    "dead link": (lambda site: _append(site / "docs" / "index.md", "\nSee [this](no-such-page.md).\n"),
                  "no-such-page.md"),
    "missing nav page": (lambda site: _append(site / "mkdocs.yml", "  - Gone: results/no-such-result.md\n"),
                         "results/no-such-result.md"),
    "missing anchor": (lambda site: _append(site / "docs" / "index.md", "\nSee [speed](speed.md#no-such-heading).\n"),
                       "no-such-heading"),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_docs_step_fails_on_a_warning(tmp_path, breakage):
    site = _copy(tmp_path)  # mkdocs.yml ends with its nav, so an appended "  - " line is a nav entry
    breaking, named = BREAKAGES[breakage]
    breaking(site)
    done = _check(site)
    assert done.returncode == 1
    assert named in done.stderr and "WARNING" in done.stderr
