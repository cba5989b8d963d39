"""What every evaluation shares: the resumable settings + samples log, greedy generation, progress, --pe-arg values.

An evaluation module (`tapecli.eval.addition`, `perplexity`, `passkey`, ...) holds only its protocol. It
1. opens each model through the one door, `tapecli.store.door.open_model(spec, dtype=..., device=...,
   pe_args=...)`, where `spec` is a tape run directory (its newest checkpoint), a tape checkpoint directory, or a
   Hugging Face model directory / hub id; `OpenedModel.record()` is what goes into the evaluation's settings;
2. opens its output directory with `SamplesLog(out, settings, keep=...)`, which refuses a directory holding another
   evaluation's settings, skips a half-written last line, and hands back the rows an interrupted run finished;
3. appends result rows with `log.append(rows)` (flushed at once, so a finished unit survives an interruption), and
   writes results.json with `write_json` (atomically) at the end;
4. decodes with `generate_batch(model, prompts, max_new_tokens)` (greedy or sampled), the one place that talks to
   `Transformer.generate` (non-finite logits raise `NonFiniteLogits`); `generate_texts(opened, prompt texts, ...)`
   wraps it for the long-context evaluations
   (default special tokens + text in, greedy text cut at EOS and stripped out);
5. builds what depends only on the tokenizer once per distinct tokenizer with `per_tokenizer(cache, tokenizer, make)`.

Output directory layout shared by all evaluations:
  settings.json   what is being evaluated (compared on resume)
  samples.jsonl   one JSON object per finished unit (problem, window, trial); the resume log
  results.json    the aggregated numbers, the protocol and the settings
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError
from tapecli.faults import reading
from tapecli.files import JsonlLog, write_atomic
from tapecli.store.claim import claim

if TYPE_CHECKING:
    from rich.progress import Progress

SETTINGS_FILE = "settings.json"
SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.json"


# ---------------------------------------------------------------------------------------------------------------
# --pe-arg values


def parse_pe_args(pairs: list[str] | None) -> dict[str, Any]:
    """`["scaling=linear", "factor=2"]` -> `{"scaling": "linear", "factor": 2}`; values read exactly as recipe
    overrides read theirs (`tapecli.recipe.values.parse_value`). Names and types are checked later, by the PE itself,
    when the model is rebuilt with them."""
    from tapecli.recipe.values import parse_value

    parsed: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise TapeError(f"--pe-arg {pair!r} must look like key=value (e.g. --pe-arg scaling=linear)")
        parsed[key.strip()] = parse_value(raw, f"--pe-arg {key.strip()}")
    return parsed


# ---------------------------------------------------------------------------------------------------------------
# The resumable settings + samples log


def claim_settings(out_dir: Path, settings: dict[str, Any], started: bool, stale: list[str] = ()) -> None:
    """Tie `out_dir` to the evaluation `settings` describe. While it holds finished work (`started`), other
    settings are refused with one line naming the keys that differ; otherwise (a new directory, or one left by a
    run that failed before finishing anything) the `stale` files are deleted and settings.json is (re)written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = json.loads(json.dumps(settings))  # as it reads back from disk (tuples -> lists, ...)
    settings_path = out_dir / SETTINGS_FILE
    if started and settings_path.is_file():
        with reading(settings_path):
            previous = json.loads(settings_path.read_text(encoding="utf-8"))
        if previous != settings:
            changed = sorted(k for k in previous.keys() | settings.keys() if previous.get(k) != settings.get(k))
            raise TapeError(f"{out_dir} holds an evaluation with other settings ({', '.join(changed)} differ); "
                            "pass another --out or delete that directory")
        return
    for name in stale:
        (out_dir / name).unlink(missing_ok=True)
    write_atomic(settings_path, json.dumps(settings, indent=1) + "\n")


