"""The positional-encoding API: everything a PE file may use, and the contract of every hook.

This is the one module a PE imports tape from. The built-in PEs (this package; `registry.BUILTINS`) use nothing
else of tape, and `tapecli.pe` re-exports the names a PE uses as the stable import location for PEs written outside
the package (plugins: docs/pe-api.md; `check_pe_args` and `pe_arguments` are the registry's). Shapes: B batch,
T current tokens, H query heads, G key/value heads (G divides H), d head_dim (even), V vocabulary.

A PE has two parts:
- a model-level `PositionalEncoding`, built once per model from `ModelConfig` and its `pe_args` (keyword-only
  arguments of `__init__`), held as `model.model.pe`. Once per forward it picks the positions of the current tokens
  (`positions`) and builds the `PositionState` entering layer 0 (`initial_state`);
- one `LayerPE` per decoder layer (`make_layer`), held by the block as `pe`, so its parameters are named
  `model.layers.{i}.pe.*`. In every layer it may rotate queries and keys (`rotate`), declare what else attention
  must do (`need`: a logit bias, wider values, or attention of its own) and, for PEs that carry a state from layer
  to layer (TAPE), update that state after attention and after the MLP.
Every hook has a default that does nothing, which is exactly NoPE.

The KV cache (`tapecli.model.cache`) keeps, per layer, the keys as `rotate` returned them and the values (for a
`WideValue` need, [V | extra columns]); for the whole model, every past token's position and padding. So a PE is
cache-correct when a token's rotated key and its bias never change once computed: positions come from `positions`
(start_pos counts the cached tokens), biases are functions of (query position, key position). A PE whose key
encoding depends on more than each token's own position says so through `cache_key`. `LayerCache.state` holds
fixed-size tensors a PE carries from call to call itself (PaTH's convolution tail).

Attention (`tapecli.model.attention`) picks the path for the device: SDPA's fused kernels, the CPU's chunked path,
FlexAttention on CUDA, or a dense path with every score materialised (decoding steps, and the reference that
`attention.forced("dense")` selects). Every path is exact, so a PE written against this contract is right on all of
them; `tape pe check` verifies it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from tapecli.model.attention import attend, chunked, flex, forced_path, probe
from tapecli.model.attention.needs import Need, OwnAttention, ScoreBias, ScoreMod, WideValue
from tapecli.model.attention.recompute import by_query_chunks, rows_for
from tapecli.model.cache import LayerCache

CLAIMS = ("shift-invariance", "rotation-equivariance")
"""What a PE may declare in `PositionalEncoding.claims`, for `tape pe check` to verify (in eval mode, fp64):
shift-invariance: the logits do not change when every position moves by the same amount (start_pos 0 vs s), as
    for relative PEs;
