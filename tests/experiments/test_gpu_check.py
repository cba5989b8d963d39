"""scripts/gpu-check.sh: its --cpu mode runs every part at toy sizes and writes the page (each part's section, its
budget and status, what was skipped); the pieces the GPU run relies on (which forced attention paths a variant
may take, what a stopped part lists as skipped) are checked directly."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from train_helpers import REPO, subprocess_env

from tapecli.experiments.bench import forced_applies
from tapecli.experiments.gpu_check import page
from tapecli.model import PE_NAMES

CPU = torch.device("cpu")


def test_cpu_mode_writes_the_page(tmp_path) -> None:
    env = subprocess_env() | {"PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "--cpu", "--out", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    statuses = {name: part["status"] for name, part in report["parts"].items()}
    assert list(statuses) == ["doctor", "bench", "train", "extend"]
    # A part stopped at its budget (a loaded machine) is a skip the page names, and the exit code says so.
    assert proc.returncode == (0 if set(statuses.values()) == {"done"} else 1), proc.stderr[-2000:]
    assert report["mode"] == "cpu (toy sizes)" and report["pes"] == list(PE_NAMES)
    text = (tmp_path / "gpu-check.md").read_text()
    for title in page.TITLES.values():
        assert f"## {title}" in text
    assert "## Skipped" in text and proc.stdout.rstrip().splitlines()[-1].startswith("skipped: ")
    doctor = report["parts"]["doctor"]
    if doctor["status"] == "done":
        assert doctor["result"]["failed"] == [] and "rope:" in doctor["result"]["text"]
    rows = report["parts"]["train"]["result"].get("rows", {})
    if "rope" in rows:
        assert rows["rope"]["tokens_per_s"] > 0 and rows["rope"]["mfu"] is None  # no peak FLOP/s for a CPU
    extend = report["parts"]["extend"]
    if extend["status"] == "done":
        row = extend["result"]
        assert row["tokens"] == 64 and row["peak_bytes"] > 0 and row["step_s"] > 0
        assert "predicted for a 7B base" in text


def test_forced_paths_a_variant_may_take() -> None:
    assert forced_applies("dense", {"chunked"}, CPU)  # ALiBi: its bias materialised
    assert forced_applies("chunked", {"sdpa"}, CPU)  # RoPE through the chunked kernel
    assert not forced_applies("dense", {"sdpa"}, CPU)  # without a bias, dense is SDPA's causal call again
    assert not forced_applies("sdpa", {"chunked"}, CPU)  # a bias PE on plain SDPA would be `dense`
    assert not forced_applies("chunked", {"chunked"}, CPU)  # the path it takes anyway
    assert not forced_applies("dense", {"cope-recompute"}, CPU)  # attention of its own ignores a forced path
    assert not forced_applies("flex", {"sdpa"}, CPU)  # FlexAttention trains on CUDA only
    assert not forced_applies("flash-attn", {"sdpa"}, CPU)
    assert not forced_applies("sdpa-concat", {"sdpa"}, CPU)  # TAPE's own paths are chosen by its pe_args


def test_a_stopped_part_names_what_it_left_out() -> None:
    report = {"parts": {
        "bench": {"status": "stopped at its budget of 180 s",
                  "result": {"lengths": {"1024": {}}, "skipped": {"1024": ["cope", "path on dense"]}}},
        "train": {"status": "done", "result": {"variants": ["rope", "tape", "rope, compiled", "tape, compiled"],
                                               "rows": {"rope": {}}, "failed": {"tape": "boom"}}}}}
    assert page.skipped(report, {"bench": [1024, 8192]}) == [
        "bench: stopped at its budget of 180 s", "bench at T = 1024: cope; path on dense",
        "bench at T = 8192: every PE", "train: rope, compiled; tape, compiled"]
