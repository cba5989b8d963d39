"""The KV cache: what causal attention needs from past tokens, in buffers allocated once, not copied per token.

Per layer it holds the (already position-encoded) keys and the values of past tokens; for TAPE the values are
[V | E], E being that layer's positional state of past tokens, which causal attention never changes; for PaTH the
keys are transformed by every later token's map, so PaTH rewrites them in place at each call. For the whole
model it holds each past token's position (bias PEs need them), which past tokens are padding (left-padded
batches), Abacus's running digit count, and the PE's `cache_key` the keys were encoded under (dynamic NTK).

Buffers are [B, H, capacity, d] along the token axis, allocated at the first write with `capacity` (or what that
write needs); writes go in place, and reads are views of the filled part. Only when a write outgrows the capacity
is everything copied once, into buffers twice as long, so even an unsized cache costs amortised O(1) per token.

A layer with a sliding window of W keys (`windows`, one entry per layer, None for global layers) keeps only what
its queries can still see: the last W - 1 tokens before the current ones, plus those. Its buffers hold 2 W tokens
(or W - 1 plus a longer chunk); when a write would overflow them, the last W - 1 tokens move to the front (one copy
every W or so tokens: amortised O(1) per token), so its memory stays O(W) however long generation runs. Its reads
are the last `len(read)` tokens; attention takes the positions of those. This needs padding only before a row's
real tokens (generation's left padding), where the last W - 1 tokens hold every key a window can reach.

    cache = KVCache(n_layers, capacity=prompt_len + max_new_tokens, windows=[None, 1024, ...])
    model(prompt, cache=cache)                           # prefill
    model(next_token, start_pos=prompt_len, cache=cache) # one step
"""

from __future__ import annotations

import torch
from torch import Tensor


def write(buffer: Tensor | None, new: Tensor, start: int, capacity: int) -> Tensor:
    """Write `new` at token index `start` (dim -2 for 4-D tensors, else -1) of `buffer`, (re)allocating it when it
    is missing or too short; returns the buffer."""
    axis = new.dim() - 2 if new.dim() == 4 else new.dim() - 1
    end = start + new.shape[axis]
    if buffer is None or buffer.shape[axis] < end:
        size = max(end, capacity, 0 if buffer is None else 2 * buffer.shape[axis])
        shape = list(new.shape)
        shape[axis] = size
        grown = new.new_empty(shape)
        if buffer is not None:
            grown.narrow(axis, 0, start).copy_(buffer.narrow(axis, 0, start))
        buffer = grown
    buffer.narrow(axis, start, end - start).copy_(new)
    return buffer


class LayerCache:
    """One layer's past keys and values, plus `state`: fixed-size tensors a PE carries from call to call (PaTH's
    short-convolution tail), replaced, not appended to. `window`: the layer's sliding window (None: global);
    `first`: the token index of the oldest token its buffers hold."""

    def __init__(self, owner: KVCache, window: int | None = None) -> None:
        self.owner = owner
        self.window = window
        self.first = 0
        self.buffers: dict[str, Tensor] = {}
        self.state: dict[str, Tensor] = {}

    def append(self, **new: Tensor) -> list[Tensor]:
        """Store the current tokens' tensors ([B, H, T, d] each, e.g. k=..., v=...) after the past ones; returns,
        in the same order, views of the tokens kept and current ([B, H, past + T, d], for a windowed layer the last
        W - 1 + T at least)."""
        end = len(self.owner)
        T = next(iter(new.values())).shape[2]
        if self.window is not None:
            self.slide(end - T, T)
        out = []
        for name, tensor in new.items():
            capacity = self.owner.capacity if self.window is None else max(2 * self.window, self.window - 1 + T)
            self.buffers[name] = write(self.buffers.get(name), tensor, end - T - self.first, capacity)
            out.append(self.buffers[name][:, :, :end - self.first])
        return out

    def slide(self, start: int, count: int) -> None:
        """Before writing `count` tokens at token index `start`: when they would overflow the buffers, drop the
        tokens no query from `start` on can see (all but the last window - 1), moving the kept ones to the front."""
        keep = max(self.first, start - (self.window - 1))
        held = next(iter(self.buffers.values()), None)
        if held is None or keep == self.first or start + count - self.first <= held.shape[2]:
            return
        for buffer in self.buffers.values():
            kept = buffer[:, :, keep - self.first:start - self.first].clone()
            buffer[:, :, :kept.shape[2]] = kept
        self.first = keep


class KVCache:
    def __init__(self, n_layers: int, capacity: int = 0, windows: list[int | None] | None = None) -> None:
        self.capacity = capacity  # tokens to allocate for at the first write (grows by doubling past it)
        self.layers = [LayerCache(self, None if windows is None else windows[i]) for i in range(n_layers)]
        self.length = 0
        self.positions: Tensor | None = None  # [B, capacity]
        self.key_mask: Tensor | None = None  # [B, capacity], False for padding; None while no padding was seen
        self.abacus_run: Tensor | None = None  # length of the digit run at the last cached token
        self.pe_key: object = None  # the PE's cache_key when the keys were encoded

    def __len__(self) -> int:
        return self.length

    def extend(self, positions: Tensor, attention_mask: Tensor | None, batch: int) -> tuple[Tensor, Tensor | None]:
        """Register T new tokens (positions [B or 1, T], 0/1 mask [B, T] or None); returns the positions [B, L]
        and the key mask [B, L] (None without padding) of all L = past + T tokens. The layers then append their
        keys and values of the new tokens."""
        start, T = self.length, positions.shape[-1]
        self.length = start + T
        self.positions = write(self.positions, positions.expand(batch, T), start, self.capacity)
        if attention_mask is not None and self.key_mask is None:
            self.key_mask = torch.ones_like(self.positions, dtype=torch.bool)
        if self.key_mask is not None:
            real = torch.ones(batch, T, dtype=torch.bool, device=positions.device) if attention_mask is None \
                else attention_mask.bool()
            self.key_mask = write(self.key_mask, real, start, self.capacity)
        key_mask = None if self.key_mask is None else self.key_mask[:, :self.length]
        return self.positions[:, :self.length], key_mask

    def reset(self) -> None:
        """Forget every token but keep the buffers (e.g. to re-encode the whole sequence)."""
        self.length, self.key_mask, self.abacus_run, self.pe_key = 0, None, None, None
        for layer in self.layers:
            layer.state.clear()
            layer.first = 0
