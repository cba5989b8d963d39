"""`tape bench --decode`: greedy decoding after a long prompt, per PE, as ratios to RoPE.

Each variant (same seed, same model size as `tape bench`) prefills the same random prompt through a fresh KV cache
(in chunks of --prefill-chunk tokens) and then decodes --new-tokens tokens greedily, one cached step each; the
prefill time and every step are timed. TAPE is also timed without a cache (each new token recomputes the whole
sequence, as the official code does), for --uncached-tokens steps. Prefills are interleaved round by round and
decoding steps token by token (every variant's i-th step in turn), so the machine's drift and load hit all
variants alike; every number is a median. The steps are exactly `Transformer.generate`'s. The KV cache column is
what each cache holds after decoding: windowed layers keep only their window. A variant that fails gets one row
saying why; the others still run, and `failed` in the result lists it (the command then exits with 1).
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
from tapecli.faults import failure_line
from tapecli.files import write_atomic
from tapecli.model import ModelConfig, Transformer
from tapecli.model.generation import prefill
from tapecli.runtime import resolve_device
from tapecli.store.run import check_output

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
        self.cache = self.model.new_cache(capacity=self.capacity) if self.use_cache else None
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


def cache_bytes(cache) -> int:
    """Bytes the KV cache's key and value buffers hold (all layers)."""
    return sum(b.numel() * b.element_size() for layer in cache.layers for b in layer.buffers.values())


def run_decode_bench(pes: list[str], n_layers: int, dim: int, n_heads: int, prompt_len: int, new_tokens: int,
                     uncached_tokens: int, prefill_chunk: int | None, rounds: int, tape_paths: bool, device: str,
                     out: Path | None = None, window: int | None = None, hybrids: tuple[str, ...] = ()) -> dict:
    if out is not None:
        check_output(out, file=True)  # before the models are built and timed
    dev = resolve_device(device)
    console = Console()
    variants = bench_variants(pes, tape_paths, window, hybrids, n_layers)
    vocab = 1024
    prompt = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(0)).to(dev)
    models, failures = {}, {}
    capacity = prompt_len + new_tokens
    console.print(f"[bold]tape bench --decode[/]: {n_layers} layers, dim {dim}, {n_heads} heads, {prompt_len}-token "
                  f"prompt (prefill chunk {prefill_chunk}), {new_tokens} greedy tokens ({uncached_tokens} without "
                  f"cache), {dev} ({threads.describe()}), {rounds} rounds")
    with console.status("timing...") as status:
        for label, pe, pe_args, keys in variants:
            status.update(f"building and warming up {label}")
            try:
                torch.manual_seed(0)
                config = ModelConfig(vocab_size=vocab, dim=dim, n_layers=n_layers, n_heads=n_heads,
                                     max_seq_len=capacity, pe=pe, pe_args=pe_args, **keys)
                model = Transformer(config).to(dev).eval()
                warm = GreedyRun(model, prompt[:, :64], 66, prefill_chunk, True)
                warm.prefill(), warm.step(), warm.step()
            except Exception as e:  # noqa: BLE001 - one variant's failure is its row; the others still run
                failures[label] = failure_line(e)
                continue
            models[label] = model
        tape_label = next((label for label, pe, args, keys in variants if pe == "tape" and "separate" not in label
                           and not keys and label in models), None)
        runs = {label: (GreedyRun(model, prompt, capacity, prefill_chunk, True), new_tokens)
                for label, model in models.items()}
        if tape_label is not None and uncached_tokens > 0:
            runs[NO_CACHE] = (GreedyRun(models[tape_label], prompt, capacity, None, False), uncached_tokens)
        prefills: dict[str, list[float]] = {label: [] for label in runs}
        steps: dict[str, list[float]] = {label: [] for label in runs}
        for r in range(rounds):
            # Prefills one after another, then every variant's i-th step in turn: the variants share the
            # machine's ups and downs step by step.
            for label, (run, _) in list(runs.items()):
                status.update(f"round {r + 1}/{rounds}: prefill {label}")
                try:
                    prefills[label].append(run.prefill())
                except Exception as e:  # noqa: BLE001
                    failures[label] = failure_line(e)
                    del runs[label]
            status.update(f"round {r + 1}/{rounds}: decoding")
            for i in range(max((n for _, n in runs.values()), default=0)):
                for label, (run, n) in list(runs.items()):
                    if i < n:
                        try:
                            steps[label].append(run.step())
                        except Exception as e:  # noqa: BLE001
                            failures[label] = failure_line(e)
                            del runs[label]
    token_s = {label: statistics.median(steps[label]) for label in runs}
    prefill_s = {label: statistics.median(prefills[label]) for label in runs}
    held = {label: cache_bytes(run.cache) for label, (run, _) in runs.items() if run.cache is not None}
    ref_token, ref_prefill = token_s.get("rope"), prefill_s.get("rope")
    table = Table(title=f"greedy decoding after a {prompt_len}-token prompt, median")
    for column in ("PE", "ms / token", "token / RoPE", "prefill s", "prefill / RoPE", "KV cache MB"):
        table.add_column(column, justify="left" if column == "PE" else "right")
    for label in [label for label, *_ in variants] + [NO_CACHE]:
        if label in failures:
            table.add_row(label, f"[red]failed[/]: {failures[label]}", "-", "-", "-", "-")
        elif label in token_s:
            cached = label != NO_CACHE
            table.add_row(label, f"{1000 * token_s[label]:.2f}",
                          f"{token_s[label] / ref_token:.2f}" if ref_token else "-",
                          f"{prefill_s[label]:.2f}" if cached else "-",
                          f"{prefill_s[label] / ref_prefill:.2f}" if cached and ref_prefill else "-",
                          f"{held[label] / 2**20:,.1f}" if cached else "-")
    console.print(table)
    for label, reason in failures.items():
        console.print(f"{label}: failed: {reason}", soft_wrap=True)
    result = {"settings": {"n_layers": n_layers, "dim": dim, "n_heads": n_heads, "prompt_len": prompt_len,
                           "new_tokens": new_tokens, "uncached_tokens": uncached_tokens,
                           "prefill_chunk": prefill_chunk, "rounds": rounds, "device": str(dev),
                           "threads": torch.get_num_threads(), "torch": torch.__version__, "window": window,
                           "hybrids": list(hybrids)},
              "median_token_s": token_s,
              "token_ratio_to_rope": {k: v / ref_token for k, v in token_s.items()} if ref_token else {},
              "median_prefill_s": {k: v for k, v in prefill_s.items() if k != NO_CACHE},
              "prefill_ratio_to_rope": ({k: v / ref_prefill for k, v in prefill_s.items() if k != NO_CACHE}
                                        if ref_prefill else {}),
              "cache_bytes": held, "failed": failures}
    if NO_CACHE in token_s and tape_label in token_s:
        result["tape_cache_speedup"] = token_s[NO_CACHE] / token_s[tape_label]
        console.print(f"TAPE's KV cache: {result['tape_cache_speedup']:.1f}x faster per token than recomputing")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(out, json.dumps(result, indent=2) + "\n")
        console.print(f"wrote {out}")
    if failures:
        console.print(f"[red]failed: {', '.join(failures)}[/]")
    return result
