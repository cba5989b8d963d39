"""`tape bench --decode`: greedy decoding after a long prompt, per PE, as ratios to RoPE.

Each variant (same seed, same model size as `tape bench`) prefills the same random prompt through a fresh KV cache
(in chunks of --prefill-chunk tokens) and then decodes --new-tokens tokens greedily, one cached step each; the
prefill time and every step are timed. TAPE is also timed without a cache (each new token recomputes the whole
sequence, as the official code does), for --uncached-tokens steps. Variants are interleaved round by round, so
machine drift hits all alike; every number is a median. The steps are exactly `Transformer.generate`'s.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from tapecli.bench import bench_variants
from tapecli.device import resolve_device
from tapecli.model import KVCache, ModelConfig, Transformer
from tapecli.model.generation import prefill
from tapecli.run import write_atomic

NO_CACHE = "tape (no cache)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def time_decoding(model: Transformer, prompt: torch.Tensor, new_tokens: int, chunk: int | None,
                  use_cache: bool) -> tuple[float, list[float]]:
    """Seconds for the prefill, and for each greedy step after it."""
    device, T = prompt.device, prompt.shape[1]
    cache = KVCache(model.config.n_layers, capacity=T + new_tokens) if use_cache else None
    sync(device)
    start = time.perf_counter()
    logits = prefill(model, prompt, None, 0, cache, chunk if use_cache else None)
    sync(device)
    prefill_s, steps, tokens = time.perf_counter() - start, [], prompt
    for i in range(new_tokens):
        next_token = logits.argmax(-1)
        tokens = torch.cat((tokens, next_token[:, None]), dim=1)
        start = time.perf_counter()
        if cache is not None:
            hidden, _ = model.run(next_token[:, None], T + i, cache)
            logits = model.lm_head(hidden[:, -1])
        else:
            logits = prefill(model, tokens, None, 0, None, None)
        sync(device)
        steps.append(time.perf_counter() - start)
    return prefill_s, steps


def run_decode_bench(pes: list[str], n_layers: int, dim: int, n_heads: int, prompt_len: int, new_tokens: int,
                     uncached_tokens: int, prefill_chunk: int | None, rounds: int, tape_paths: bool, device: str,
                     out: Path | None = None) -> dict:
    dev = resolve_device(device)
    console = Console()
    variants = bench_variants(pes, tape_paths)
    vocab = 1024
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(dev)
    models = {}
    for label, pe, pe_args in variants:
        torch.manual_seed(0)
        config = ModelConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads,
                             max_seq_len=prompt_len + new_tokens, pe=pe, pe_args=pe_args)
        models[label] = Transformer(config).to(dev).eval()
    tape_label = next((label for label, pe, args in variants if pe == "tape" and "separate" not in label), None)
    runs = [(label, model, True, new_tokens) for label, model in models.items()]
    if tape_label is not None and uncached_tokens > 0:
        runs.append((NO_CACHE, models[tape_label], False, uncached_tokens))
    prefills: dict[str, list[float]] = {label: [] for label, *_ in runs}
    steps: dict[str, list[float]] = {label: [] for label, *_ in runs}
    console.print(f"[bold]tape bench --decode[/]: {n_layers} layers, dim {dim}, {n_heads} heads, {prompt_len}-token "
                  f"prompt (prefill chunk {prefill_chunk}), {new_tokens} greedy tokens ({uncached_tokens} without "
                  f"cache), {dev} ({torch.get_num_threads()} threads), {rounds} rounds")
    with console.status("timing...") as status:
        for label, model, _, _ in runs[:len(models)]:
            status.update(f"warming up {label}")
            time_decoding(model, prompt[:, :64], 2, prefill_chunk, True)
        for r in range(rounds):
            for label, model, use_cache, n in runs:
                status.update(f"round {r + 1}/{rounds}: {label}")
                prefill_s, step_s = time_decoding(model, prompt, n, prefill_chunk, use_cache)
                prefills[label].append(prefill_s)
                steps[label] += step_s
    token_s = {label: statistics.median(t) for label, t in steps.items()}
    prefill_s = {label: statistics.median(t) for label, t in prefills.items()}
    table = Table(title=f"greedy decoding after a {prompt_len}-token prompt, median")
    for column in ("PE", "ms / token", "token / RoPE", "prefill s", "prefill / RoPE"):
        table.add_column(column, justify="left" if column == "PE" else "right")
    for label in token_s:
        cached = label != NO_CACHE
        table.add_row(label, f"{1000 * token_s[label]:.2f}", f"{token_s[label] / token_s['rope']:.2f}",
                      f"{prefill_s[label]:.2f}" if cached else "-",
                      f"{prefill_s[label] / prefill_s['rope']:.2f}" if cached else "-")
    console.print(table)
    result = {"settings": {"n_layers": n_layers, "dim": dim, "n_heads": n_heads, "prompt_len": prompt_len,
                           "new_tokens": new_tokens, "uncached_tokens": uncached_tokens,
                           "prefill_chunk": prefill_chunk, "rounds": rounds, "device": str(dev),
                           "threads": torch.get_num_threads(), "torch": torch.__version__},
              "median_token_s": token_s, "token_ratio_to_rope": {k: v / token_s["rope"] for k, v in token_s.items()},
              "median_prefill_s": {k: v for k, v in prefill_s.items() if k != NO_CACHE},
              "prefill_ratio_to_rope": {k: v / prefill_s["rope"] for k, v in prefill_s.items() if k != NO_CACHE}}
    if NO_CACHE in token_s:
        result["tape_cache_speedup"] = token_s[NO_CACHE] / token_s[tape_label]
        console.print(f"TAPE's KV cache: {result['tape_cache_speedup']:.1f}x faster per token than recomputing")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")
    return result
