"""`scripts/gpu-check.sh`: speed and memory evidence for one GPU within eight minutes, written as one Markdown page.

    python -m tapecli.experiments.gpu_check [--cpu] [--out DIR] [--budget-scale X] [--parts P,..] [--pe PE,..]

Four parts, each with a time budget (PARTS; GPU sizes in GPU, the --cpu mode's toy sizes in CPU):

  doctor   `tape doctor` on the device (tapecli.experiments.doctor), its checks in PROCESSES worker processes at once
           on the GPU (--cpu: CPU_DOCTOR_PES only, one after another, no compilation)
  bench    `tape bench --precision bf16` for every registered PE at 1K, 8K and 32K tokens, each PE also forced onto
           every other attention path it can take (flash-attn, sdpa, flex, dense; `bench.forced_applies`), time and
           peak memory as ratios to RoPE on its own path (FlashAttention-2 where installed, else SDPA); on the GPU
           its kernels are first compiled ahead by parallel workers (warm.py) in WARM_SHARE of its time
  train    tokens/s and MFU of the `c4` recipe's 162M model for RoPE, TAPE, ALiBi and FIRE, eager and compiled,
           beside transformers' Llama of the same shape (train_speed.py); on the GPU each variant's first step (which
           compiles) is first run ahead by parallel workers (warm.py), in at most WARM_SHARE of its time
  extend   one `tape extend-context --method lora` step with activation checkpointing on a random ~1.1B Llama at
           8K tokens: peak memory, step time, the prediction for a 7B base (extend_step.py)

Each part runs in a child process of its own (isolate.py: spawned on the GPU, so that it starts with a fresh CUDA
and inductor state whatever the part before it left behind; forked in --cpu mode, which imports PRELOAD once, here)
under its budget: it starts no new variant past its soft deadline (80 % of the budget) and is stopped by SIGALRM at
the budget, keeping what it finished; a child with no answer isolate.GRACE_S seconds after its budget is killed with
everything it started, one that crashes is reported failed. This process compiles and measures nothing; it prints
the parts' log lines as they come, and what a part left out is named on the page and printed at the end. --parts
runs some of the parts (each with its own budget), --pe some of the PEs (doctor's self-checks, the bench, training):
RoPE stays in the bench and in training as the reference their ratios need. The page is rewritten (atomically) after
every part, so a run killed from outside keeps what it finished. The --cpu mode runs the same parts at toy sizes in
seconds, on one thread (its compiled variants through dynamo's eager backend: inductor on a CPU takes minutes); the
test suite runs it in the suite's own process (`__main__.main`), which leaves that process as it found it (thread
count, COLUMNS, the garbage collector).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import io
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from unittest import mock

from tapecli.errors import TapeError
from tapecli.experiments.gpu_check import isolate

BUDGETS = {"doctor": 90, "bench": 170, "train": 150, "extend": 40}  # seconds on the GPU, 450 in all
CPU_BUDGETS = {"doctor": 8, "bench": 10, "train": 8, "extend": 8}
TRAIN_PES = ("rope", "tape", "alibi", "fire")
PROCESSES = 12  # GPU: worker processes at once for the doctor's checks and the compilations ahead (16 cores)
PRECISION = "bf16"  # the bench's, on the GPU and in --cpu mode alike (its workers compile for the same)
WARM_SHARE = 0.5  # of the bench's and training's time, at most, for compiling ahead in parallel (GPU: warm.py)
CPU_DOCTOR_PES = ("rope", "alibi", "tape")  # --cpu: a plain, a bias and a wide-value PE; no compile, no hybrids
# The bench's lengths in the order they run: 8K first (where attention's cost shows, and where the kernels compile),
# 32K, then 1K (a step of the bench model at 1K is kernel launches more than arithmetic on a GPU).
GPU = {
    "bench": {"seq_lens": [8192, 32768, 1024], "n_layers": 2, "dim": 256, "n_heads": 4, "batch_size": 1,
              "steps": 2, "rounds": 2, "warmup": 1, "memory": True, "warm_processes": PROCESSES,
              "paths": {1024: ("flash-attn", "sdpa", "flex", "dense"), 8192: ("flash-attn", "sdpa", "flex", "dense"),
                        32768: ("flash-attn", "sdpa", "flex")}},
    "train": {"overrides": [], "batch": 8, "warmup": 2, "steps": 5, "compile_backend": None, "compile_others": True,
              "warm_processes": 8},  # (fewer than the bench's: each holds a 162M model's training step on the GPU)
    "extend": {"llama": {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
                         "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
                         "max_position_embeddings": 4096}, "target": 8192},
}
CPU = {
    "bench": {"seq_lens": [32, 64], "n_layers": 1, "dim": 32, "n_heads": 2, "batch_size": 1, "steps": 1,
              "rounds": 1, "warmup": 0, "memory": False, "paths": {32: ("sdpa", "chunked", "dense")}},
    "train": {"overrides": ["model.n_layers=1", "model.dim=32", "model.n_heads=2", "model.ffn_dim=64",
                            "model.vocab_size=256", "model.max_seq_len=32", "data.seq_len=32"],
              "batch": 2, "warmup": 2, "steps": 1, "compile_backend": "eager", "compile_others": False},
    "extend": {"llama": {"vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32},
               "target": 64},
}


def commit() -> str:
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" with uncommitted changes" if dirty else "")


def hardware(device) -> str:
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    name = platform.machine()
    with contextlib.suppress(OSError):
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        name = names[0] if names else name
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    return f"{name} ({platform.machine()}), {os.cpu_count()} cores, {memory:.0f} GiB, load average {load:.1f}"


class LineLog(io.StringIO):
    """A captured stdout that also hands each complete line to `log` as it is written (so a part killed at its
    deadline has shown what it printed, and each line is seen when it happens)."""

    def __init__(self, log) -> None:
        super().__init__()
        self.log, self.pending = log, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.log(line)
        return super().write(text)

    def finish(self) -> None:
        if self.pending:
            self.log(self.pending)
            self.pending = ""


def captured(fn, log, result: dict):
    """Run fn() with stdout captured (rich prints to it); each line goes to `log` as it is written, the whole text
    is appended to result["text"] (also when fn is stopped), and fn's value returned."""
    stream = LineLog(log)
    try:
        # rich's tables, not a terminal: 160 columns, wide enough for every column (unless the user set COLUMNS)
        columns = {"COLUMNS": os.environ.get("COLUMNS", "160")}
        with contextlib.redirect_stdout(stream), mock.patch.dict(os.environ, columns):
            return fn()
    finally:
        stream.finish()
        result["text"] = result.get("text", "") + stream.getvalue()


