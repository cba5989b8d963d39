"""`tape doctor`: what this machine offers, which attention path each PE takes on it, and a self-check per PE.

    report = run_doctor(device="auto")      # prints; returns {"environment": ..., "checks": {pe: {...}}}

The environment: Python, torch, CUDA and the GPU's name, bf16 support, the optional kernels (flash-attn, fla,
triton), whether torch.compile works here (a tiny function is really compiled) and the Hugging Face classes tape
imports and exports (tapecli.model.hf_arch). Then one line per PE, for a small
trained-like model (every PE parameter random, so TAPE's, CoPE's and PaTH's zero starts hide nothing) on the
device, and one per hybrid layout (HYBRID_CHECKS: sliding windows shorter than the batch, temperatures, length
scales, several PEs in one model, the NoPE layers, biases and QK-norm of imported SmolLM3 / Qwen models):

  paths   the attention paths a training step and an evaluation forward take (`tapecli.model.attention`)
  logits  max |logits - fp64 CPU reference| for a left-padded batch, the reference computed with every [T, T]
          score materialised (attention.forced("dense")); must stay within the device's fp32 tolerance
  grads   max relative error of every gradient of an fp32 training step on that batch against the same reference
          (the backward of the path each PE trains with: FlexAttention's on CUDA, the chunked path's on the CPU)
  cache   greedy decoding with the KV cache (prefilled in chunks) == without cache
  bf16    a training step under bf16 autocast gives finite gradients for every parameter

A check that fails marks its line and makes the command exit with 1; a PE whose check raises gets one line,
"failed: <the error>", and the other PEs are still checked.
"""

from __future__ import annotations

import copy
import importlib.metadata
import platform
import time

import torch
from rich.console import Console

from tapecli.faults import failure_line
from tapecli.model import PE_NAMES, ModelConfig, Transformer, attention
from tapecli.runtime import resolve_device

VOCAB = 97
LOGIT_TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}  # fp32 vs the fp64 reference (CUDA matmuls may use TF32)
GRAD_TOLERANCE = {"cpu": 1e-3, "cuda": 1e-2}  # relative to each gradient's largest entry; a wrong backward is O(1)
# Hybrid layouts every `tape doctor` checks (4 layers; windows of 16 keys in a 40-token batch).
HYBRID_CHECKS: dict[str, dict] = {
    "irope": {"pe": "rope", "temperature": 0.9, "schedule": {
        "pattern": ["local", "local", "local", "global"],
        "kinds": {"local": {"window": 16}, "global": {"pe": "nope", "length_scale": "llama4",
                                                       "length_scale_args": {"floor_scale": 8.0}}}}},
    "bias-mix": {"pe": "alibi", "schedule": {
        "layers": ["alibi", "t5", "fire", "alibi"],
        "kinds": {"alibi": {"window": 16}, "t5": {"pe": "t5", "temperature": 0.8},
                  "fire": {"pe": "fire", "window": 16, "temperature": 1.2}}}},
    "state-mix": {"pe": "tape", "length_scale": "log", "length_scale_args": {"length": 16}, "schedule": {
        "layers": ["tape", "cope", "local-tape", "path"],
        "kinds": {"local-tape": {"window": 16}, "cope": {"pe": "cope", "window": 16, "temperature": 0.9},
                  "path": {"pe": "path", "temperature": 1.1}}}},
    # What SmolLM3, Qwen2 and Qwen3 imports use: NoPE layers, windowed RoPE layers, q/k/v biases, QK-norm.
    "hf-hybrid": {"pe": "rope", "qk_norm": True, "qkv_bias": True, "schedule": {
        "pattern": ["local", "local", "local", "nope"], "kinds": {"local": {"window": 16}}}},
}


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
    from tapecli.model.hf_arch import ARCHITECTURES

    env["hf import"] = f"{', '.join(ARCHITECTURES)} (transformers {package_version('transformers')})"
    return env


