"""`tape bench`: one training step (forward + backward) per PE, its time and its peak memory, as ratios to RoPE,
at each sequence length (one table per length).

Every variant is built with the same seed and fed the same batch. Times: all variants live in this process and are
interleaved round by round, so slow drift of the machine (thermal, other processes) hits all of them alike; each
time is a median. Peak memory: on the CPU one child process per variant and length (bench_step.py), so one PE's
allocations never count against another's: the growth of the resident peak during one step; on CUDA the growth of
`torch.cuda.max_memory_allocated` during one step, in this process (the allocator counts tensors, not processes).
The attention path each variant took (`attention.plan`) is printed beside it. A variant that fails (building it, a
step, its child process) gets one row, "failed: <the error>"; the others are still timed, and `failed` in the
result lists it (the command then exits with 1).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from tapecli import threads
from tapecli.errors import TapeError
from tapecli.experiments.bench_step import cuda_peak, make_variant, train_step
from tapecli.experiments.pe_specs import parse_pe_specs
from tapecli.faults import failure_line, note_memory_use
from tapecli.files import write_atomic
from tapecli.model import ModelConfig, attention
from tapecli.runtime import resolve_device
from tapecli.store.run import check_output

PRECISIONS = ("fp32", "bf16")


def bench_variants(pes: list[str], tape_paths: bool, window: int | None = None,
                   hybrids: tuple[str, ...] = (), n_layers: int | None = None) -> list[tuple[str, str, dict, dict]]:
    """(label, pe, pe_args, further model keys) for each PE spec (`tapecli.experiments.pe_specs`: a PE, optionally
    with pe_args, e.g. rope:hope=true), RoPE always included as the reference; with a `window`, each PE that takes
    one again with every layer local ("rope, window 1024"); then each named hybrid layout
    (tapecli.experiments.hybrids; its local layers get `window`, 1024 by default; its pattern cut to `n_layers`)."""
    from tapecli.experiments.hybrids import hybrid_keys
    from tapecli.model.schedule import draws_positions, pe_class

    if window is not None and window < 1:
        raise TapeError(f"--window must be a positive number of keys, got {window}")
    variants = [("rope", "rope", {}, {})]
    for spec in parse_pe_specs(pes):
        if spec.text == "rope":
            continue
        if spec.text == "tape" and tape_paths:
            variants += [("tape (separate)", "tape", {"aggregation": "separate"}, {}),
                         ("tape (concat)", "tape", {"aggregation": "concat"}, {})]
        else:
            variants.append((spec.label, spec.pe, spec.args, {}))
    if window is not None:
        variants += [(f"{label}, window {window}", pe, args, {"window": window}) for label, pe, args, _ in variants
                     if "window" in pe_class(pe).attention_options and not draws_positions(pe)]
    for name in hybrids:
        keys = hybrid_keys(name, window or 1024, n_layers)
        variants.append((name, keys.pop("pe"), keys.pop("pe_args", {}), keys))
    return variants


def variant_spec(variant: tuple[str, str, dict, dict], n_layers: int, dim: int, n_heads: int, seq_len: int,
                 batch_size: int, precision: str, compile: bool, device) -> dict:
    """The `bench_step` spec of one `bench_variants` entry at one length."""
    _, pe, pe_args, keys = variant
    return {"pe": pe, "pe_args": pe_args, "model": keys, "n_layers": n_layers, "dim": dim, "n_heads": n_heads,
            "seq_len": seq_len, "batch_size": batch_size, "precision": precision, "compile": compile,
            "device": str(device)}


def check_variants(variants: list[tuple[str, str, dict, dict]], n_heads: int, dim: int, seq_len: int) -> None:
    """Every variant's model can be built (its pe_args' values checked by its PE), before any is timed."""
    for label, pe, pe_args, keys in variants:
        try:
            ModelConfig(vocab_size=8, dim=dim, n_layers=len(keys["schedule"]["pattern"]) if "schedule" in keys else 1,
                        n_heads=n_heads,
                        max_seq_len=seq_len, pe=pe, pe_args=pe_args, **keys)
        except ValueError as e:
            raise TapeError(f"--pe {label}: {e}") from None


def check_options(n_layers: int, dim: int, n_heads: int, seq_lens: list[int], batch_size: int, steps: int,
                  warmup: int, rounds: int, precision: str = "fp32") -> None:
    """Every option names its own problem, before any model is built."""
    for option, value in [("--n-layers", n_layers), ("--dim", dim), ("--n-heads", n_heads),
                          ("--batch-size", batch_size), ("--steps", steps), ("--rounds", rounds)]:
        if value <= 0:
            raise TapeError(f"{option} must be a positive integer, got {value}")
    if warmup < 0:
        raise TapeError(f"--warmup must be >= 0, got {warmup}")
    if dim % n_heads:
        raise TapeError(f"--n-heads {n_heads} does not divide --dim {dim}")
    if precision not in PRECISIONS:
        raise TapeError(f"--precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not seq_lens or min(seq_lens) < 1:
        raise TapeError(f"--seq-len: expected positive lengths, got {seq_lens}")


def time_steps(model: torch.nn.Module, batch: torch.Tensor, steps: int, precision: str,
               device: torch.device, path: str | None = None, cpu: list[float] | None = None) -> list[float]:
    """Wall time of each of `steps` steps; `cpu`: also append this process's CPU time of each step to it."""
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start, cpu_start = time.perf_counter(), time.process_time()
        train_step(model, batch, precision, device, path)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - cpu_start)
        model.zero_grad(set_to_none=True)
    return times


