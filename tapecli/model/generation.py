"""Generation: greedy or sampled decoding of a batch of prompts of different lengths, with a KV cache.

    out = model.generate(input_ids, max_new_tokens, use_cache=True, temperature=0.0, top_k=None, top_p=None,
                         seed=None, stop_tokens=None, pad_id=None, start_pos=0, attention_mask=None,
                         prefill_chunk=None)

- `input_ids` [B, T]: prompts, LEFT-padded to a common length when they differ; `attention_mask` [B, T] marks real
  tokens with 1 and padding with 0 (None: nothing is padded). Every row's first real token is at position
  `start_pos`, so each row generates exactly what it generates alone (same greedy tokens; logits equal up to float
  rounding of the different attention shapes; sampling draws from one generator for the whole batch).
- Returns [B, T + n], n <= max_new_tokens: the input as given (padding included, unchanged) followed by the new
  tokens. A row that emitted one of `stop_tokens` continues with `pad_id` (default: the first stop token) until
  every row has stopped; decoding ends early then, so n < max_new_tokens only when all rows stopped.
- Greedy when temperature == 0, else a draw from softmax(logits / temperature) restricted to top_k / top_p, with
  a generator seeded by `seed`.
- `stop_check(new_tokens [B, n]) -> bool [B]`, called after every step, finishes the rows it marks as a stop
  token does (e.g. when the decoded text holds a stop string).
- `use_cache=False` recomputes the whole sequence every step: the reference the cache is tested against.
- `prefill_chunk=N` runs the prompt through the cache N tokens at a time, so attention (and a bias PE's bias) is
  [N x T] at a time, never [T x T]; every chunk uses the positional state of the whole prompt, so the result is the
  one-shot prefill's. Needs the cache.
- Dynamic NTK scaling changes every key's rotation once the sequence outgrows the original context: when the PE's
  `cache_key` changes, the cache is rebuilt from all tokens so far, so cached decoding equals recomputation (and
  costs what it does, one full forward per token, past the original context).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tapecli.model.cache import KVCache


def check_left_padded(input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
    """The mask as bool, or None when nothing is padded; ValueError unless it is 0/1, [B, T] and left-padded."""
    if attention_mask is None:
        return None
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask: shape {tuple(attention_mask.shape)} differs from input_ids "
                         f"{tuple(input_ids.shape)}")
    if not ((attention_mask == 0) | (attention_mask == 1)).all():
        raise ValueError("attention_mask: values must be 0 (padding) or 1 (real token)")
    mask = attention_mask.bool()
    if not mask[:, -1].all() or (mask[:, 1:] < mask[:, :-1]).any():
        raise ValueError("attention_mask: generation needs left padding (each row: zeros, then at least one one)")
    return None if mask.all() else mask


def prefill(model, tokens: Tensor, mask: Tensor | None, start_pos: int, cache: KVCache | None,
            chunk: int | None) -> Tensor:
    """Run every token (through `cache` when given, `chunk` tokens at a time); the last token's logits [B, V]."""
    if cache is None or not chunk or tokens.shape[1] <= chunk:
        hidden, _ = model.run(tokens, start_pos, cache, attention_mask=mask)
        return model.lm_head(hidden[:, -1])
    pe = model.model.pe
    positions = pe.positions(tokens.shape[0], tokens.shape[1], start_pos, tokens.device, mask)
    state = pe.initial_state(positions, model.model.embed_tokens.weight.dtype)
    cache.pe_key = pe.cache_key(positions)
    for s in range(0, tokens.shape[1], chunk):
        part_mask = None if mask is None else mask[:, s:s + chunk]
        hidden, _ = model.run(tokens[:, s:s + chunk], cache=cache, state=state.slice(s, s + chunk),
                              attention_mask=part_mask)
    return model.lm_head(hidden[:, -1])


@torch.no_grad()
def generate(model, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
             stop_tokens: list[int] | None = None, pad_id: int | None = None, start_pos: int = 0,
             attention_mask: Tensor | None = None, prefill_chunk: int | None = None,
             stop_check: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    if prefill_chunk is not None and (not use_cache or prefill_chunk < 1):
        raise ValueError(f"prefill_chunk: {prefill_chunk} needs use_cache=True and a positive number of tokens")
    mask = check_left_padded(input_ids, attention_mask)
    was_training = model.training
    model.eval()
    device, B = input_ids.device, input_ids.shape[0]
    generator = None
    if temperature > 0 and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    stop = torch.tensor(stop_tokens or [], dtype=torch.long, device=device)
    pad = pad_id if pad_id is not None else (stop_tokens[0] if stop_tokens else 0)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    cache = model.new_cache(capacity=input_ids.shape[1] + max_new_tokens) if use_cache else None
    # Position of the next token in each row: start_pos + the row's real tokens so far.
    next_pos = start_pos + (mask.sum(-1) if mask is not None else torch.full((B,), input_ids.shape[1],
                                                                                device=device))
    tokens = input_ids
    logits = prefill(model, tokens, mask, start_pos, cache, prefill_chunk) if max_new_tokens > 0 else None
    for step in range(max_new_tokens):
        next_token = sample_next(logits.float(), temperature, top_k, top_p, generator)
        next_token = torch.where(finished, torch.full_like(next_token, pad), next_token)
        finished |= torch.isin(next_token, stop)
        tokens = torch.cat((tokens, next_token[:, None]), dim=1)
        if stop_check is not None:
            finished |= stop_check(tokens[:, input_ids.shape[1]:]).to(device)
        if mask is not None:
            mask = torch.cat((mask, torch.ones_like(mask[:, :1])), dim=1)
        if finished.all() or step == max_new_tokens - 1:
            break
        if cache is not None and model.model.pe.cache_key(next_pos[:, None]) == cache.pe_key:
            hidden, _ = model.run(next_token[:, None], next_pos, cache)
            logits = model.lm_head(hidden[:, -1])
        else:  # no cache, or dynamic NTK moved every key: recompute all tokens so far
            if cache is not None:
                cache.reset()
            logits = prefill(model, tokens, mask, start_pos, cache, prefill_chunk)
        next_pos = next_pos + 1
    model.train(was_training)
    return tokens


def sample_next(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> Tensor:
    """Greedy argmax, or a draw from softmax(logits / temperature) restricted to the top-k / top-p tokens."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
