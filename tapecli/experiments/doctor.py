"""`tape doctor`: what this machine offers, which attention path each PE takes on it, and a self-check per PE.

    report = run_doctor(device="auto")      # prints; returns {"environment": ..., "checks": {pe: {...}}}

The environment: Python, torch, CUDA and the GPU's name, bf16 support, the optional kernels (flash-attn, fla,
triton), whether torch.compile works here (a tiny function is really compiled) and the Hugging Face classes
tape imports and exports (tapecli.model.hf.arch). Then one line per PE: the
attention paths a training step and an evaluation forward take on the device (`tapecli.model.attention`), and four
checks of `tape pe check` (tapecli.pe.check, their one owner) on the device, with the same tiny
trained-like models:

  dense            fp32 on the device vs the fp64 CPU reference with every score materialised, outputs and
                   gradients (the number: the largest relative difference)
  kv-cache         cached greedy decoding == the full forward, step by step
  chunked-prefill  a prompt prefilled in chunks == the full forward
  finite           a training step in fp32 and under bf16 autocast has finite logits and gradients

and the same checks of hybrid layouts (HYBRID_CHECKS: 4 layers, sliding windows shorter than the batch,
temperatures, length scales, several PEs in one model, the NoPE layers, biases and QK-norm of imported SmolLM3 and
Qwen models).

A check that fails marks its line and makes the command exit with 1; a PE whose check raises gets one line,
"failed: <the error>", and the other PEs are still checked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import platform
import time

import torch
from rich.console import Console

from tapecli import threads
from tapecli.experiments.pe_specs import parse_pe_spec
from tapecli.faults import failure_line
from tapecli.model import PE_NAMES
from tapecli.pe.check import DOCTOR_CHECKS, Outcome, Subject, run_check
from tapecli.pe.check.subject import SIZE_TEXT
from tapecli.runtime import resolve_device

# Hybrid layouts every `tape doctor` checks (4 layers; windows of 16 keys, shorter than the checks' sequences); two
# gate each head's attention output (model.output_gate), over bias PEs and over PEs with wide values or their own
# attention; the bias layers' ALiBi and T5 layers have attention sinks (model.sinks: the chunked path on a CPU,
# FlexAttention with its log-sum-exp on a GPU).
HYBRID_CHECKS: dict[str, dict] = {
    "irope": {"pe": "rope", "temperature": 0.9, "schedule": {
        "pattern": ["local", "local", "local", "global"],
        "kinds": {"local": {"window": 16}, "global": {"pe": "nope", "length_scale": "llama4",
                                                       "length_scale_args": {"floor_scale": 8.0}}}}},
    "bias-mix": {"pe": "alibi", "output_gate": "headwise", "schedule": {
        "layers": ["alibi", "t5", "fire", "alibi"],
        "kinds": {"alibi": {"window": 16, "sinks": True}, "t5": {"pe": "t5", "temperature": 0.8, "sinks": True},
                  "fire": {"pe": "fire", "window": 16, "temperature": 1.2}}}},
    "state-mix": {"pe": "tape", "output_gate": "elementwise", "length_scale": "log",
                  "length_scale_args": {"length": 16}, "schedule": {
        "layers": ["tape", "cope", "local-tape", "path"],
        "kinds": {"local-tape": {"window": 16}, "cope": {"pe": "cope", "window": 16, "temperature": 0.9},
                  "path": {"pe": "path", "temperature": 1.1}}}},
    # What SmolLM3, Qwen2 and Qwen3 imports use: NoPE layers, windowed RoPE layers, q/k/v biases, QK-norm.
    "hf-hybrid": {"pe": "rope", "qk_norm": True, "qkv_bias": True, "schedule": {
        "pattern": ["local", "local", "local", "nope"], "kinds": {"local": {"window": 16}}}},
}


ENV_WIDTH = len("torch.compile")  # the longest name `environment` yields


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def compile_works(device: torch.device) -> str:
    """Compile and run a tiny function on `device`: 'works (N s)' or the first line of the error. On the device
    checked, not the CPU: a GPU machine's first C++ build of a CPU kernel can take minutes, and says nothing of
    its GPU (Triton) kernels."""
    start = time.perf_counter()
    try:
        fn = torch.compile(lambda x: torch.sin(x) * 2 + 1)
        x = torch.arange(8.0, device=device)
        if not torch.allclose(fn(x), torch.sin(x) * 2 + 1):
            return "wrong result"
    except Exception as e:  # noqa: BLE001 - the report names whatever broke
        return f"fails: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}"
    return f"works ({time.perf_counter() - start:.0f} s to compile a tiny function)"


def environment(device: torch.device, compile_check: bool = True):
    """(name, value) of the environment, one at a time (what takes time, such as the first compilation on a fresh
    machine, is printed after what came before it)."""
    yield "python", platform.python_version()
    yield "torch", torch.__version__
    yield "threads", threads.describe()
    if torch.cuda.is_available():
        yield "cuda", f"{torch.version.cuda} ({torch.cuda.device_count()} device(s))"
        yield "gpu", torch.cuda.get_device_name(device if device.type == "cuda" else 0)
        yield "bf16", "yes" if torch.cuda.is_bf16_supported() else "no"
    else:
        yield "cuda", "not available"
        yield "bf16", "CPU autocast (always available)"
    for name, package in (("flash-attn", "flash-attn"), ("fla", "flash-linear-attention"), ("triton", "triton")):
        yield name, package_version(package)
    yield "torch.compile", compile_works(device) if compile_check else "not checked"
    from tapecli.model.hf.arch import ARCHITECTURES

    yield "hf import", f"{', '.join(ARCHITECTURES)} (transformers {package_version('transformers')})"


def check_pe(pe: str, device: torch.device, keys: dict | None = None) -> dict:
    """DOCTOR_CHECKS of `tape pe check` for one PE spec (`tapecli.experiments.pe_specs`: a PE, optionally with
    pe_args, e.g. rope:fope=true; with further model `keys`: a hybrid layout) on `device`:
    {"paths", "checks": {name: Outcome}, "ok"}."""
    spec = parse_pe_spec(pe)
    subject = Subject(spec.pe, spec.args, device, keys={k: v for k, v in (keys or {}).items() if k != "pe"})
    outcomes = {name: run_check(name, subject) for name in DOCTOR_CHECKS}
    paths = outcomes["dense"].info.get("paths", {"train": [], "eval": []})
    return {"paths": paths, "checks": outcomes, "ok": all(o.ok for o in outcomes.values())}


def mark(outcome: Outcome) -> str:
    number = f" {outcome.number:.0e}" if outcome.name == "dense" and outcome.number is not None else ""
    return f"{outcome.name}{number} " + ("ok" if outcome.ok else "[red]FAILED[/]")


def timed_check(row: tuple[str, dict | None], device: torch.device) -> tuple[dict, float]:
    """`check_pe` of one row (its PE spec and further model keys) and the seconds it took (what a worker process of
    `run_doctor` returns)."""
    start = time.perf_counter()
    return check_pe(row[0], device, row[1]), time.perf_counter() - start


def one_compile_thread() -> None:
    """A worker's start: one CPU thread and one compile thread (the workers together fill the machine)."""
    import torch._inductor.config

    torch.set_num_threads(1)
    torch._inductor.config.compile_threads = 1


