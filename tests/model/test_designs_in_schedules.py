"""The PEs and the gate added with the 2026 designs inside per-layer schedules: 4-layer models mixing them (and their
forms: non-commuting GRAPE with learned planes, DAPE v2 with a FIRE base and a window, gated GRAPE-A) with each
other pass `tape pe check`'s exact checks (fast paths vs every score materialised, outputs and
gradients with and without padding; KV cache; chunked prefill; padding; save-load)."""

from __future__ import annotations

import pytest
import torch

from tapecli.pe.check import Subject, run_check

LAYOUTS = {
    "rotations": {"pe": "clipped-rope", "pe_args": {"clip_low_n": 3},
                  "schedule": {"layers": ["clipped-rope", "grape-nc", "liere", "comrope"],
                               "kinds": {"grape-nc": {"pe": "grape", "pe_args": {
                                   "generators": "noncommuting", "rank": 4, "learned_planes": True}}}}},
    "biases": {"pe": "dape", "output_gate": "headwise",
               "schedule": {"pattern": ["dape", "grape-ap", "local", "gated"],
                            "kinds": {"local": {"pe": "dape", "window": 6, "pe_args": {"version": 2, "base": "fire"}},
                                      "gated": {"pe": "grape-ap", "pe_args": {"potential": "querykeygated"}}}}},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scheduled_layers_stay_exact(layout):
    keys = dict(LAYOUTS[layout])
    pe, pe_args = keys.pop("pe"), keys.pop("pe_args", {})
    subject = Subject(pe, pe_args, torch.device("cpu"), keys=keys)
    model = subject.model()
    assert [type(layer.pe).__name__ for layer in model.model.layers] == (
        ["RotaryLayer", "GRAPELayer", "LieRELayer", "ComRoPELayer"] if layout == "rotations" else
        ["DAPELayer", "GRAPEAPLayer", "DAPELayer", "GRAPEAPLayer"])
    if layout == "rotations":  # the scheduled GRAPE is the non-commuting one, with learned planes
        assert model.model.layers[1].pe.mix_a.shape[1:] == (2, 4) and hasattr(model.model.layers[1].pe, "plane_log")
    else:  # DAPE v1 and v2 (FIRE, windowed), GRAPE-AP's path sum and its gated form
        layers = [layer.pe for layer in model.model.layers]
        assert (layers[0].version, layers[2].version, layers[2].base) == (1, 2, "fire")
        assert (layers[1].potential, layers[3].potential) == ("official", "querykeygated")
    assert all((layer.self_attn.output_gate is not None) == (layout == "biases") for layer in model.model.layers)
    for name in ("dense", "kv-cache", "chunked-prefill", "padding", "save-load"):
        outcome = run_check(name, subject)
        assert outcome.ok, (name, outcome.text)
