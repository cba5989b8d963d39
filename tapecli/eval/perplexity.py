"""Perplexity at several context lengths, under a named windowing protocol (what long-context papers report).

The data is one token stream: a `.bin` token file as it is (LongLoRA's uint16 `pg19/test.bin`,
`proof-pile/test_sampled_data.bin`, or `.u32.bin`), or the documents of a text source (file, directory, jsonl,
parquet, hub id) tokenized with each model's own tokenizer, concatenated: each document with the tokenizer's default
special tokens, then EOS (unless the default already ends with it). For tape's own tokenizers and Llama 2's that is
`[BOS] tokens [EOS]` (the layout tape trains on); for GPT-2's or SmolLM2's, `tokens [EOS]`; results.json records
each model's layout under `special_tokens` (docs/special-tokens.md). For each `seq_len`, the stream is cut into
windows by the protocol:

  longlora  windows of seq_len tokens starting at 0, stride, 2 stride, ... while start < len - seq_len; every
            prediction in every window is scored (seq_len - 1 per window). LongLoRA's `eval.py`, and the official
            TAPE `eval_llama.py` behind the paper's context-extension table (stride 256).
  disjoint  non-overlapping windows of seq_len tokens (starts 0, seq_len, ...); every prediction scored.
  sliding   Hugging Face's strided protocol: windows of up to seq_len tokens starting every `stride` tokens; each
            window scores only the tokens no earlier window scored, so every token after the first is scored
            exactly once, with at least seq_len - stride tokens of context (all earlier ones in the first window).

perplexity = exp(nll), nll = mean negative log-likelihood over all scored predictions (for longlora's equal
windows this is LongLoRA's exp(mean of window losses)); token_accuracy = argmax hits / scored predictions.
`max_windows` evaluates a seeded choice of that many windows per length (numpy `default_rng([seed, seq_len])`, the
same windows for every model).

Files in the output directory (the layout of `tapecli.eval.common`): settings.json, samples.jsonl (one row per
window and model: the resume log), results.json, perplexity.png (perplexity vs length, one line per model).
"""

from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tapecli.errors import TapeError
from tapecli.eval.common import (
    RESULTS_FILE,
    SamplesLog,
    model_source,
    open_model,
    progress_bar,
)
from tapecli.files import write_json

PROTOCOLS = {
    "longlora": "windows of seq_len tokens starting every `stride` tokens while start < len - seq_len (LongLoRA "
                "eval.py, official TAPE eval_llama.py); every prediction inside every window scored",
    "disjoint": "non-overlapping windows of seq_len tokens; every prediction inside every window scored",
    "sliding": "Hugging Face's strided protocol: windows of up to seq_len tokens starting every `stride` tokens, each "
               "scoring only the tokens not scored before (every token after the first exactly once, with at least "
               "seq_len - stride tokens of context)",
}
METRIC = ("perplexity = exp(nll); nll = mean negative log-likelihood (natural log) over all scored predictions; "
          "token_accuracy = share of scored predictions whose argmax is the next token")
PLOT_FILE = "perplexity.png"


@dataclass(frozen=True)
class Window:
    """Tokens [start, end) go through the model; the predictions of tokens [score_from, end) are scored."""

    start: int
    end: int
    score_from: int


def make_windows(n_tokens: int, seq_len: int, protocol: str, stride: int) -> list[Window]:
    """Every window of the protocol over a stream of `n_tokens` tokens."""
    if protocol == "longlora":
        return [Window(s, s + seq_len, s + 1) for s in range(0, n_tokens - seq_len, stride)]
    if protocol == "disjoint":
        return [Window(s, s + seq_len, s + 1) for s in range(0, n_tokens - seq_len + 1, seq_len)]
    if protocol == "sliding":
        windows, scored_until = [], 0
        for start in range(0, n_tokens, stride):
            end = min(start + seq_len, n_tokens)
            windows.append(Window(start, end, max(scored_until, start + 1)))
            scored_until = end
            if end == n_tokens:
                break
        return [w for w in windows if w.end > w.score_from]
    raise TapeError(f"--protocol: unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")


