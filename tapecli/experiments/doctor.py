"""`tape doctor`: what this machine offers, which attention path each PE takes on it, and a self-check per PE.

    report = run_doctor(device="auto")      # prints; returns {"environment": ..., "checks": {pe: {...}}}

The environment: Python, torch, CUDA and the GPU's name, bf16 support, the optional kernels (flash-attn, fla,
triton) and whether torch.compile works here (a tiny function is really compiled). Then one line per PE, for a small
trained-like model (every PE parameter random, so TAPE's, CoPE's and PaTH's zero starts hide nothing) on the
device:

  paths   the attention paths a training step and an evaluation forward take (`tapecli.model.attention`)
  logits  max |logits - fp64 CPU reference| for a left-padded batch, the reference computed with every [T, T]
          score materialised (attention.forced("dense")); must stay within the device's fp32 tolerance
  cache   greedy decoding with the KV cache (prefilled in chunks) == without cache
  bf16    a training step under bf16 autocast gives finite gradients for every parameter

A check that fails marks its line and makes the command exit with 1.
"""

from __future__ import annotations

import copy
import importlib.metadata
import platform
import time

import torch
from rich.console import Console

from tapecli import threads
from tapecli.model import PE_NAMES, ModelConfig, Transformer, attention
from tapecli.runtime import resolve_device

VOCAB = 97
LOGIT_TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}  # fp32 vs the fp64 reference (CUDA matmuls may use TF32)


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
    env = {"python": platform.python_version(), "torch": torch.__version__, "threads": threads.describe()}
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


def tiny_model(pe: str) -> Transformer:
    """2 layers, dim 64, 4 query heads over 2 key heads; every PE parameter random (as after training)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2,
                                    max_seq_len=64, pe=pe))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".pe." in name:
                p.normal_(0, 0.3)
    return model


def check_pe(pe: str, device: torch.device) -> dict:
    model = tiny_model(pe)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[1, :7] = 0  # row 1 is left-padded
    reference_model = copy.deepcopy(model).double().eval()
    with torch.no_grad(), attention.forced("dense"):
        reference = reference_model(tokens, attention_mask=mask)
    model = model.to(device)
    tokens, mask = tokens.to(device), mask.to(device)
    result = {}
    with attention.recording() as train_paths:
        model.train()
        logits = model(tokens)
        logits.float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad(), attention.recording() as eval_paths:
        logits = model(tokens, attention_mask=mask)
    result["paths"] = {"train": sorted(set(train_paths)), "eval": sorted(set(eval_paths))}
    real = mask.bool().cpu()
    error = (logits.double().cpu() - reference)[real].abs().max().item()
    result["logits"] = error
    result["logits_ok"] = error <= LOGIT_TOLERANCE.get(device.type, 1e-3)
    prompt = tokens[:, :24]
    cached = model.generate(prompt, 8, prefill_chunk=16)
    result["cache_ok"] = torch.equal(cached, model.generate(prompt, 8, use_cache=False))
    model.train()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(tokens).float().pow(2).mean()
    loss.backward()
    result["bf16_ok"] = all(p.grad is not None and bool(torch.isfinite(p.grad).all())
                            for p in model.parameters() if p.requires_grad)
    result["ok"] = result["logits_ok"] and result["cache_ok"] and result["bf16_ok"]
    return result


def run_doctor(device: str = "auto", pes: list[str] | None = None) -> dict:
    dev = resolve_device(device)
    console = Console()
    env = environment(dev)
    console.print(f"[bold]Environment[/] ({dev})")
    width = max(len(k) for k in env)
    for key, value in env.items():
        console.print(f"  {key:<{width}}  {value}")
    crowded = threads.busy()
    if crowded:
        console.print(f"[yellow]warning[/]: this machine is busy (load {crowded[0]:.1f} on {crowded[1]} cores): "
                      "other processes hold the CPU and every thread of a tape command waits for them at every op; "
                      f"while they run, use --threads 1 (or {threads.ENV}=1)", soft_wrap=True)
    console.print(f"\n[bold]self-check per PE[/] (2 layers, dim 64, 4 query / 2 key heads, 40 tokens, row 2 "
                  "left-padded;"
                  f" logits vs the fp64 CPU reference, tolerance {LOGIT_TOLERANCE.get(dev.type, 1e-3):g})")
    checks = {}
    for pe in pes or list(PE_NAMES):
        start = time.perf_counter()
        r = check_pe(pe, dev)
        checks[pe] = r

        def mark(ok: bool) -> str:
            return "ok" if ok else "[red]FAILED[/]"

        train, evaluation = ", ".join(r["paths"]["train"]), ", ".join(r["paths"]["eval"])
        # "nope:" rather than "nope ": a line starting "tape " reads as a command line in the docs.
        console.print(f"  {pe + ':':<8} train: {train:<20} eval: {evaluation:<13}"
                      f" logits {r['logits']:.0e} {mark(r['logits_ok'])}  cache {mark(r['cache_ok'])}  "
                      f"bf16 grads {mark(r['bf16_ok'])}  {time.perf_counter() - start:.1f} s", soft_wrap=True)
    failed = [pe for pe, r in checks.items() if not r["ok"]]
    console.print("all checks passed" if not failed else f"[red]failed: {', '.join(failed)}[/]")
    return {"environment": env, "checks": checks, "failed": failed}
