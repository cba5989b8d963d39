"""`tape bench`: time one training step (forward + backward) per PE on the same model, as a ratio to RoPE.

Every variant is built with the same seed and fed the same batch; variants are interleaved round by round so
slow drift of the machine (thermal, other processes) hits all of them alike; each time is a median.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from tapecli.errors import TapeError
from tapecli.faults import check_output_file, note_memory_use
from tapecli.files import write_atomic
from tapecli.model import PE_NAMES, ModelConfig, Transformer
from tapecli.runtime import resolve_device


def bench_variants(pes: list[str], tape_paths: bool) -> list[tuple[str, str, dict]]:
    """(label, pe, pe_args) for each PE; RoPE always included as the reference."""
    unknown = [p for p in pes if p not in PE_NAMES]
    if unknown:
        raise TapeError(f"--pe: unknown positional encoding {unknown[0]!r}; allowed: {', '.join(PE_NAMES)}")
    variants = [("rope", "rope", {})] + [(p, p, {}) for p in pes if p not in ("rope", "tape")]
    if "tape" in pes:
        if tape_paths:
            variants += [("tape (separate)", "tape", {"aggregation": "separate"}),
                         ("tape (concat)", "tape", {"aggregation": "concat"})]
        else:
            variants.append(("tape", "tape", {}))
    return variants


def time_steps(model: Transformer, batch: torch.Tensor, steps: int, device: torch.device) -> list[float]:
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return times


def check_options(n_layers: int, dim: int, n_heads: int, seq_len: int, batch_size: int, steps: int, warmup: int,
                  rounds: int) -> None:
    """Every option names its own problem, before any model is built."""
    for option, value in [("--n-layers", n_layers), ("--dim", dim), ("--n-heads", n_heads), ("--seq-len", seq_len),
                          ("--batch-size", batch_size), ("--steps", steps), ("--rounds", rounds)]:
        if value <= 0:
            raise TapeError(f"{option} must be a positive integer, got {value}")
    if warmup < 0:
        raise TapeError(f"--warmup must be >= 0, got {warmup}")
    if dim % n_heads:
        raise TapeError(f"--n-heads {n_heads} does not divide --dim {dim}")


def run_bench(pes: list[str], n_layers: int, dim: int, n_heads: int, seq_len: int, batch_size: int, steps: int,
              warmup: int, rounds: int, tape_paths: bool, device: str, out: Path | None = None) -> dict:
    check_options(n_layers, dim, n_heads, seq_len, batch_size, steps, warmup, rounds)
    if out is not None:
        check_output_file(out)
    dev = resolve_device(device)
    console = Console()
    variants = bench_variants(pes, tape_paths)
    note_memory_use(f"{len(variants)} models of {n_layers} layers x dim {dim} ({batch_size} x {seq_len} tokens per "
                    "step)", "lower --batch-size or --seq-len, or time fewer --pe at once")
    vocab = 1024
    batch = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(0)).to(dev)
    models = {}
    for label, pe, pe_args in variants:
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads, max_seq_len=seq_len,
                             pe=pe, pe_args=pe_args)
        models[label] = Transformer(config).to(dev).train()
    samples: dict[str, list[float]] = {label: [] for label in models}
    console.print(f"[bold]tape bench[/]: {n_layers} layers, dim {dim}, {n_heads} heads, batch {batch_size} x "
                  f"{seq_len} tokens, {dev} ({torch.get_num_threads()} threads), {rounds} rounds x {steps} steps")
    with console.status("timing...") as status:
        for label, model in models.items():
            status.update(f"warming up {label}")
            time_steps(model, batch, warmup, dev)
        for r in range(rounds):
            for label, model in models.items():
                status.update(f"round {r + 1}/{rounds}: {label}")
                samples[label] += time_steps(model, batch, steps, dev)
    medians = {label: statistics.median(t) for label, t in samples.items()}
    reference = medians["rope"]
    table = Table(title="training step (forward + backward), median")
    for column in ("PE", "ms / step", "tokens / s", "time / RoPE"):
        table.add_column(column, justify="left" if column == "PE" else "right")
    tokens = batch_size * seq_len
    for label, median in medians.items():
        table.add_row(label, f"{1000 * median:.1f}", f"{tokens / median:,.0f}", f"{median / reference:.2f}")
    console.print(table)
    result = {"settings": {"n_layers": n_layers, "dim": dim, "n_heads": n_heads, "seq_len": seq_len,
                           "batch_size": batch_size, "steps": steps, "warmup": warmup, "rounds": rounds,
                           "device": str(dev), "threads": torch.get_num_threads(), "torch": torch.__version__},
              "median_step_s": medians, "ratio_to_rope": {k: v / reference for k, v in medians.items()}}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")
    return result