def doctor_part(cpu: bool, sizes: dict, chosen: list[str] | None, device, _deadline, result: dict, log) -> None:
    from tapecli.experiments import doctor

    pes = chosen if chosen else list(CPU_DOCTOR_PES) if cpu else None
    report = captured(lambda: doctor.run_doctor(device.type, pes, hybrids=not cpu, compile_check=not cpu,
                                                processes=1 if cpu else PROCESSES), log, result)
    result["failed"] = report["failed"]


def compile_ahead(jobs: dict[str, dict], processes: int, deadline: float, result: dict, log) -> None:
    """The first WARM_SHARE of a part's time (at most): its compilations, ahead, in `processes` workers (warm.py);
    their statuses and summary line go into `result` ("warm", "warm_line") and the log."""
    from tapecli.experiments.gpu_check import warm

    start = time.monotonic()
    statuses = warm.warm(jobs, start + WARM_SHARE * (deadline - start), processes)
    line = warm.summary(statuses, processes, time.monotonic() - start)
    log(line)
    result |= {"warm": statuses, "warm_line": line}


def bench_part(_cpu: bool, sizes: dict, chosen: list[str] | None, device, deadline, result: dict, log) -> None:
    import torch._dynamo

    from tapecli.experiments import bench
    from tapecli.experiments.gpu_check import warm
    from tapecli.model import PE_NAMES

    pes = chosen or list(PE_NAMES)  # (the bench always adds RoPE, its reference)
    b = sizes["bench"]
    result |= {"lengths": {}, "skipped": {}}
    if b.get("warm_processes"):
        jobs = warm.bench_jobs(bench.bench_variants(pes, tape_paths=False), {**b, "precision": PRECISION}, device.type)
        compile_ahead(jobs, b["warm_processes"], deadline, result, log)
        result["text"] = result["warm_line"] + "\n"
    for i, seq_len in enumerate(b["seq_lens"]):
        # Each length may use an equal share of what is left of the soft deadline (what an earlier one leaves
        # unused goes to the ones after it); it starts with no compiled graph of an earlier length (dynamo's count
        # of FlexAttention's variants restarts), and compiles its shapes statically, as the workers did.
        share = time.monotonic() + (deadline - time.monotonic()) / (len(b["seq_lens"]) - i)
        torch._dynamo.reset()
        with warm.static_shapes():
            bench_result = captured(lambda seq_len=seq_len, share=share: bench.run_bench(
                pes, b["n_layers"], b["dim"], b["n_heads"], [seq_len], b["batch_size"], b["steps"],
                b["warmup"], b["rounds"], tape_paths=False, device=device.type, precision=PRECISION,
                memory=b["memory"], paths=b["paths"].get(seq_len, ()), deadline=share), log, result)
        result["lengths"] |= bench_result["lengths"]
        result["skipped"] |= bench_result["skipped"]


