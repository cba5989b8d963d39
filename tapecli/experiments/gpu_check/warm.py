"""Compile ahead, in parallel: before a part of gpu-check times anything on a GPU, worker processes run what it will
time once, so that the kernels it compiles (FlexAttention's per PE, attention path and length; a torch.compile'd
model's) are in inductor's on-disk caches (its FX graph and AOTAutograd caches, Triton's kernels) when the part, one
process timing one variant after another, compiles them again: then a compilation is mostly cache lookups. Timings
are unaffected: every worker has ended before the part times anything.

    statuses = warm(jobs, until, processes)       # {label: "ok: 3 steps" | "failed: ..." | "not finished" | ...}
    summary(statuses, processes, seconds)         # one line: how many of each
    bench_jobs(variants, sizes, device)           # the bench's jobs: one per PE, every length (warm_job below)
    python -m tapecli.experiments.gpu_check.warm '<json job>'   # one worker: runs job["module"]'s warm_job(job)

A job is a JSON-able dict naming the module whose `warm_job(job)` the worker runs (this module's own for the bench,
train_speed's for the training part); it prints one JSON line per step, {"step", "ok"} or {"step",
"error"}. The bench's worker takes one PE (a `bench.bench_variants` entry) through the bench's lengths: at each, one
step on the PE's own path, then one forced onto each path of sizes["paths"] that applies (`bench.forced_applies`).
The workers and the timing process compile every shape statically (`static_shapes`: dynamo's automatic dynamic
shapes off), so that a graph, and so its cache entry, depends only on what is compiled, not on what the process
compiled before it (with them on, a PE compiled after another one, or at a second length, can trace a different
graph, which misses the cache). Up to `processes` workers run at once, sharing the machine's cores as inductor's
compile threads (at least one each) on one CPU thread each; a worker still running at `until` (time.monotonic()) is
killed ("not finished"), a job never reached is "not started".
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import subprocess
import sys
import time


def bench_jobs(variants: list, sizes: dict, device: str) -> dict[str, dict]:
    """One job per bench variant (module docstring); `sizes`: the bench's sizes (seq_lens, paths by length, model
    shape, precision)."""
    b = {**sizes, "paths": {str(k): list(v) for k, v in sizes.get("paths", {}).items()}}
    return {variant[0]: {"module": __name__, "variant": variant, "sizes": b, "device": device} for variant in variants}


def step_line(name: str, fn) -> bool:
    """Run fn() as one step of a worker: print its JSON line (module docstring); True when it ran."""
    from tapecli.faults import failure_line

    try:
        fn()
    except Exception as e:  # noqa: BLE001 - one step's failure is its line; the others still run
        print(json.dumps({"step": name, "error": failure_line(e)}), flush=True)
        return False
    print(json.dumps({"step": name, "ok": True}), flush=True)
    return True


def warm_job(job: dict) -> None:
    """The bench's worker: every step of one PE (module docstring)."""
    import torch

    from tapecli.experiments.bench import forced_applies, variant_spec
    from tapecli.experiments.bench_step import make_variant, train_step
    from tapecli.model import attention

    b, variant = job["sizes"], job["variant"]

    def run(spec: dict, taken: set[str]) -> None:
        model, batch, device = make_variant(spec)
        with attention.recording() as recorded:
            train_step(model, batch, b["precision"], device, spec.get("attention"))
        taken.update(recorded)

    with static_shapes():
        for seq_len in b["seq_lens"]:
            spec = variant_spec(variant, b["n_layers"], b["dim"], b["n_heads"], seq_len, b["batch_size"],
                                b["precision"], False, job["device"])
            natural: set[str] = set()  # the paths the PE takes by itself
            if not step_line(f"{variant[0]} at {seq_len}", functools.partial(run, spec, natural)):
                continue
            for path in b["paths"].get(str(seq_len), ()):
                if forced_applies(path, natural, torch.device(job["device"])):
                    step_line(f"{variant[0]} on {path} at {seq_len}",
                              functools.partial(run, {**spec, "attention": path}, set()))


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


def warm(jobs: dict[str, dict], until: float, processes: int) -> dict[str, str]:
    """Run the workers (module docstring), one per job (label -> job). Returns each job's status."""
    threads = max(1, (os.cpu_count() or 1) // max(1, min(processes, len(jobs))))
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(threads), "OMP_NUM_THREADS": "1"}
    statuses = dict.fromkeys(jobs, "not started")
    pending, running = list(jobs), {}
    try:
        while (pending or running) and time.monotonic() < until:
            while pending and len(running) < processes:
                label = pending.pop(0)
                running[label] = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(jobs[label])], env=env,
                                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                statuses[label] = "not finished"
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
    job = json.loads(sys.argv[1])
    importlib.import_module(job["module"]).warm_job(job)
