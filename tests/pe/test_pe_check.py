"""`tape pe check`: every built-in PE passes every check that applies to it (its claims included), and for each
check a deliberately broken PE (tests/pe/broken_pes.py, a plugin file) fails exactly that check."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from tapecli import trust
from tapecli.model import PE_NAMES
from tapecli.pe.check import CHECKS, run_pe_check

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


def test_a_correct_pe_passes_the_compile_check():
    """The broken CompileOnly PE fails it (below); a correct one must pass it, or the check cannot tell them apart."""
    assert check("alibi", compile=True, compile_backend="aot_eager")["compile"]


def test_a_pe_without_its_claims_is_not_held_to_them():
    assert "shift-invariance" not in check("tape", pe_args={"mix": "full"})  # the ablation without equivariance


def test_each_broken_pe_fails_exactly_its_check(monkeypatch):
    import broken_pes

    monkeypatch.setenv(trust.ALLOW_ENV, str(BROKEN_FILE))
    for name, cls in broken_pes.BROKEN.items():
        results = check(f"{BROKEN_FILE}:{cls}", compile=name == "compile", compile_backend="aot_eager")
        assert [check for check, ok in results.items() if not ok] == [name], (cls, results)
    assert set(broken_pes.BROKEN) == set(CHECKS)


NAN_BIAS = '''
import torch
from tapecli.pe import LayerPE, PositionalEncoding, ScoreBias


class NaNLayer(LayerPE):
    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def need(self, state, average_state):
        return ScoreBias(pairs=lambda q, k: torch.full((1, self.heads, q.shape[-1], k.shape[-1]), float("nan")))


class NaNBias(PositionalEncoding):
    def make_layer(self, layer_idx):
        return NaNLayer(self.config.n_heads)
'''


def test_nan_on_both_sides_is_no_agreement(monkeypatch, tmp_path: Path):
    """A bias of NaN everywhere makes every logit NaN: a comparison of NaN with NaN fails (its difference is
    infinite), where max() and <= had let it through as 0.0."""
    plugin = tmp_path / "nan_bias.py"
    plugin.write_text(NAN_BIAS)
    monkeypatch.setenv(trust.ALLOW_ENV, str(plugin))
    outcomes = {o.name: o for o in run_pe_check(f"{plugin}:NaNBias", device="cpu", console=Console(file=io.StringIO()))}
    for name in ("causality", "kv-cache", "chunked-prefill", "padding", "batch", "dense", "save-load", "finite"):
        assert not outcomes[name].ok, (name, outcomes[name].text)
    assert "max |diff| inf" in outcomes["causality"].text and "max relative diff inf" in outcomes["dense"].text
