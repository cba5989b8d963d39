"""`tape doctor`: what this machine offers, which attention path each PE takes on it, and a self-check per PE.

    report = run_doctor(device="auto")      # prints; returns {"environment": ..., "checks": {pe: {...}}}

The environment: Python, torch, CUDA and the GPU's name, bf16 support, the optional kernels (flash-attn, fla,
triton) and whether torch.compile works here (a tiny function is really compiled). Then one line per PE: the
attention paths a training step and an evaluation forward take on the device (`tapecli.model.attention`), and four
checks of `tape pe check` (tapecli.experiments.pe_check, their one owner) on the device, with the same tiny
trained-like models:

  dense            fp32 on the device vs the fp64 CPU reference with every score materialised, outputs and
                   gradients (the number: the largest relative difference)
  kv-cache         cached greedy decoding == the full forward, step by step
  chunked-prefill  a prompt prefilled in chunks == the full forward
  finite           a training step in fp32 and under bf16 autocast has finite logits and gradients

A check that fails marks its line and makes the command exit with 1.
"""

from __future__ import annotations

import importlib.metadata
import platform
import time

import torch
from rich.console import Console

from tapecli.experiments.pe_check import DOCTOR_CHECKS, Outcome, Subject, run_check
from tapecli.experiments.pe_check.subject import SIZE_TEXT
from tapecli.model import PE_NAMES
from tapecli.runtime import resolve_device


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def compile_works() -> str:
    """Compile and run a tiny function: 'works (N s)' or the first line of the error."""
    start = time.perf_counter()
    try:
        fn = torch.compile(lambda x: torch.sin(x) * 2 + 1)
        x = torch.arange(8.0)
        if not torch.allclose(fn(x), torch.sin(x) * 2 + 1):
            return "wrong result"
    except Exception as e:  # noqa: BLE001 - the report names whatever broke
        return f"fails: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}"
    return f"works ({time.perf_counter() - start:.0f} s to compile a tiny function)"


def environment(device: torch.device) -> dict[str, str]:
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "threads": str(torch.get_num_threads())}
    if torch.cuda.is_available():
        env["cuda"] = f"{torch.version.cuda} ({torch.cuda.device_count()} device(s))"
        env["gpu"] = torch.cuda.get_device_name(device if device.type == "cuda" else 0)
        env["bf16"] = "yes" if torch.cuda.is_bf16_supported() else "no"
    else:
        env["cuda"] = "not available"
        env["bf16"] = "CPU autocast (always available)"
    for name, package in (("flash-attn", "flash-attn"), ("fla", "flash-linear-attention"), ("triton", "triton")):
        env[name] = package_version(package)
    env["torch.compile"] = compile_works()
    return env


def check_pe(pe: str, device: torch.device) -> dict:
    """DOCTOR_CHECKS of `tape pe check` for one PE on `device`: {"paths", "checks": {name: Outcome}, "ok"}."""
    subject = Subject(pe, {}, device)
    outcomes = {name: run_check(name, subject) for name in DOCTOR_CHECKS}
    paths = outcomes["dense"].info.get("paths", {"train": [], "eval": []})
    return {"paths": paths, "checks": outcomes, "ok": all(o.ok for o in outcomes.values())}


def mark(outcome: Outcome) -> str:
    number = f" {outcome.number:.0e}" if outcome.name == "dense" and outcome.number is not None else ""
    return f"{outcome.name}{number} " + ("ok" if outcome.ok else "[red]FAILED[/]")


def run_doctor(device: str = "auto", pes: list[str] | None = None) -> dict:
    dev = resolve_device(device)
    console = Console()
    env = environment(dev)
    console.print(f"[bold]Environment[/] ({dev})")
    width = max(len(k) for k in env)
    for key, value in env.items():
        console.print(f"  {key:<{width}}  {value}")
    console.print(f"\n[bold]self-check per PE[/] (`tape pe check`'s {', '.join(DOCTOR_CHECKS)} checks on {dev}: "
                  f"{SIZE_TEXT}; dense: the largest relative difference to the fp64 CPU reference)")
    checks = {}
    for pe in pes or list(PE_NAMES):
        start = time.perf_counter()
        r = check_pe(pe, dev)
        checks[pe] = r
        train, evaluation = ", ".join(r["paths"]["train"]), ", ".join(r["paths"]["eval"])
        # "nope:" rather than "nope ": a line starting "tape " reads as a command line in the docs.
        console.print(f"  {pe + ':':<8} train: {train:<20} eval: {evaluation:<13} "
                      + "  ".join(mark(o) for o in r["checks"].values())
                      + f"  {time.perf_counter() - start:.1f} s", soft_wrap=True)
    failed = [pe for pe, r in checks.items() if not r["ok"]]
    console.print("all checks passed" if not failed else f"[red]failed: {', '.join(failed)}[/]")
    return {"environment": env, "checks": checks, "failed": failed}