def child_memory(spec: dict) -> dict:
    """Peak memory of one step of `spec`, measured in a child process: {"peak_bytes", "paths"} or {"error"}."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, "-m", "tapecli.experiments.bench_step", json.dumps(spec)],
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        reason = "killed (out of memory?)" if proc.returncode < 0 else (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": reason}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_bench(pes: list[str], n_layers: int, dim: int, n_heads: int, seq_lens: list[int], batch_size: int,
              steps: int, warmup: int, rounds: int, tape_paths: bool, device: str, precision: str = "fp32",
              compile: bool = False, memory: bool = True, out: Path | None = None, window: int | None = None,
              hybrids: tuple[str, ...] = (), paths: tuple[str, ...] = (), deadline: float | None = None) -> dict:
    """Time and measure every variant at every length (module docstring); `paths` and `deadline` as in
    `bench_length` (scripts/gpu-check.sh uses them: each attention path a PE can take, within a time budget)."""
    check_options(n_layers, dim, n_heads, seq_lens, batch_size, steps, warmup, rounds, precision)
    if out is not None:
        check_output(out, file=True)
    dev = resolve_device(device)
    console = Console()
    variants = bench_variants(pes, tape_paths, window, hybrids, n_layers)
    check_variants(variants, n_heads, dim, max(seq_lens))
    warmup = max(warmup, 1) if compile else warmup  # the first compiled step compiles
    note_memory_use(f"{len(variants)} models of {n_layers} layers x dim {dim} ({batch_size} x {max(seq_lens)} "
                    "tokens per step)", "lower --batch-size or --seq-len, or time fewer --pe at once")
    console.print(f"[bold]Benchmark[/]: {n_layers} layers, dim {dim}, {n_heads} heads, batch {batch_size}, "
                  f"{precision}{', compiled' if compile else ''}, {dev} ({threads.describe()}, torch "
                  f"{torch.__version__}), {rounds} rounds x {steps} steps after {warmup} warm-up")
    result = {"settings": {"n_layers": n_layers, "dim": dim, "n_heads": n_heads, "seq_lens": seq_lens,
                           "batch_size": batch_size, "steps": steps, "warmup": warmup, "rounds": rounds,
                           "precision": precision, "compile": compile, "device": str(dev), "window": window,
                           "hybrids": list(hybrids),
                           "threads": torch.get_num_threads(), "torch": torch.__version__},
              "lengths": {}}
    for seq_len in seq_lens:
        specs = {variant[0]: variant_spec(variant, n_layers, dim, n_heads, seq_len, batch_size, precision, compile,
                                          dev) for variant in variants}
        result["lengths"][str(seq_len)] = bench_length(specs, steps, warmup, rounds, memory, console, paths, deadline)
    result["failed"] = sorted({label for entry in result["lengths"].values() for label in entry["failed"]})
    result["skipped"] = {length: entry["skipped"] for length, entry in result["lengths"].items() if entry["skipped"]}
    if any("flex" in paths for entry in result["lengths"].values() for paths in entry["paths"].values()):
        # One compiled FlexAttention kernel serves every layer: the count grows with PEs and shapes, not layers.
        result["compiled_graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        console.print(f"FlexAttention: {result['compiled_graphs']} graphs compiled in this process, for "
                      f"{len(variants)} variants of {n_layers} layers")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")
    if result["failed"]:
        console.print(f"[red]failed: {', '.join(result['failed'])}[/]")
    return result


def forced_applies(path: str, natural: set[str], device: torch.device) -> bool:
    """Whether a variant whose steps took the attention paths `natural` can be forced onto `path` as well: not a PE
    with attention of its own (CoPE, PaTH, FoX, ...: they ignore a forced path), not the path it already takes;
    sdpa / flash-attn only for plain q.k PEs (forced on a bias they would materialise it: that is `dense`), dense
    only for bias PEs; flex on CUDA, chunked on the CPU, flash-attn where it is installed."""
    from tapecli.model.attention import chunked as chunked_path
    from tapecli.model.attention import flex as flex_path
    from tapecli.model.attention.dense import flash_attn_applies

    if path in natural or not natural <= set(attention.PATHS):
        return False
    if path in ("sdpa", "flash-attn"):
        plain = natural <= {"sdpa", "flash-attn"}
        return plain and (path == "sdpa" or flash_attn_applies(device.type, torch.bfloat16))
    if path == "flex":
        return device.type == "cuda" and flex_path.flex_available()
    if path == "chunked":
        return device.type == "cpu" and chunked_path.kernel_available()
    # dense: a materialised bias; without one (plain or wide-value PEs) it is SDPA's own causal call again.
    return path == "dense" and bool(natural & {"chunked", "flex"})


def bench_length(specs: dict[str, dict], steps: int, warmup: int, rounds: int, memory: bool,
                 console: Console, paths: tuple[str, ...] = (), deadline: float | None = None) -> dict:
    """Time (interleaved, this process) and peak memory (child processes on the CPU, `cuda_peak` in this process on
    CUDA) of every variant at one length. `paths`: each variant is also timed forced onto each of these attention
    paths where that applies (`forced_applies`), as "label on path". `deadline` (time.monotonic()): no variant is
    built and no round started after it; what was left out is listed in "skipped"."""
    seq_len, batch_size, precision = (next(iter(specs.values()))[k] for k in ("seq_len", "batch_size", "precision"))
    peaks: dict[str, dict] = {}
    samples: dict[str, list[float]] = {}
    cpu_samples: dict[str, list[float]] = {}  # CPU time per step: with one thread, the work, whatever else runs
    taken_paths: dict[str, list[str]] = {}
    failures: dict[str, str] = {}
    skipped: list[str] = []
    rows: dict[str, dict] = {}  # every variant in table order, forced ones after the one they force

    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline

    def build(label: str, spec: dict) -> tuple | None:
        if late():
            skipped.append(label)
            return None
        try:
            model, batch, dev = make_variant(spec)
            with attention.recording() as taken:  # at least one warm-up step, which names the attention path
                time_steps(model, batch, max(warmup, 1), precision, dev, spec.get("attention"))
            if memory and dev.type == "cuda":
                peaks[label] = {"peak_bytes": cuda_peak(model, batch, precision, dev, spec.get("attention"))}
        except Exception as e:  # noqa: BLE001 - one variant's failure is its row; the others still run
            failures[label] = failure_line(e)
            return None
        taken_paths[label] = sorted(set(taken))
        samples[label], cpu_samples[label] = [], []
        return model, batch, dev

    with console.status("...") as status:
        models = {}
        for label, spec in specs.items():
            status.update(f"T = {seq_len}: building and warming up {label}")
            rows[label] = spec
            if (built := build(label, spec)) is not None:
                models[label] = built
            for path in paths:
                if label not in taken_paths or not forced_applies(path, set(taken_paths[label]), built[2]):
                    continue
                forced_label, forced_spec = f"{label} on {path}", {**spec, "attention": path}
                rows[forced_label] = forced_spec
                status.update(f"T = {seq_len}: building and warming up {forced_label}")
                if (built_forced := build(forced_label, forced_spec)) is not None:
                    models[forced_label] = built_forced
        if memory:
            for label, spec in rows.items():
                if label in models and not spec["device"].startswith("cuda"):
                    status.update(f"T = {seq_len}: peak memory of {label} (child process)")
                    peaks[label] = child_memory(spec)
        for r in range(rounds):
            if r and late():
                break
            for label, (model, batch, dev) in list(models.items()):
                status.update(f"T = {seq_len}, round {r + 1}/{rounds}: {label}")
                try:
                    samples[label] += time_steps(model, batch, steps, precision, dev, rows[label].get("attention"),
                                                 cpu_samples[label])
                except Exception as e:  # noqa: BLE001
                    failures[label] = failure_line(e)
                    del models[label]
    medians = {label: statistics.median(t) for label, t in samples.items() if label not in failures and t}
    peak_bytes = {label: peaks.get(label, {}).get("peak_bytes") for label in rows}
    cpu_medians = {label: statistics.median(cpu_samples[label]) for label in medians}
    reference, reference_peak = medians.get("rope"), peak_bytes.get("rope")
    # One thread on the CPU: the process's CPU time per step is the step's own work, however busy the machine (its
    # wall time also counts the time other processes held the core), so its ratio is the one to compare there.
    one_thread = next(iter(specs.values()))["device"] == "cpu" and torch.get_num_threads() == 1
    cpu_reference = cpu_medians.get("rope")
    table = Table(title=f"T = {seq_len}: training step (forward + backward), median")
    columns = ["PE", "attention", "ms / step", "tokens / s", "time / RoPE", "peak MB", "memory / RoPE"]
    columns[5:5] = ["CPU time / RoPE"] if one_thread else []
    for column in columns:
        table.add_column(column, justify="left" if column in ("PE", "attention") else "right")
    for label in rows:
        peak = peak_bytes[label]
        if peak is None:
            peak_cells = ["-", "-"] if label not in peaks else [peaks[label]["error"], "-"]
        else:
            peak_cells = [f"{peak / 2**20:,.0f}", f"{peak / reference_peak:.2f}" if reference_peak else "-"]
        dashes = ["-"] * (4 if one_thread else 3)
        if label in failures:
            table.add_row(label, f"[red]failed[/]: {failures[label]}", *dashes, *peak_cells)
            continue
        if label in skipped:
            table.add_row(label, "skipped: time budget", *dashes, *peak_cells)
            continue
        median = medians[label]
        cpu_cell = [f"{cpu_medians[label] / cpu_reference:.2f}" if cpu_reference else "-"] if one_thread else []
        table.add_row(label, ", ".join(taken_paths[label]) or "-", f"{1000 * median:.1f}",
                      f"{batch_size * seq_len / median:,.0f}", f"{median / reference:.2f}" if reference else "-",
                      *cpu_cell, *peak_cells)
    console.print(table)
    for label, reason in failures.items():  # in full, whatever the table's width did to the row
        console.print(f"{label}: failed: {reason}", soft_wrap=True)
    return {"median_step_s": medians,
            "ratio_to_rope": {k: v / reference for k, v in medians.items()} if reference else {},
            "median_cpu_s": cpu_medians,
            "cpu_ratio_to_rope": {k: v / cpu_reference for k, v in cpu_medians.items()} if cpu_reference else {},
            "peak_bytes": peak_bytes,
            "memory_ratio_to_rope": {k: (v / reference_peak if v is not None and reference_peak else None)
                                     for k, v in peak_bytes.items()},
            "paths": taken_paths,
            "skipped": skipped,
            "failed": {**{label: f"peak memory: {peak['error']}" for label, peak in peaks.items() if "error" in peak},
                       **failures}}


def pe_speed_rows(pe: str, label: str, pe_args: dict, device: str, lengths: list[int], console: Console) -> None:
    """`tape pe check`'s speed lines: the PE's training step time and peak memory vs RoPE at each length (`label`
    names it; a 2-layer, 256-wide model in fp32 on `device`), measured by `bench_length`."""
    label = "rope (the PE)" if label == "rope" else label
    for seq_len in lengths:
        common = {"n_layers": 2, "dim": 256, "n_heads": 4, "seq_len": seq_len, "batch_size": 1, "precision": "fp32",
                  "compile": False, "device": device}
        specs = {"rope": {"pe": "rope", "pe_args": {}, **common},
                 label: {"pe": pe, "pe_args": pe_args, **common}}
        result = bench_length(specs, steps=3, warmup=1, rounds=2, memory=True, console=console)
        memory = result["memory_ratio_to_rope"][label]
        console.print(f"speed at T = {seq_len}: {result['ratio_to_rope'][label]:.2f}x RoPE's step time, "
                      + (f"{memory:.2f}x its peak memory" if memory is not None else "peak memory not measured")
                      + " (2 layers, dim 256, fp32; `tape bench` for more)", markup=False, highlight=False)