def tiny_model(keys: dict) -> Transformer:
    """2 layers (4 for a hybrid), dim 64, 4 query heads over 2 key heads; `keys` the PE (and hybrid) model keys;
    every PE parameter, q/k/v bias and q/k norm random (as after training)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=VOCAB, dim=64, n_layers=4 if "schedule" in keys else 2, n_heads=4,
                                    n_kv_heads=2, max_seq_len=64, **keys))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".pe." in name or name.endswith(("_proj.bias", "q_norm.weight", "k_norm.weight")):
                p.normal_(0, 0.3)
    return model


def grads_of(model: Transformer, tokens: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor | None]:
    """Every parameter's gradient of one training step on a padded batch (the loss ignores padded rows)."""
    model.train()
    logits = model(tokens, attention_mask=mask)
    (logits.float().pow(2) * mask[..., None]).mean().backward()
    grads = [None if p.grad is None else p.grad.detach().double().cpu() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def check_model(keys: dict, device: torch.device) -> dict:
    model = tiny_model(keys)
    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(tokens)
    mask[1, :7] = 0  # row 1 is left-padded
    reference_model = copy.deepcopy(model).double().eval()
    with attention.forced("dense"):
        with torch.no_grad():
            reference = reference_model(tokens, attention_mask=mask)
        reference_grads = grads_of(reference_model, tokens, mask)
    model = model.to(device)
    tokens, mask = tokens.to(device), mask.to(device)
    result = {}
    with attention.recording() as train_paths:
        grads = grads_of(model, tokens, mask)
    model.eval()
    with torch.no_grad(), attention.recording() as eval_paths:
        logits = model(tokens, attention_mask=mask)
    result["paths"] = {"train": sorted(set(train_paths)), "eval": sorted(set(eval_paths))}
    real = mask.bool().cpu()
    error = (logits.double().cpu() - reference)[real].abs().max().item()
    result["logits"] = error
    result["logits_ok"] = error <= LOGIT_TOLERANCE.get(device.type, 1e-3)
    result["grads"] = max(((g - w).abs().max() / w.abs().max().clamp(min=1e-12)).item()
                          for g, w in zip(grads, reference_grads, strict=True) if w is not None)
    result["grads_ok"] = result["grads"] <= GRAD_TOLERANCE.get(device.type, 1e-2)
    prompt = tokens[:, :24]
    cached = model.generate(prompt, 8, prefill_chunk=16)
    result["cache_ok"] = torch.equal(cached, model.generate(prompt, 8, use_cache=False))
    model.train()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        loss = model(tokens).float().pow(2).mean()
    loss.backward()
    result["bf16_ok"] = all(p.grad is not None and bool(torch.isfinite(p.grad).all())
                            for p in model.parameters() if p.requires_grad)
    result["ok"] = result["logits_ok"] and result["grads_ok"] and result["cache_ok"] and result["bf16_ok"]
    return result


def check_pe(pe: str, device: torch.device) -> dict:
    return check_model({"pe": pe}, device)


def run_doctor(device: str = "auto", pes: list[str] | None = None, hybrids: bool = True) -> dict:
    dev = resolve_device(device)
    console = Console()
    env = environment(dev)
    console.print(f"[bold]Environment[/] ({dev})")
    width = max(len(k) for k in env)
    for key, value in env.items():
        console.print(f"  {key:<{width}}  {value}")
    console.print(f"\n[bold]self-check per PE[/] (2 layers, dim 64, 4 query / 2 key heads, 40 tokens, row 2 "
                  f"left-padded; logits and training gradients vs the fp64 CPU reference, tolerance "
                  f"{LOGIT_TOLERANCE.get(dev.type, 1e-3):g} and {GRAD_TOLERANCE.get(dev.type, 1e-2):g} relative; "
                  "hybrids: 4 layers, windows of 16 keys)")
    checks = {}
    rows = [(pe, lambda pe=pe: check_pe(pe, dev)) for pe in pes or list(PE_NAMES)]
    rows += [(name, lambda keys=keys: check_model(keys, dev)) for name, keys in HYBRID_CHECKS.items()] if hybrids \
        else []
    width = max(len(name) for name, _ in rows) + 1
    for name, check in rows:
        start = time.perf_counter()
        try:
            r = check()
        except Exception as e:  # noqa: BLE001 - one PE's failure is its line; the others are still checked
            checks[name] = {"ok": False, "error": failure_line(e)}
            console.print(f"  {name + ':':<{width}} [red]failed[/]: {checks[name]['error']}", soft_wrap=True)
            continue
        checks[name] = r

        def mark(ok: bool) -> str:
            return "ok" if ok else "[red]FAILED[/]"

        train, evaluation = ", ".join(r["paths"]["train"]), ", ".join(r["paths"]["eval"])
        # "nope:" rather than "nope ": a line starting "tape " reads as a command line in the docs.
        console.print(f"  {name + ':':<{width}} train: {train:<20} eval: {evaluation:<13}"
                      f" logits {r['logits']:.0e} {mark(r['logits_ok'])}  grads {r['grads']:.0e} "
                      f"{mark(r['grads_ok'])}  cache {mark(r['cache_ok'])}  bf16 grads {mark(r['bf16_ok'])}  "
                      f"{time.perf_counter() - start:.1f} s", soft_wrap=True)
    failed = [name for name, r in checks.items() if not r["ok"]]
    console.print("all checks passed" if not failed else f"[red]failed: {', '.join(failed)}[/]")
    return {"environment": env, "checks": checks, "failed": failed}