class SamplesLog(JsonlLog):
    """`out/settings.json` + `out/samples.jsonl`: what an evaluation is, and every unit it has finished.

    On opening, a directory that holds finished units of an evaluation with other settings is refused with one line
    naming the keys that differ; a directory without finished units (new, or left by a run that failed before its
    first unit) gets `settings` written. The rows an interrupted run finished are read back (a last line
    cut off mid-write is skipped; a broken line elsewhere is an error), filtered by `keep` (e.g. "only whole cells")
    and rewritten, so `self.rows` is exactly what the evaluation need not redo; `append` logs finished rows at once.
    Use as a context manager, or call `close()`. Leaving the context with an error before any row was logged (a
    model that cannot be opened) removes the directory again if this log created it: a failed start leaves no --out.
    """

    def __init__(self, out_dir: str | Path, settings: dict[str, Any],
                 keep: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None) -> None:
        self.out = Path(out_dir)
        self._created = next((f for f in (*reversed(self.out.parents), self.out) if not f.exists()), None)
        self._held = contextlib.ExitStack()
        self._held.enter_context(claim(self.out))  # one writer per folder (tapecli.store.claim); creates it
        try:
            path = self.out / SAMPLES_FILE
            started = path.is_file() and path.stat().st_size > 0
            claim_settings(self.out, settings, started=started, stale=[SAMPLES_FILE])
            super().__init__(path, keep)
        except BaseException:
            self._held.close()
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._held.close()

    def __exit__(self, kind: type | None, *exc: object) -> None:
        self.close()
        if kind is not None and self._created is not None and not self.rows:
            shutil.rmtree(self._created, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# Generation and progress


class NonFiniteLogits(TapeError):
    """Generation met logits that hold a NaN or an infinity (`generate_batch`); the runner
    (`tapecli.eval.protocol`) names the model and the unit."""


def generate_batch(model: Any, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 8,
                   stop_tokens: list[int] | None = None, pad_id: int | None = None, temperature: float = 0.0,
                   top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                   stop_check: Callable[[list[int]], bool] | None = None) -> list[list[int]]:
    """Continuations (new tokens only, `max_new_tokens` each, padded with `pad_id` after a stop token) of
    token-id prompts, in the order given: greedy, or sampled when temperature > 0 (`seed` seeds every batch).
    `stop_check(new tokens of one row) -> bool` also stops a row (e.g. once its text holds a stop string).

    Prompts are decoded `batch_size` at a time, in the order given, with the KV cache; prompts of different lengths
    in one batch are left-padded and masked, so each row generates what it generates alone (`Transformer.generate`).
    This is the one place evaluations call `Transformer.generate`. Logits that hold a NaN or an infinity (the
    prompt's or any step's) raise `NonFiniteLogits`: greedy decoding would turn them into a token and the score into
    a meaningless number.
    """
    import torch

    device = next(model.parameters()).device
    step = [0]

    def finite(module, args, logits):
        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteLogits(f"its logits are not finite (NaN or infinity) at generation step {step[0]} (0: the "
                                  "prompt)")
        step[0] += 1
    fill = pad_id if pad_id is not None else (stop_tokens[0] if stop_tokens else 0)
    outputs: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        longest = max(len(p) for p in chunk)
        input_ids = torch.tensor([[fill] * (longest - len(p)) + p for p in chunk], dtype=torch.long, device=device)
        mask = None
        if any(len(p) < longest for p in chunk):
            mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in chunk], device=device)
        rows_stop = None if stop_check is None else (
            lambda new: torch.tensor([stop_check(row) for row in new.tolist()], dtype=torch.bool))
        step[0] = 0
        head = getattr(model, "lm_head", None)  # a stand-in model (tests) may have none
        hook = head.register_forward_hook(finite) if isinstance(head, torch.nn.Module) else None
        try:
            with torch.inference_mode():
                tokens = model.generate(input_ids, max_new_tokens=max_new_tokens, use_cache=True,
                                        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                        stop_tokens=stop_tokens, pad_id=pad_id, attention_mask=mask,
                                        stop_check=rows_stop)
        finally:
            if hook is not None:
                hook.remove()
        outputs += [(row + [fill] * max_new_tokens)[:max_new_tokens] for row in tokens[:, longest:].tolist()]
    return outputs


def generate_texts(opened: Any, prompts: list[str], batch_size: int, max_new_tokens: int,
                   stop_check: Callable[[list[int]], bool] | None = None) -> list[str]:
    """Greedy continuations of prompt texts (after the tokenizer's default special tokens), cut at EOS, decoded and
    stripped: what the long-context evaluations score."""
    tokenizer = opened.tokenizer
    eos = getattr(tokenizer, "eos_id", None)
    stop = [eos] if eos is not None and eos >= 0 else None
    ids = [tokenizer.encode(p, add_special_tokens=True) for p in prompts]
    outputs = generate_batch(opened.model, ids, max_new_tokens, batch_size=batch_size, stop_tokens=stop,
                             pad_id=eos if stop else None, stop_check=stop_check)
    texts = []
    for output in outputs:
        if stop and eos in output:
            output = output[: output.index(eos)]
        texts.append(tokenizer.decode(output).strip())
    return texts


def per_tokenizer(cache: dict[Any, Any], tokenizer: Any, make: Callable[[], Any]) -> Any:
    """What `make()` builds for `tokenizer` (a sample generator, generated samples), built once per distinct
    tokenizer: models whose tokenizers have one fingerprint (`tokenizer_fingerprint`: the same ids for every text)
    share it. The fingerprint, which saves the tokenizer to hash it, is computed once per tokenizer object; `cache`
    keeps that object, so its id cannot be reused by another tokenizer while the cache lives."""
    from tapecli.data.tokenizer import tokenizer_fingerprint

    fingerprints = cache.setdefault("fingerprints", {})  # id -> (tokenizer, fingerprint); fingerprints are hex
    held = fingerprints.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        held = fingerprints[id(tokenizer)] = (tokenizer, tokenizer_fingerprint(tokenizer))
    if held[1] not in cache:
        cache[held[1]] = make()
    return cache[held[1]]


@contextmanager
def progress_bar(unit: str, show: bool = True) -> Iterator[Progress]:
    """Rich progress bars, one per task added: its description, bar, done/total `unit`, elapsed and remaining time
    (all hidden when not `show`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                        TimeElapsedColumn(), TimeRemainingColumn(), disable=not show)
    with progress:
        yield progress
