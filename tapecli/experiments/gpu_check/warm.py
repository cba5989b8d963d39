"""Compile ahead, in parallel: before the bench times anything on a GPU, worker processes run one training step of
each variant at each length, so that FlexAttention's kernels (compiled per PE, attention path and length) are in
inductor's on-disk caches (its FX graph and AOTAutograd caches, Triton's kernels) when the bench, one process timing
one variant after another, compiles them again: then a compilation is mostly cache lookups. Timings are
unaffected: every worker has ended before the bench times anything.

    statuses = warm(variants, sizes, device, until, processes)  # {label: "ok: 3 steps" | "failed: ..." | ...}
    summary(statuses, processes, seconds)                       # one line: how many of each
    python -m tapecli.experiments.gpu_check.warm '<json job>'   # one worker: one PE at every length

A worker takes one PE (a `bench.bench_variants` entry) through the bench's lengths: at each, one step on the PE's
own path, then one forced onto each path of sizes["paths"] that applies (`bench.forced_applies`), printing one JSON
line per step. The workers and the bench's process compile every shape statically (`static_shapes`: dynamo's
automatic dynamic shapes off), so that a graph, and so its cache entry, depends only on the PE, its path and the
length, not on what the process compiled before it (with them on, a PE compiled after another one, or at a second
length, can trace a different graph, which misses the cache). Up to `processes` workers run at once, each with one
compile thread and one CPU thread; a worker still running at `until` (time.monotonic()) is killed ("not finished"),
a PE never reached is "not started".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def run_job(job: dict) -> None:
    """The worker: every step of one PE (module docstring), one JSON line each: {"step", "ok"} or {"step", "error"}."""
    import torch

    from tapecli.experiments.bench import forced_applies, variant_spec
    from tapecli.experiments.bench_step import make_variant, train_step
    from tapecli.faults import failure_line
    from tapecli.model import attention

    b = job["sizes"]

    def step(spec: dict, name: str) -> list[str]:
        try:
            model, batch, device = make_variant(spec)
            with attention.recording() as taken:
                train_step(model, batch, b["precision"], device, spec.get("attention"))
            print(json.dumps({"step": name, "ok": True}), flush=True)
            return sorted(set(taken))
        except Exception as e:  # noqa: BLE001 - one step's failure is its line; the others still run
            print(json.dumps({"step": name, "error": failure_line(e)}), flush=True)
            return []

    variant = job["variant"]
    with static_shapes():
        for seq_len in b["seq_lens"]:
            spec = variant_spec(variant, b["n_layers"], b["dim"], b["n_heads"], seq_len, b["batch_size"],
                                b["precision"], False, job["device"])
            natural = step(spec, f"{variant[0]} at {seq_len}")
            for path in b["paths"].get(str(seq_len), ()) if natural else ():
                if forced_applies(path, set(natural), torch.device(job["device"])):
                    step({**spec, "attention": path}, f"{variant[0]} on {path} at {seq_len}")


def static_shapes():
    """Dynamo's automatic dynamic shapes off, as a context (module docstring)."""
    import torch._dynamo

    return torch._dynamo.config.patch(automatic_dynamic_shapes=False)


def outcome(output: str, code: int) -> str:
    """A finished worker's status from its JSON lines and exit code."""
    entries = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    errors = [f"{entry['step']}: {entry['error']}" for entry in entries if "error" in entry]
    if code != 0:
        errors.append(f"the worker ended with exit code {code}")
    return f"ok: {len(entries)} steps" if not errors else "failed: " + "; ".join(errors)


def warm(variants: list, sizes: dict, device: str, until: float, processes: int) -> dict[str, str]:
    """Run the workers (module docstring); `sizes`: the bench's sizes (seq_lens, paths by length, model shape,
    precision). Returns each variant's status."""
    b = {**sizes, "paths": {str(k): list(v) for k, v in sizes.get("paths", {}).items()}}
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"}
    statuses = {variant[0]: "not started" for variant in variants}
    pending, running = list(variants), {}
    try:
        while (pending or running) and time.monotonic() < until:
            while pending and len(running) < processes:
                variant = pending.pop(0)
                job = json.dumps({"variant": variant, "sizes": b, "device": device})
                running[variant[0]] = subprocess.Popen([sys.executable, "-m", __name__, job], env=env, text=True,
                                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                statuses[variant[0]] = "not finished"
            for label, process in list(running.items()):
                if process.poll() is not None:
                    statuses[label] = outcome(process.stdout.read(), process.returncode)
                    del running[label]
            time.sleep(0.1)
    finally:  # (also when the part is stopped at its budget)
        for process in running.values():
            process.kill()
            process.wait()
    return statuses


def summary(statuses: dict[str, str], processes: int, seconds: float) -> str:
    counts = {kind: sum(status.startswith(kind) for status in statuses.values())
              for kind in ("ok", "failed", "not finished", "not started")}
    return (f"compiled ahead in {processes} processes ({seconds:.0f} s): "
            + ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
            + "".join(f"; {label}: {status}" for label, status in statuses.items() if status.startswith("failed")))


if __name__ == "__main__":
    run_job(json.loads(sys.argv[1]))
