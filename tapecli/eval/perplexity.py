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

`Perplexity` is the protocol (`tapecli.eval.protocol`: a unit is a window; all models share one folder): the runner
writes, to --out (or RUN/eval-perplexity/<checkpoint> for one model): settings.json, samples.jsonl (one row per
window and model: the resume log), results.json, perplexity.png (perplexity vs length, one line per model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tapecli.data.sources import check_source
from tapecli.errors import TapeError
from tapecli.eval.protocol import Evaluation, Opening, run, source_of
from tapecli.store.door import OpenedModel

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
        tokens = open_token_memmap(data, "--data")
        return tokens[:max_tokens] if max_tokens else tokens
    ids: list[int] = []
    for text in iter_documents(data, text_field, "--data"):
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


@dataclass
class Perplexity(Evaluation):
    """Perplexity of several models at several lengths, with `tape eval perplexity`'s options; the models share one
    folder, one settings.json and one results.json (`together`), each row naming its model by index."""

    name = "perplexity"
    unit = "windows"
    plot_file = PLOT_FILE
    together = True
    data: str
    seq_lens: list[int]
    protocol: str = "longlora"
    stride: int = 256
    max_windows: int | None = None
    seed: int = 0
    max_tokens: int | None = None
    text_field: str = "text"
    tokens: Any = field(default=None, init=False, repr=False)  # this model's token stream
    windows: dict[int, list[Window]] = field(default_factory=dict, init=False, repr=False)  # per length, all of them

    def check(self, models: list[str]) -> None:
        if self.protocol not in PROTOCOLS:
            raise TapeError(f"--protocol: unknown protocol {self.protocol!r}; allowed: {', '.join(PROTOCOLS)}")
        for name, value in (("--seq-len", min(self.seq_lens, default=0)), ("--stride", self.stride),
                            ("--max-windows", self.max_windows), ("--max-tokens", self.max_tokens)):
            if value is not None and value < 1:
                raise TapeError(f"{name} must be a positive integer, got {value}")
        if self.protocol == "sliding" and self.stride > min(self.seq_lens):
            raise TapeError(f"--stride {self.stride} exceeds --seq-len {min(self.seq_lens)}; the sliding protocol "
                            "would skip tokens")
        check_source(self.data, "--data")  # before anything is written: a mistyped --data leaves no output behind

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        data_path = Path(self.data).expanduser()
        return {
            "task": "perplexity", "models": [source_of(m)[1] for m in models],
            "data": str(data_path.resolve()) if data_path.exists() else self.data,
            "seq_lens": sorted(set(self.seq_lens)), "protocol": self.protocol, "stride": self.stride,
            "max_windows": self.max_windows, "seed": self.seed, "max_tokens": self.max_tokens,
            "text_field": self.text_field, "dtype": opening.dtype_name(), "pe_args": opening.pe_args,
        }

    def prepare(self, opened: OpenedModel) -> None:
        self.tokens = load_stream(self.data, opened.tokenizer, self.text_field, self.max_tokens)
        check_vocab(self.tokens, opened.model.config.vocab_size, self.data, opened.name)
        self.windows = {}
        for seq_len in sorted(set(self.seq_lens)):
            self.windows[seq_len] = make_windows(len(self.tokens), seq_len, self.protocol, self.stride)
            if not self.windows[seq_len]:
                raise TapeError(f"{self.data} has {len(self.tokens)} tokens for {opened.name}: too few for one window "
                                f"of --seq-len {seq_len}")

    def units(self, opened: OpenedModel) -> list[tuple[int, int]]:
        return [(n, i) for n, windows in self.windows.items()
                for i in chosen_windows(len(windows), self.max_windows, self.seed, n)]

    def key(self, row: dict[str, Any]) -> tuple[int, int]:
        return row["seq_len"], row["window"]

    def batches(self, todo: list[tuple[int, int]], batch_size: int) -> list[list[tuple[int, int]]]:
        return _batches(todo, self.windows, batch_size)

    def evaluate(self, opened: OpenedModel, units: list[tuple[int, int]]) -> list[dict[str, Any]]:
        windows = [self.windows[n][i] for n, i in units]
        scores = score_windows(opened.model, self.tokens, windows)
        return [{"seq_len": n, "window": i, "start": w.start, **score}
                for (n, i), w, score in zip(units, windows, scores, strict=True)]

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        lengths = {str(n): {**summarise([r for r in rows if r["seq_len"] == n]), "windows_total": len(windows)}
                   for n, windows in self.windows.items()}
        from tapecli.data.sources import is_pretokenized

        layout = None if is_pretokenized(self.data) else opened.tokenizer.describe_specials(
            *document_specials(opened.tokenizer))
        return {**opened.record(), "data_tokens": int(len(self.tokens)), "special_tokens": layout, "lengths": lengths}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "perplexity", "protocol": self.protocol, "protocol_description": PROTOCOLS[self.protocol],
                "metric": METRIC, "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        _plot(results, path)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        return "\n".join(f"{entry['name']}: perplexity " + ", ".join(f"{n}: {r['perplexity']:.3f}"
                                                                    for n, r in entry["lengths"].items())
                         for folder in results.values() for entry in folder["models"])


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
    evaluation = Perplexity(data, seq_lens, protocol, stride, max_windows, seed, max_tokens, text_field)
    report = run(evaluation, models, out_dir, dtype=dtype, device=device, pe_args=pe_args, batch_size=batch_size,
                 show_progress=show_progress)
    return report.results[evaluation.name]


def _batches(todo: list[tuple[int, int]], windows: dict[int, list[Window]], batch_size: int
             ) -> list[list[tuple[int, int]]]:
    """Consecutive windows of one length (the same seq_len and the same number of tokens), batch_size at a time."""

    def size(unit: tuple[int, int]) -> int:
        window = windows[unit[0]][unit[1]]
        return window.end - window.start

    batches: list[list[tuple[int, int]]] = []
    for item in todo:
        last = batches[-1] if batches else None
        same = last and last[0][0] == item[0] and size(last[0]) == size(item)
        if same and len(last) < batch_size:
            last.append(item)
        else:
            batches.append([item])
    return batches


def check_vocab(tokens: np.ndarray, vocab_size: int, data: str, name: str) -> None:
    top = int(tokens.max()) if len(tokens) else 0
    if top >= vocab_size:
        raise TapeError(f"{data} holds token id {top}, but {name} has a vocabulary of {vocab_size}; the file was "
                        "tokenized for another model")


def _plot(results: dict[str, Any], path: Path) -> None:
    from tapecli.eval.plots import save_line_plot

    series = {m["name"]: [(int(n), r["perplexity"]) for n, r in m["lengths"].items()] for m in results["models"]}
    save_line_plot(series, path, xlabel="context length (tokens)", ylabel="perplexity",
                   title=f"perplexity vs length ({results['protocol']} protocol)", log_x=True)