def train_part(_cpu: bool, sizes: dict, chosen: list[str] | None, device, deadline, result: dict, log) -> None:
    from tapecli.experiments.gpu_check import train_speed

    t, pes = sizes["train"], train_pes(chosen)
    if t.get("warm_processes"):
        compile_ahead(train_speed.warm_jobs(pes, t, device.type), t["warm_processes"], deadline, result, log)
    train_speed.train_speed(device, t, pes, deadline, result, log)


def extend_part(_cpu: bool, sizes: dict, _chosen, device, _deadline, result: dict, log) -> None:
    from tapecli.experiments.gpu_check import extend_step

    with tempfile.TemporaryDirectory(prefix="tape-gpu-check-") as work:
        result |= captured(lambda: extend_step.extend_step(device, sizes["extend"], Path(work)), log, {})


def train_pes(chosen: list[str] | None) -> tuple[str, ...]:
    """The training part's PEs among those chosen (None: all), RoPE always first: the one compared with the Llama."""
    return tuple(pe for pe in TRAIN_PES if chosen is None or pe == "rope" or pe in chosen)


def choice(text: str | None, allowed, what: str) -> list[str] | None:
    """A comma-separated --parts / --pe value as a list (None: all), each name checked against `allowed`."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in allowed]
    if unknown or not names:
        raise TapeError(f"--{what} {text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; choose from "
                        + ", ".join(allowed))
    return names


PARTS = {"doctor": doctor_part, "bench": bench_part, "train": train_part, "extend": extend_part}
# What the parts import (seconds each on a CPU): the --cpu mode imports it once, before its parts are forked.
PRELOAD = ("tapecli.experiments.doctor", "tapecli.experiments.bench", "tapecli.experiments.gpu_check.train_speed",
           "tapecli.experiments.gpu_check.extend_step", "tapecli.train.engine", "torch._dynamo",
           "transformers.models.llama.modeling_llama")


def run_gpu_check(cpu: bool, out: Path, budget_scale: float = 1.0, log=print, parts: str | None = None,
                  pes: str | None = None) -> dict:
    """Run the parts (module docstring) and write out/gpu-check.md and out/gpu-check.json; returns the report.
    `budget_scale` multiplies every part's budget (a slower GPU than an H100, a loaded CPU); `parts` and `pes`:
    the --parts and --pe values (comma-separated names; None: all)."""
    if not budget_scale > 0:
        raise TapeError(f"--budget-scale must be a positive number, got {budget_scale}")
    run_parts = choice(parts, list(PARTS), "parts") or list(PARTS)
    import torch

    from tapecli.experiments.gpu_check import page
    from tapecli.model import PE_NAMES
    from tapecli.runtime import resolve_device

    chosen = choice(pes, PE_NAMES, "pe")
    if not cpu and not torch.cuda.is_available():
        raise TapeError("gpu-check: no CUDA device here; pass --cpu for the toy-size run on the CPU")
    sizes, budgets = (CPU, CPU_BUDGETS) if cpu else (GPU, BUDGETS)
    budgets = {name: budget * budget_scale for name, budget in budgets.items()}
    device = resolve_device("cpu" if cpu else "cuda")
    out.mkdir(parents=True, exist_ok=True)
    report = {"mode": "cpu (toy sizes)" if cpu else "gpu", "commit": commit(), "hardware": hardware(device),
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "pes": chosen or list(PE_NAMES), "lengths": {"bench": sizes["bench"]["seq_lens"]}, "parts": {}}
    threads = torch.get_num_threads()
    if cpu:  # imported once here, where the forked parts share them
        for module in PRELOAD:
            importlib.import_module(module)
        gc.freeze()  # the children's collections leave these objects alone (no copy-on-write of every page)
        torch.set_num_threads(1)  # toy sizes: a second thread only waits at every op's barrier (more so under load)
    started = time.monotonic()
    try:
        for name in run_parts:
            log(f"== {name} (budget {budgets[name]:.0f} s)")
            part = functools.partial(PARTS[name], cpu, sizes, chosen, device)
            report["parts"][name] = isolate.run_part(name, budgets[name], part, log, "fork" if cpu else "spawn")
            report["seconds"] = time.monotonic() - started
            page.write(report, out)
    finally:  # (for a process that goes on, a test's)
        gc.unfreeze()
        torch.set_num_threads(threads)
    report["skipped"] = page.skipped(report, report["lengths"])
    log(f"gpu-check: {report['seconds']:.0f} s in all; wrote {out / 'gpu-check.md'}")
    log("skipped: " + ("; ".join(report["skipped"]) if report["skipped"] else "nothing"))
    page.write(report, out)
    return report
