"""`tape pe check`: every built-in PE passes every check that applies to it (its claims included), and for each
check a deliberately broken PE (tests/model/broken_pes.py, a plugin file) fails exactly that check."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tapecli import trust
from tapecli.experiments.pe_check import CHECKS, run_pe_check
from tapecli.model import PE_NAMES

BROKEN_FILE = Path(__file__).with_name("broken_pes.py")


def check(pe: str, **options) -> dict[str, bool]:
    outcomes = run_pe_check(pe, device="cpu", console=Console(file=io.StringIO()), **options)
    return {o.name: o.ok for o in outcomes}


@pytest.mark.parametrize("pe", PE_NAMES)
def test_every_built_in_passes(pe):
    results = check(pe)
    assert all(results.values()), results
    claimed = {"nope": 1, "fire": 0, "rope": 2, "xpos": 2, "randpe": 2, "tape": 2, "clipped-rope": 2,
               "grape-ap": 0}.get(pe, 1)
    assert len(results) == len(CHECKS) - 3 + claimed  # every check but compile (on request) and the unclaimed


def test_a_pe_without_its_claims_is_not_held_to_them():
    assert "shift-invariance" not in check("tape", pe_args={"mix": "full"})  # the ablation without equivariance


def test_each_broken_pe_fails_exactly_its_check(monkeypatch):
    import broken_pes

    monkeypatch.setenv(trust.ALLOW_ENV, str(BROKEN_FILE))
    for name, cls in broken_pes.BROKEN.items():
        results = check(f"{BROKEN_FILE}:{cls}", compile=name == "compile", compile_backend="aot_eager")
        assert [check for check, ok in results.items() if not ok] == [name], (cls, results)
    assert set(broken_pes.BROKEN) == set(CHECKS)