@contextlib.contextmanager
def checked_rows(rows: list[tuple[str, str, dict | None]], device: torch.device, processes: int):
    """An iterator of each row's (`check_pe` result, seconds), or the exception it raised, in the rows' order:
    computed here one after another, or with `processes` > 1 in that many spawned worker processes at once, each
    row's kernels compiled by its own worker; the workers are ended on leaving."""
    import multiprocessing

    items = [(pe, keys) for _, pe, keys in rows]
    check = functools.partial(timed_check, device=device)
    pool = None
    if processes > 1:
        pool = multiprocessing.get_context("spawn").Pool(min(processes, len(items)), initializer=one_compile_thread)
    try:
        results = pool.imap(check, items) if pool else map(check, items)  # both go on past an item that raised

        def each():
            for _ in items:
                try:
                    yield next(results)
                except Exception as e:  # noqa: BLE001 - handed to the caller as the row's outcome
                    yield e

        yield each()
    finally:
        if pool:  # (also when the doctor is stopped while rows are still being checked)
            pool.terminate()
            pool.join()


def run_doctor(device: str = "auto", pes: list[str] | None = None, hybrids: bool = True,
               compile_check: bool = True, processes: int = 1) -> dict:
    """Print the environment and the self-checks (module docstring); `compile_check`: compile a tiny function
    (seconds on a GPU machine, up to a minute on a loaded CPU; scripts/gpu-check.sh --cpu leaves it out);
    `processes` > 1: the rows are checked in that many worker processes at once (`checked_rows`; scripts/gpu-check.sh
    on a GPU, whose checks spend most of their time compiling FlexAttention's kernels), printed in order."""
    dev = resolve_device(device)
    console = Console()
    console.print(f"[bold]Environment[/] ({dev})")
    env = {}
    for key, value in environment(dev, compile_check):
        env[key] = value
        console.print(f"  {key:<{ENV_WIDTH}}  {value}")
    crowded = threads.busy()
    if crowded:
        console.print(f"[yellow]warning[/]: this machine is busy (load {crowded[0]:.1f} on {crowded[1]} cores): "
                      "other processes hold the CPU and every thread of a tape command waits for them at every op; "
                      f"while they run, use --threads 1 (or {threads.ENV}=1)", soft_wrap=True)
    console.print(f"\n[bold]self-check per PE[/] (`tape pe check`'s {', '.join(DOCTOR_CHECKS)} checks on {dev}: "
                  f"{SIZE_TEXT}, hybrids 4 layers; dense: the largest relative difference to the fp64 CPU reference)")
    checks = {}
    rows = [(pe, pe, None) for pe in pes or list(PE_NAMES)]
    if hybrids:
        rows += [(name, keys["pe"], keys) for name, keys in HYBRID_CHECKS.items()]
    width = max(8, max(len(name) for name, _, _ in rows) + 1)
    with checked_rows(rows, dev, processes) as outcomes:
        for (name, _, _), outcome in zip(rows, outcomes, strict=True):
            if isinstance(outcome, Exception):  # one PE's failure is its line; the others are still checked
                checks[name] = {"ok": False, "error": failure_line(outcome)}
                console.print(f"  {name + ':':<{width}} [red]failed[/]: {checks[name]['error']}", soft_wrap=True)
                continue
            r, seconds = outcome
            checks[name] = r
            train, evaluation = ", ".join(r["paths"]["train"]), ", ".join(r["paths"]["eval"])
            # "nope:" rather than "nope ": a line starting "tape " reads as a command line in the docs.
            console.print(f"  {name + ':':<{width}} train: {train:<20} eval: {evaluation:<13} "
                          + "  ".join(mark(o) for o in r["checks"].values()) + f"  {seconds:.1f} s", soft_wrap=True)
    failed = [name for name, r in checks.items() if not r["ok"]]
    console.print("all checks passed" if not failed else f"[red]failed: {', '.join(failed)}[/]")
    return {"environment": env, "checks": checks, "failed": failed}
