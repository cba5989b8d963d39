"""`tape bench --decode`: greedy decoding after a long prompt, per PE, as ratios to RoPE.

Each variant (same seed, same model size as `tape bench`) prefills the same random prompt through a fresh KV cache
(in chunks of --prefill-chunk tokens) and then decodes --new-tokens tokens greedily, one cached step each; the
prefill time and every step are timed. TAPE is also timed without a cache (each new token recomputes the whole
sequence, as the official code does), for --uncached-tokens steps. Prefills are interleaved round by round and
decoding steps token by token (every variant's i-th step in turn), so the machine's drift and load hit all
variants alike; every number is a median. The steps are exactly `Transformer.generate`'s.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from tapecli import threads
from tapecli.experiments.bench import bench_variants
from tapecli.files import write_atomic
from tapecli.model import KVCache, ModelConfig, Transformer
from tapecli.model.generation import prefill
from tapecli.runtime import resolve_device

NO_CACHE = "tape (no cache)"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


class GreedyRun:
    """One variant's greedy decoding, timed phase by phase: `prefill()` then `step()` per new token, exactly as
    `Transformer.generate` does them (with the cache, or recomputing everything)."""

    def __init__(self, model: Transformer, prompt: torch.Tensor, capacity: int, chunk: int | None,
                 use_cache: bool) -> None:
        self.model, self.prompt, self.capacity, self.use_cache = model, prompt, capacity, use_cache
        self.chunk = chunk if use_cache else None

    @torch.no_grad()
    def prefill(self) -> float:
        self.cache = KVCache(self.model.config.n_layers, capacity=self.capacity) if self.use_cache else None
        self.tokens = self.prompt

        def fill() -> None:
            self.logits = prefill(self.model, self.prompt, None, 0, self.cache, self.chunk)

        return timed(fill, self.prompt.device)

    @torch.no_grad()
    def step(self) -> float:
        next_token = self.logits.argmax(-1)[:, None]
        position = self.tokens.shape[1]
        self.tokens = torch.cat((self.tokens, next_token), dim=1)

        def decode() -> None:
            if self.cache is not None:
                hidden, _ = self.model.run(next_token, position, self.cache)
                self.logits = self.model.lm_head(hidden[:, -1])
            else:
                self.logits = prefill(self.model, self.tokens, None, 0, None, None)

        return timed(decode, self.prompt.device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


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
    capacity = prompt_len + new_tokens
    runs = {label: (GreedyRun(model, prompt, capacity, prefill_chunk, True), new_tokens)
            for label, model in models.items()}
    if tape_label is not None and uncached_tokens > 0:
        runs[NO_CACHE] = (GreedyRun(models[tape_label], prompt, capacity, None, False), uncached_tokens)
    prefills: dict[str, list[float]] = {label: [] for label in runs}
    steps: dict[str, list[float]] = {label: [] for label in runs}
    console.print(f"[bold]tape bench --decode[/]: {n_layers} layers, dim {dim}, {n_heads} heads, {prompt_len}-token "
                  f"prompt (prefill chunk {prefill_chunk}), {new_tokens} greedy tokens ({uncached_tokens} without "
                  f"cache), {dev} ({threads.describe()}), {rounds} rounds")
    with console.status("timing...") as status:
        for label, model in models.items():
            status.update(f"warming up {label}")
            warm = GreedyRun(model, prompt[:, :64], 66, prefill_chunk, True)
            warm.prefill(), warm.step(), warm.step()
        for r in range(rounds):
            # Prefills one after another, then every variant's i-th step in turn: the variants share the
            # machine's ups and downs step by step.
            for label, (run, _) in runs.items():
                status.update(f"round {r + 1}/{rounds}: prefill {label}")
                prefills[label].append(run.prefill())
            status.update(f"round {r + 1}/{rounds}: decoding")
            for i in range(max(n for _, n in runs.values())):
                for label, (run, n) in runs.items():
                    if i < n:
                        steps[label].append(run.step())
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
