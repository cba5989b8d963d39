"""The interface every positional encoding implements, and the helpers several of them share.

A PE has two parts:
- a model-level `PositionalEncoding`, run once per forward: it picks the token positions and builds the
  initial `PositionState` (e.g. RoPE's cos/sin);
- one `LayerPE` per decoder layer, held by the block as `pe` (so its parameters are named
  `model.layers.{i}.pe.*`): it rotates queries/keys, declares what else it needs from attention (`need`: a logit
  bias, wider values, or attention of its own; `tapecli.model.attention.needs`) and, for TAPE, updates the
  positional state after attention and after the MLP.
The defaults do nothing, which is exactly NoPE.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from tapecli.model.attention.needs import Need


@dataclass
class PositionState:
    """What travels beside the hidden state through the layers.

    positions: [B or 1, T] absolute positions of the current tokens (int64).
    rotary:    [B or 1, H or 1, T, head_dim] or None. The first half holds the cos-part and the second half the
               sin-part of each rotary pair (i, i + head_dim/2), i.e. Llama's half-split pairing. For RoPE it is
               fixed; for TAPE it is the positional state E that every layer updates.
    scale:     [B or 1, 1, T, head_dim] or None; xPos's per-position scale for queries (keys use 1/scale).
    """

    positions: Tensor
    rotary: Tensor | None = None
    scale: Tensor | None = None

    def replace(self, **changes) -> PositionState:
        return replace(self, **changes)

    def slice(self, start: int, end: int) -> PositionState:
        """The state of tokens start..end-1 (e.g. one chunk of a prompt prefilled in pieces)."""
        def cut(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[..., start:end, :]

        return PositionState(positions=self.positions[..., start:end], rotary=cut(self.rotary), scale=cut(self.scale))


def apply_rotary(x: Tensor, rotary: Tensor) -> Tensor:
    """Rotate each half-split pair (x_i, x_{i+d/2}) by the 2x2 map [[c, -s], [s, c]] held in `rotary`.

    Identical, operation for operation, to Llama's `x * cos + rotate_half(x) * sin`.
    """
    half = x.shape[-1] // 2
    cos, sin = rotary[..., :half], rotary[..., half:]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def default_positions(batch: int, seq_len: int, start_pos: int | Tensor, device: torch.device,
                      attention_mask: Tensor | None = None) -> Tensor:
    """Positions [1, T] = start_pos + 0..T-1; with a 0/1 `attention_mask` [B, T] they count only real tokens, so
    each row's first real token sits at start_pos (an int, or [B] per row) and padding repeats its neighbour's."""
    if attention_mask is None and not isinstance(start_pos, Tensor):
        return torch.arange(start_pos, start_pos + seq_len, device=device).unsqueeze(0)
    if attention_mask is None:
        counted = torch.arange(seq_len, device=device).unsqueeze(0)
    else:
        counted = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    offset = start_pos.to(device).view(-1, 1) if isinstance(start_pos, Tensor) else start_pos
    return counted + offset


class LayerPE(nn.Module):
    """Per-layer part of a PE. Every hook is optional; the defaults leave attention untouched."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        """Encode positions into queries [B, H, T, d] and keys [B, H or H_kv, T, d] of the current tokens."""
        return q, k

    def need(self, state: PositionState, average_state: bool) -> Need:
        """What attention must do beyond softmax(q.k / sqrt(d)) v for the current tokens (`state`): None (nothing,
        the default), a `ScoreBias`, a `WideValue` or an `OwnAttention` (tapecli.model.attention.needs).
        `average_state`: the block wants the positional state averaged by attention too (TAPE's update)."""
        return None

    def init_weights(self) -> None:
        """Called after the model's generic initialisation; PEs with special inits (TAPE's zeros) override it."""


class PositionalEncoding(nn.Module):
    """Model-level part of a PE. Subclasses take their hyperparameters (`pe_args`) as keyword-only arguments."""

    # True for PEs whose state changes from layer to layer (TAPE): the blocks update it and the KV cache keeps each
    # layer's state of past tokens. `aggregation` (concat | separate) says how attention also averages it.
    carries_state = False
    aggregation: str | None = None
    # The per-layer attention options (model.temperature, model.window) this PE's layers honour. Attention
    # (`tapecli.model.attention`) implements both for every PE it computes; a PE whose layers compute attention
    # themselves (`OwnAttention`) lists those it implements, and the model refuses the others when it is built.
    attention_options: frozenset[str] = frozenset({"temperature", "window"})

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    def positions(self, batch: int, seq_len: int, start_pos: int | Tensor, device: torch.device,
                  attention_mask: Tensor | None = None) -> Tensor:
        return default_positions(batch, seq_len, start_pos, device, attention_mask)

    def cache_key(self, positions: Tensor) -> object:
        """What, besides each token's own position, the encoding of keys depends on. Cached keys stay valid only
        while it is unchanged: None (never changes) except for RoPE's dynamic NTK scaling."""
        return None

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        """State entering layer 0; `dtype` is the model's parameter dtype (fp64 models get fp64 states)."""
        return PositionState(positions=positions)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return LayerPE()


def check_positive_int(key: str, value: object) -> None:
    """A width or count in pe_args: a whole number >= 1 (0 is not "the default")."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model.pe_args.{key}: must be a positive integer, got {value!r}")


def check_pe_args(cls: type, name: str, pe_args: dict) -> dict:
    """Validate `pe_args` against the keyword-only parameters of `cls.__init__` (and its parents).

    Numbers are coerced to the default's type (an int theta becomes a float), so YAML and CLI values just work.
    """
    allowed: dict[str, inspect.Parameter] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY:
                allowed[p.name] = p
    checked = {}
    for key, value in pe_args.items():
        if key not in allowed:
            options = ", ".join(sorted(allowed)) or "(none)"
            raise ValueError(f"model.pe_args.{key}: not an argument of pe {name!r}; allowed: {options}")
        default = allowed[key].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"model.pe_args.{key}: expected true or false, got {value!r}")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif isinstance(default, (int, float)) and not isinstance(default, bool) and value is not None:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"model.pe_args.{key}: expected a number, got {value!r}")
        checked[key] = value
    return checked