def chosen_windows(n_windows: int, max_windows: int | None, seed: int, seq_len: int) -> list[int]:
    """Indices of the windows evaluated: all, or a seeded choice of `max_windows` of them (in stream order)."""
    if max_windows is None or max_windows >= n_windows:
        return list(range(n_windows))
    picked = np.random.default_rng([seed, seq_len]).choice(n_windows, size=max_windows, replace=False)
    return sorted(int(i) for i in picked)


def load_stream(data: str, tokenizer: Any, text_field: str = "text", max_tokens: int | None = None) -> np.ndarray:
    """The token stream of `data` (see the module docstring), cut to its first `max_tokens` tokens."""
    from tapecli.data.sources import is_pretokenized, iter_documents, open_token_memmap

    if is_pretokenized(data):
        tokens = open_token_memmap(data)
        return tokens[:max_tokens] if max_tokens else tokens
    ids: list[int] = []
    for text in iter_documents(data, text_field):
        ids.extend(document_ids(tokenizer, text))
        if max_tokens and len(ids) >= max_tokens:
            break
    return np.asarray(ids[:max_tokens] if max_tokens else ids, dtype=np.int64)


def document_specials(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(ids before, ids after) each document of a text source: the tokenizer's defaults, then EOS."""
    before, after = tokenizer.default_specials
    return before, after if after[-1:] == [tokenizer.eos_id] else [*after, tokenizer.eos_id]


def document_ids(tokenizer: Any, text: str) -> list[int]:
    """One document of the stream (see the module docstring)."""
    before, after = document_specials(tokenizer)
    return [*before, *tokenizer.encode(text), *after]


def score_windows(model: Any, tokens: np.ndarray, windows: list[Window]) -> list[dict[str, float]]:
    """Summed NLL, number of scored predictions and argmax hits of each window; windows of one length go through the
    model together."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    batch = np.stack([np.asarray(tokens[w.start : w.end], dtype=np.int64) for w in windows])
    ids = torch.from_numpy(batch).to(device)
    with torch.inference_mode():
        logits = model(ids)
        rows = []
        for b, w in enumerate(windows):
            first = w.score_from - w.start  # the first scored target, as an index into the window
            predicted = logits[b, first - 1 : -1].float()
            target = ids[b, first:]
            nll = F.cross_entropy(predicted, target, reduction="sum")
            hits = (predicted.argmax(-1) == target).sum()
            rows.append({"nll": float(nll), "tokens": int(target.numel()), "correct": int(hits)})
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """perplexity, nll, token_accuracy and counts from window rows."""
    tokens = sum(r["tokens"] for r in rows)
    nll = sum(r["nll"] for r in rows) / tokens
    return {"perplexity": math.exp(nll), "nll": nll, "token_accuracy": sum(r["correct"] for r in rows) / tokens,
            "tokens": tokens, "windows": len(rows)}


def evaluate_perplexity(
    models: list[str],
    data: str,
    seq_lens: list[int],
    out_dir: str | Path,
    protocol: str = "longlora",
    stride: int = 256,
    max_windows: int | None = None,
    seed: int = 0,
    max_tokens: int | None = None,
    text_field: str = "text",
    dtype: str = "auto",
    device: str = "auto",
    pe_args: dict[str, Any] | None = None,
    batch_size: int = 1,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) the evaluation of every model at every length into `out_dir`; returns results.json's content.

    Models are opened one at a time. Windows already in samples.jsonl (same settings) are not recomputed.
    """
    from tapecli.data.sources import is_pretokenized
    from tapecli.runtime import resolve_device, resolve_dtype

    if protocol not in PROTOCOLS:
        raise TapeError(f"--protocol: unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    if not models:
        raise TapeError("--model: pass at least one model")
    for name, value in (("--seq-len", min(seq_lens, default=0)), ("--stride", stride), ("--batch-size", batch_size),
                        ("--max-windows", max_windows), ("--max-tokens", max_tokens)):
        if value is not None and value < 1:
            raise TapeError(f"{name} must be a positive integer, got {value}")
    if protocol == "sliding" and stride > min(seq_lens):
        raise TapeError(f"--stride {stride} exceeds --seq-len {min(seq_lens)}; the sliding protocol would skip tokens")
    _check_source(data)  # before anything is written, so a mistyped --data leaves no output directory behind
    data_path = Path(data).expanduser()
    settings = {
        "task": "perplexity", "models": [model_source(m)[1] for m in models],
        "data": str(data_path.resolve()) if data_path.exists() else data, "seq_lens": sorted(set(seq_lens)),
        "protocol": protocol, "stride": stride, "max_windows": max_windows, "seed": seed, "max_tokens": max_tokens,
        "text_field": text_field, "dtype": resolve_dtype(dtype, resolve_device(device))[0], "pe_args": pe_args or {},
    }
    started = time.perf_counter()
    model_results = []
    with SamplesLog(out_dir, settings) as log, progress_bar("windows", show_progress) as progress:
        done = {(r["model"], r["seq_len"], r["window"]) for r in log.rows}
        for index, spec in enumerate(models):
            opened = open_model(spec, dtype=dtype, device=device, pe_args=pe_args)
            tokens = load_stream(data, opened.tokenizer, text_field, max_tokens)
            _check_vocab(tokens, opened.model.config.vocab_size, data, opened.name)
            n_windows, todo, total = {}, [], 0
            for seq_len in settings["seq_lens"]:
                windows = make_windows(len(tokens), seq_len, protocol, stride)
                if not windows:
                    raise TapeError(f"{data} has {len(tokens)} tokens for {opened.name}: too few for one window of "
                                    f"--seq-len {seq_len}")
                chosen = chosen_windows(len(windows), max_windows, seed, seq_len)
                n_windows[seq_len], total = len(windows), total + len(chosen)
                todo += [(seq_len, i, windows[i]) for i in chosen if (index, seq_len, i) not in done]
            task = progress.add_task(opened.name, total=total, completed=total - len(todo))
            for batch in _batches(todo, batch_size):
                scores = score_windows(opened.model, tokens, [w for _, _, w in batch])
                log.append([{"model": index, "seq_len": n, "window": i, "start": w.start, **score}
                            for (n, i, w), score in zip(batch, scores, strict=True)])
                progress.advance(task, len(batch))
            lengths = {str(n): {**summarise([r for r in log.rows if r["model"] == index and r["seq_len"] == n]),
                                "windows_total": n_windows[n]} for n in settings["seq_lens"]}
            layout = None if is_pretokenized(data) else opened.tokenizer.describe_specials(
                *document_specials(opened.tokenizer))
            model_results.append({**opened.record(), "data_tokens": int(len(tokens)), "special_tokens": layout,
                                  "lengths": lengths})
            del opened, tokens
            _free_memory()
    results = {"task": "perplexity", "protocol": protocol, "protocol_description": PROTOCOLS[protocol],
               "metric": METRIC, "settings": settings, "models": model_results,
               "seconds_this_session": round(time.perf_counter() - started, 2)}
    out = Path(out_dir)
    write_json(out / RESULTS_FILE, results)
    _plot(results, out / PLOT_FILE)
    return results


def _batches(todo: list[tuple[int, int, Window]], batch_size: int) -> list[list[tuple[int, int, Window]]]:
    """Consecutive windows of one length (the same seq_len and the same number of tokens), batch_size at a time."""
    batches: list[list[tuple[int, int, Window]]] = []
    for item in todo:
        last = batches[-1] if batches else None
        same = last and last[0][0] == item[0] and last[0][2].end - last[0][2].start == item[2].end - item[2].start
        if same and len(last) < batch_size:
            last.append(item)
        else:
            batches.append([item])
    return batches


def _check_source(data: str) -> None:
    from tapecli.data.sources import is_hub_source, is_pretokenized, local_files, open_token_memmap

    if is_pretokenized(data):
        open_token_memmap(data)
    elif not is_hub_source(data):
        local_files(data)


def _check_vocab(tokens: np.ndarray, vocab_size: int, data: str, name: str) -> None:
    top = int(tokens.max()) if len(tokens) else 0
    if top >= vocab_size:
        raise TapeError(f"{data} holds token id {top}, but {name} has a vocabulary of {vocab_size}; the file was "
                        "tokenized for another model")


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _plot(results: dict[str, Any], path: Path) -> None:
    from tapecli.eval.plots import save_line_plot

    series = {m["name"]: [(int(n), r["perplexity"]) for n, r in m["lengths"].items()] for m in results["models"]}
    save_line_plot(series, path, xlabel="context length (tokens)", ylabel="perplexity",
                   title=f"perplexity vs length ({results['protocol']} protocol)", log_x=True)
