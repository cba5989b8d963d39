"""The step `tape bench` measures: one variant's model and batch, one training step, and the child process that
measures that step's peak memory.

    model, batch, device = make_variant(spec); train_step(model, batch, precision, device)
    python -m tapecli.experiments.bench_step '<json spec>'    # one JSON line: {"peak_bytes": ..., "paths": [...]}

A spec names the variant: pe, pe_args, model (further model keys: window, schedule, ...; optional), n_layers, dim,
n_heads, seq_len, batch_size, precision, compile, device, and optionally attention: one attention path every layer
is forced onto (`attention.forced`; `tape bench`'s variants "alibi on flex"), where the PE takes it.
The child builds the model and batch, runs one step (warm-up: lazy initialisation, compilation), then measures a
second step: on CUDA the growth of `torch.cuda.max_memory_allocated` over what was allocated before it; on the CPU
the growth of the process's peak resident memory (VmHWM, reset through /proc/self/clear_refs) over its resident
memory before the step. `tape bench` starts it with glibc's mmap threshold fixed at 64 KiB
(MALLOC_MMAP_THRESHOLD_), so freed tensors go back to the system at once and the resident peak follows the tensors
alive at once, not the allocator's caching.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

from tapecli.model import ModelConfig, Transformer, attention
from tapecli.runtime import resolve_device

VOCAB = 1024


def make_variant(spec: dict) -> tuple[torch.nn.Module, torch.Tensor, torch.device]:
    """The model (seed 0, training mode, compiled when asked) and batch [B, T + 1] a spec describes."""
    dev = resolve_device(spec["device"])
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, dim=spec["dim"], n_layers=spec["n_layers"], n_heads=spec["n_heads"],
                         max_seq_len=spec["seq_len"], pe=spec["pe"], pe_args=spec["pe_args"], **spec.get("model", {}))
    model = Transformer(config).to(dev).train()
    if spec["compile"]:
        model = torch.compile(model)
    generator = torch.Generator().manual_seed(0)
    batch = torch.randint(0, VOCAB, (spec["batch_size"], spec["seq_len"] + 1), generator=generator).to(dev)
    return model, batch, dev


def train_step(model: torch.nn.Module, batch: torch.Tensor, precision: str, device: torch.device,
               path: str | None = None) -> None:
    """Forward (under bf16 autocast for --precision bf16), cross-entropy, backward; gradients are left in place.
    `path`: the attention path every layer is forced onto (None: the one the dispatcher picks)."""
    with attention.forced(path) if path else contextlib.nullcontext():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()


def cuda_peak(model: torch.nn.Module, batch: torch.Tensor, precision: str, device: torch.device,
              path: str | None = None) -> int:
    """The growth of `torch.cuda.max_memory_allocated` during one step over what was allocated before it (the
    allocator counts tensors, not processes, so this needs no process of its own)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train_step(model, batch, precision, device, path)
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated() - before


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(spec: dict) -> dict:
    """One warm-up step, then the peak memory of a second one (module docstring) and the attention paths taken."""
    model, batch, device = make_variant(spec)
    path = spec.get("attention")
    with attention.recording() as paths:
        train_step(model, batch, spec["precision"], device, path)
    model.zero_grad(set_to_none=True)
    if device.type == "cuda":
        peak = cuda_peak(model, batch, spec["precision"], device, path)
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set size restarts from the current one
        before = status_kib("VmRSS")
        train_step(model, batch, spec["precision"], device, path)
        peak = (status_kib("VmHWM") - before) * 1024
    return {"peak_bytes": peak, "paths": sorted(set(paths))}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
