"""The gpu-check report as a Markdown page (gpu-check.md) and JSON (gpu-check.json), written atomically.

    page.write(report, out_dir); page.skipped(report) -> ["bench at T = 32768: cope, path", ...]
"""

from __future__ import annotations

import json
from pathlib import Path

from tapecli.files import write_atomic

TITLES = {"doctor": "`tape doctor`", "bench": "`tape bench --precision bf16`: every PE, each attention path",
          "train": "Training throughput: the `c4` model (tape) beside transformers' Llama",
          "extend": "`tape extend-context --method lora`, activation checkpointing"}


def skipped(report: dict, lengths: dict[str, list[int]]) -> list[str]:
    """Everything a part left out: parts stopped or failed, lengths and variants not run within a budget
    (`lengths`: the bench lengths asked for)."""
    lines = []
    for name, entry in report["parts"].items():
        result = entry["result"]
        if entry["status"] != "done":
            lines.append(f"{name}: {entry['status']}")
        if name == "bench":
            lines += [f"bench at T = {length}: {'; '.join(labels)}"
                      for length, labels in result.get("skipped", {}).items()]
            lines += [f"bench at T = {length}: every PE" for length in lengths["bench"]
                      if str(length) not in result.get("lengths", {})]
        if name == "train":
            left = [label for label in result.get("variants", [])
                    if label not in result["rows"] and label not in result["failed"]]
            lines += [f"train: {'; '.join(left)}"] if left else []
    return lines


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def train_table(result: dict) -> list[str]:
    lines = [result.get("shape", ""), "", "| model | attention | ms / step | tokens / s | MFU | parameters |",
             "|---|---|---|---|---|---|"]
    for label, row in result["rows"].items():
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f} %"
        lines.append(f"| {label} | {row['attention']} | {1000 * row['step_s']:.1f} | {row['tokens_per_s']:,.0f} | "
                     f"{mfu} | {count(row['params'])} |")
    lines += [f"| {label} | failed: {error} | | | | |" for label, error in result["failed"].items()]
    return lines


def extend_lines(row: dict, toy: bool) -> list[str]:
    step = "-" if row["step_s"] is None else f"{row['step_s']:.2f} s"
    note = " (from a toy model: the line shows the page's shape, not a prediction)" if toy else ""
    return [f"- base: a random Llama of {count(row['params'])} parameters ({mib(row['weight_bytes'])} of "
            f"weights), {row['tokens']} tokens per step",
            f"- peak memory of the run: {mib(row['peak_bytes'])}; second step: {step} (whole run {row['run_s']:.1f} s)",
            f"- predicted for a 7B base (Llama-2-7B's shape), a linear extrapolation: "
            f"{row['predicted_7b_bytes'] / 1e9:.1f} GB, "
            + ("within" if row["fits_80gb"] else "beyond") + " one 80 GB GPU" + note]


def render(report: dict) -> str:
    lines = [f"# gpu-check: {report['hardware']}", "",
             f"- mode: {report['mode']}", f"- commit: {report['commit']}", f"- torch: {report['torch']}",
             f"- date: {report['date']}", f"- PEs (from the registry): {', '.join(report['pes'])}",
             f"- time in all: {report.get('seconds', 0):.0f} s", "",
             "| part | budget | took | status |", "|---|---|---|---|"]
    lines += [f"| {name} | {e['budget_s']:.0f} s | {e['seconds']:.0f} s | {e['status']} |"
              for name, e in report["parts"].items()]
    for name, entry in report["parts"].items():
        lines += ["", f"## {TITLES[name]}", ""]
        result = entry["result"]
        if entry["status"] != "done":
            lines += [entry["status"], ""]
        if name in ("doctor", "bench") and result.get("text"):
            lines += ["```text", result["text"].rstrip(), "```"]
        elif name == "train" and "rows" in result:
            lines += ([result["warm_line"], ""] if result.get("warm_line") else []) + train_table(result)
        elif name == "extend" and "peak_bytes" in result:
            lines += extend_lines(result, report["mode"] != "gpu")
    left_out = skipped(report, report["lengths"])
    lines += ["", "## Skipped", ""] + ([f"- {line}" for line in left_out] or ["nothing"])
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path) -> None:
    write_atomic(out / "gpu-check.md", render(report))
    write_atomic(out / "gpu-check.json", json.dumps(report, indent=2, default=str) + "\n")