rotation-equivariance: rotating every rotary pair of the initial state by one angle per pair leaves the token
    outputs unchanged and rotates the final state the same way (TAPE's equivariance; needs `rotary`)."""


@dataclass
class PositionState:
    """What travels beside the hidden state through the layers.

    positions: [B or 1, T] absolute positions of the current tokens (int64).
    rotary:    [B or 1, H or 1, T, d] or None. The first half holds the cos-part and the second half the sin-part of
               each rotary pair (i, i + d/2), i.e. Llama's half-split pairing. For RoPE it is fixed; for TAPE it is
               the positional state E that every layer updates. Computed in fp32 (fp64 for fp64 models).
    scale:     [B or 1, 1, T, d] or None; xPos's per-position scale for queries (keys use 1/scale).
    A subclass may add fields; every field but `positions` is a tensor [..., T, d] (or None), so that `slice` cuts it.
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

        changes = {f.name: cut(getattr(self, f.name)) for f in fields(self) if f.name != "positions"}
        return replace(self, positions=self.positions[..., start:end], **changes)


def apply_rotary(x: Tensor, rotary: Tensor) -> Tensor:
    """Rotate each half-split pair (x_i, x_{i+d/2}) of x [..., T, d] by the 2x2 map [[c, -s], [s, c]] held in
    `rotary` [..., T, d] (broadcast over batch and heads); returns x's dtype.

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
    """Per-layer part of a PE. Every hook is optional; the defaults leave attention untouched.

    Calls per layer and forward, in order: rotate -> need -> (attention) -> after_attention (only when the need was
    a WideValue) -> (MLP) -> after_mlp (only for PEs with `carries_state`). Under bf16 autocast q and k arrive in
    bf16; the state keeps the dtype `initial_state` gave it unless a hook changes it."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        """Encode positions into queries [B, H, T, d] and keys [B, G, T, d] of the current tokens; return them in
        the same shapes (keys may come back expanded to H heads, as TAPE's do) and the activation dtype. The KV
        cache stores the keys returned here: they must not depend on later tokens."""
        return q, k

    def need(self, state: PositionState, average_state: bool) -> Need:
        """What attention must do beyond softmax(q.k / sqrt(d)) v for the current tokens (`state`): None (nothing,
        the default), a `ScoreBias`, a `WideValue` or an `OwnAttention` (their docstrings state their contracts).
        `average_state`: the block wants the positional state averaged by attention too (TAPE's update)."""
        return None

    def after_attention(self, state: PositionState, aggregated: Tensor) -> PositionState:
        """After attention, for a `WideValue` need: `aggregated` [B, H, T, e] is the extra columns averaged with the
        attention weights, in the columns' dtype; returns the next state (TAPE: E <- E + P(A E))."""
        return state

    def after_mlp(self, state: PositionState, mlp_in: Tensor, mlp_out: Tensor, hidden: Tensor) -> PositionState:
        """After the MLP, for PEs with `carries_state`: the MLP's normalised input, its output and the hidden state
        after the block, each [B, T, dim]; returns the state the next layer receives."""
        return state

    def init_weights(self) -> None:
        """Called after the model's generic initialisation (N(0, init_std) for every nn.Linear and nn.Embedding,
        this layer's included); PEs with special inits (TAPE's zeros) override it."""


class PositionalEncoding(nn.Module):
    """Model-level part of a PE. Subclasses take their hyperparameters (`model.pe_args`) as keyword-only arguments
    of `__init__(self, config, *, ...)` with defaults; `tape pe list` shows them and `check_pe_args` validates a
    recipe's values against them (numbers coerced to the default's type). Raise ValueError naming
    `model.pe_args.<key>` for a bad value."""

    # True for PEs whose state changes from layer to layer (TAPE): the blocks call after_attention/after_mlp and the
    # KV cache keeps each layer's state of past tokens. `aggregation` (concat | separate) says how attention also
    # averages it. The state is dropped after the last layer, whose updates are skipped and frozen.
    carries_state = False
    aggregation: str | None = None
    # What `tape pe check` verifies beyond the contract (CLAIMS); set per instance when it depends on pe_args.
    claims: tuple[str, ...] = ()
    # The per-layer attention options (model.temperature, model.window, model.sinks) this PE's layers honour.
    # Attention (`tapecli.model.attention`) implements them for every PE it computes; a PE whose layers compute
    # attention themselves (`OwnAttention`) lists those it implements, and the model refuses the others when it is
    # built.
    attention_options: frozenset[str] = frozenset({"temperature", "window", "sinks"})

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    def positions(self, batch: int, seq_len: int, start_pos: int | Tensor, device: torch.device,
                  attention_mask: Tensor | None = None) -> Tensor:
        """Positions [B or 1, T] (int64) of the current tokens; start_pos is the number of earlier tokens of the
        sequence (cached ones included), an int or [B]. Training-time randomness must check `self.training`."""
        return default_positions(batch, seq_len, start_pos, device, attention_mask)

    def cache_key(self, positions: Tensor) -> object:
        """What, besides each token's own position, the encoding of keys depends on. Cached keys stay valid only
        while it is unchanged: None (never changes) except for RoPE's dynamic NTK scaling."""
        return None

    def resolved_args(self) -> dict[str, Any]:
        """pe_args whose default this PE resolved from the model (CoPE's npos_max, from max_seq_len) and which the
        model's config records beside the given ones (model.pe_args, or the PE's schedule kind), so that a later
        version's default cannot change what a saved model means. Default: none."""
        return {}

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        """State entering layer 0; `dtype` is the model's parameter dtype (fp64 models get fp64 states)."""
        return PositionState(positions=positions)

    def make_layer(self, layer_idx: int) -> LayerPE:
        """The LayerPE of layer `layer_idx` (0-based); a fresh module per layer (parameters are per layer)."""
        return LayerPE()

    def hf_export(self) -> dict[str, Any] | None:
        """The entries of a Hugging Face LlamaConfig that make transformers' Llama compute exactly this PE
        (`rope_parameters`, `max_position_embeddings`), or None: `tape export` refuses the model (a ValueError naming
        the pe_args key it cannot express is that one line). Only the class that defines it can export: a subclass
        does not inherit it (xPos is not RoPE)."""
        return None



def kernels_available() -> dict[str, bool]:
    """Which of tape's attention kernels run in this process: {"chunked": the CPU's chunked flash kernel (padding
    and cached keys), "flex": FlexAttention (CUDA)}. An `OwnAttention` PE's `plan` names its path from these."""
    return {"chunked": chunked.kernel_available(), "flex": flex.flex_available()}


@functools.cache
def optional_kernel(module: str, name: str) -> Any | None:
    """`name` from the optional package `module` (a fused GPU kernel: `optional_kernel("fla.ops.path_attn.parallel",
    "parallel_path_attention")` is flash-linear-attention's PaTH), or None when it is not installed or fails to import
    (a broken build can raise more than ImportError). Imported once per process; a PE falls back to its own path."""
    try:  # optional GPU kernel
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001
        return None


def plain_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, scale: float) -> Tensor:
    """Exact causal softmax(q.k * scale) v for an `OwnAttention` PE whose logits fit in q.k (FoX widens its heads by
    one column): queries q [B, H, Tq, d] are the last Tq of the keys k, v [B, H, Tk, e]; `key_mask` [B, Tk] hides
    padding (a padded query still sees itself). SDPA's fused causal kernel for a whole unpadded sequence, else the
    chunked path (linear memory on the CPU). While attention is probed, the weights are formed and reported a
    chunk of queries at a time (`probe.probed_attention`), so such a PE reports its weights through this call."""
    Tq, Tk = q.shape[2], k.shape[2]
    if probe.active():
        positions = torch.arange(Tk, device=q.device)[None]
        return probe.probed_attention(q, k, v, None, positions[:, Tk - Tq:], positions, key_mask, scale, True)
    if key_mask is None and Tq == Tk:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    positions = torch.arange(Tk, device=q.device)[None]  # only which keys are consecutive: there is no bias
    return chunked.chunked_attention(q, k, v, None, positions[:, Tk - Tq:], positions, key_mask, scale)


def flex_attention(q: Tensor, k: Tensor, v: Tensor, score_mod, key_mask: Tensor | None, scale: float) -> Tensor:
    """FlexAttention (CUDA) with the PE's `score_mod(score, b, h, q_idx, kv_idx)` and causality, padding
    (`key_mask` [B, Tk]) and cached keys (q [B, H, Tq, d] are the last Tq of k, v [B, G, Tk, d]) as a block mask."""
    mask = flex.block_mask(q.shape[0], q.shape[2], k.shape[2], key_mask, q.device)
    return flex.compiled_flex()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale,
                                enable_gqa=k.shape[1] != q.shape[1])


def encoded_attention(q: Tensor, k: Tensor, v: Tensor, *, x: Tensor, q_pos: Tensor, k_pos: Tensor,
                      key_mask: Tensor | None, window: int | None = None, temperature: float = 1.0) -> Tensor:
    """Attention of queries and keys the PE has already encoded (no bias), on the path tape picks for the device,
    as for RoPE: for an `OwnAttention` PE that computes only its encoding itself (MapWM's content-dependent
    rotation). q [B, H, Tq, d]; k, v [B, G, Tk, d] (the cache's buffers, current tokens last); q_pos, k_pos
    [B|1, Tq], [B|1, Tk]; `window` and `temperature` as the layer's attention options."""
    return attend(q, k, v, None, x=x, q_pos=q_pos, k_pos=k_pos, key_mask=key_mask, cache=None, window=window,
                  temperature=temperature)


def probing_active() -> bool:
    """Whether attention is being probed (`tape analyze attention`, `tapecli.model.attention.probe`): an
    `OwnAttention` PE that declares `reports_weights` then hands its weights to `report_weights`."""
    return probe.active()


def report_weights(weights: Tensor, first: int, **extras: Tensor) -> None:
    """While probing: one chunk of queries' attention weights [B, H, C, K] in key order, `first` the key index of
    its first query, with PE-specific extras of the same shape (CoPE's contextual positions)."""
    probe.report(weights, first, **extras)

def check_positive_int(key: str, value: object) -> None:
    """A width or count in pe_args: a whole number >= 1 (0 is not "the default")."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"model.pe_args.{key}: must be a positive integer, got {value!r}")


def check_range(key: str, value: float, low: float, *, inclusive: bool = False, what: str = "") -> None:
    """A number in pe_args above `low` (or at least it, `inclusive`), and finite: ValueError naming the key, the
    value and the range (`what` says what the key is, for the message)."""
    ok = value >= low if inclusive else value > low
    if not (ok and math.isfinite(value)):
        sign = ">=" if inclusive else ">"
        raise ValueError(f"model.pe_args.{key}: must be a finite number {sign} {low:g}{what}, got {value!r}")


def pe_arguments(cls: type) -> dict[str, inspect.Parameter]:
    """The `pe_args` a PE class accepts: the keyword-only parameters of `__init__` of the class and its parents."""
    allowed: dict[str, inspect.Parameter] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY:
                allowed[p.name] = p
    return allowed


def check_pe_args(cls: type, name: str, pe_args: dict) -> dict:
    """Validate `pe_args` against `pe_arguments(cls)`.

    Numbers are coerced to the default's type (an int theta becomes a float), so YAML and CLI values just work.
    """
    allowed = pe_arguments(cls)
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
        if isinstance(value, float) and not math.isfinite(value):  # nan and inf: no PE means anything by them
            raise ValueError(f"model.pe_args.{key}: must be a finite number, got {value!r}")
        checked[key] = value
    return checked


__all__ = ["CLAIMS", "LayerCache", "LayerPE", "Need", "OwnAttention", "PositionState", "PositionalEncoding",
           "ScoreBias", "ScoreMod", "WideValue", "apply_rotary", "by_query_chunks", "check_pe_args",
           "check_positive_int", "check_range", "default_positions", "encoded_attention", "flex_attention",
           "forced_path", "kernels_available", "pe_arguments", "plain_attention", "probing_active", "report_weights",
           "rows_for"]
