"""Deliberately broken positional encodings, each failing exactly one check of `tape pe check` (the check's name is
in BROKEN). Written as a plugin file against `tapecli.pe` only, and checked as `tests/pe/broken_pes.py:CLASS`.

Each bug is one PE code has in the wild, made small: attention that ignores causality, positions of cached steps
taken from the step's own length, a mask that forgets the cached tokens, a fast path that differs from the
reference, a FlexAttention form whose gradient FlexAttention cannot take, padding assumed on the left, statistics
across the batch, state drawn at random and not saved, arithmetic that needs fp32, a detached parameter, code that
behaves differently under torch.compile, and claims a PE does not keep.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tapecli.pe import (
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    RoPE,
    RotaryLayer,
    ScoreBias,
    ScoreMod,
    apply_rotary,
    default_positions,
    forced_path,
)


def expanded(q, k, v):
    groups = q.shape[1] // k.shape[1]
    return k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)


class OwnLayer(LayerPE):
    """Attention of its own (softmax(q.k / sqrt(d)) v), done by `attention` in the subclasses."""

    def need(self, state, average_state):
        return OwnAttention(attend=self.attention, plan=lambda *args: type(self).__name__.lower())


# causality -------------------------------------------------------------------------------------------------------
class SeesEverything(OwnLayer):
    def attention(self, x, q, k, v, mask, is_causal, key_mask, cache):
        k, v = expanded(q, k, v)
        visible = None if key_mask is None else key_mask[:, None, None, :]  # padding hidden, the future not
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)


class NonCausal(PositionalEncoding):
    """The last layer attends to every token, later ones included."""

    def make_layer(self, layer_idx):
        return SeesEverything() if layer_idx == self.config.n_layers - 1 else LayerPE()


# kv-cache --------------------------------------------------------------------------------------------------------
class StepPositions(RoPE):
    """A single new token is placed at position 0 (its own length), not after the cached ones."""

    def positions(self, batch, seq_len, start_pos, device, attention_mask=None):
        return super().positions(batch, seq_len, 0 if seq_len == 1 else start_pos, device, attention_mask)


# chunked-prefill -------------------------------------------------------------------------------------------------
class ForgetsThePast(OwnLayer):
    def attention(self, x, q, k, v, mask, is_causal, key_mask, cache):
        k, v = expanded(q, k, v)
        if key_mask is None and q.shape[2] > 1:  # its own causal mask, as if no keys were cached before
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and is_causal)


class ChunkedMask(PositionalEncoding):
    def make_layer(self, layer_idx):
        return ForgetsThePast()


# dense -----------------------------------------------------------------------------------------------------------
class FastPathDiffers(OwnLayer):
    def attention(self, x, q, k, v, mask, is_causal, key_mask, cache):
        k, v = expanded(q, k, v)
        scale = q.shape[-1] ** -0.5 * (1.0 if forced_path() == "dense" else 1.25)  # only the reference is right
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


class FastPath(PositionalEncoding):
    def make_layer(self, layer_idx):
        return FastPathDiffers()


# padding ---------------------------------------------------------------------------------------------------------
class AbsoluteKeys(LayerPE):
    """Keys scaled by a function of their absolute position (cache-safe: a key depends on its own position)."""

    def rotate(self, q, k, state: PositionState):
        return q, k * (1 + 0.5 * torch.sin(state.positions.to(k.dtype)))[:, None, :, None]


class LeftPaddingOnly(PositionalEncoding):
    """Counts padding as if it were always on the left (right-padded rows get shifted positions)."""

    def positions(self, batch, seq_len, start_pos, device, attention_mask=None):
        if attention_mask is None:
            return default_positions(batch, seq_len, start_pos, device)
        pads = (attention_mask == 0).sum(-1, keepdim=True)
        offset = start_pos.view(-1, 1) if isinstance(start_pos, torch.Tensor) else start_pos
        return (torch.arange(seq_len, device=device) - pads).clamp(min=0) + offset

    def make_layer(self, layer_idx):
        return AbsoluteKeys()


# batch -----------------------------------------------------------------------------------------------------------
class BatchMean(LayerPE):
    def rotate(self, q, k, state):
        return q, k + 0.5 * k.mean(0, keepdim=True)  # a statistic over the batch: rows see each other


class BatchMixing(PositionalEncoding):
    def make_layer(self, layer_idx):
        return BatchMean()


# save-load -------------------------------------------------------------------------------------------------------
class UnsavedFrequencies(PositionalEncoding):
    """Random rotary frequencies drawn at build time, kept in a buffer that is not saved."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.register_buffer("frequencies", torch.rand(config.head_dim // 2), persistent=False)

    def initial_state(self, positions, dtype):
        angles = positions[..., None].to(dtype) * self.frequencies.to(dtype)
        return PositionState(positions=positions, rotary=torch.cat((angles.cos(), angles.sin()), -1).unsqueeze(1))

    def make_layer(self, layer_idx):
        return RotaryLayer()


# finite ----------------------------------------------------------------------------------------------------------
class NeedsFp32Layer(LayerPE):
    def rotate(self, q, k, state):
        one, eps = torch.ones((), dtype=q.dtype, device=q.device), 2.0 ** -10
        return q * (eps / ((one + eps) - one)), k  # exactly 1 in fp32 and fp64; 1/0 in bf16 (1 + 2^-10 -> 1)


class NeedsFp32(PositionalEncoding):
    def make_layer(self, layer_idx):
        return NeedsFp32Layer()


# score-mod -------------------------------------------------------------------------------------------------------
def scalar_slope_score(h, q_pos, k_pos, slope):
    return -slope * (q_pos - k_pos).to(slope.dtype)  # a 0-d tensor that needs gradients, read directly


class ScalarSlopeLayer(LayerPE):
    """One learned slope for every head; its score_mod is right in value, but FlexAttention cannot take its
    gradient (FIRE's bug on a GPU with torch 2.11)."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.slope = nn.Parameter(torch.tensor(0.25))

    def need(self, state, average_state):
        return ScoreBias(pairs=self.pairs, score_mod=ScoreMod(scalar_slope_score, (self.slope,)),
                         parameters=(self.slope,))

    def pairs(self, q_pos, k_pos):
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).to(self.slope.dtype)
        return (-self.slope * distance)[:, None].expand(-1, self.heads, -1, -1)


class ScalarScoreMod(PositionalEncoding):
    def make_layer(self, layer_idx):
        return ScalarSlopeLayer(self.config.n_heads)


# pe-gradients ----------------------------------------------------------------------------------------------------
class DetachedSlopes(LayerPE):
    def __init__(self, heads: int) -> None:
        super().__init__()
        self.slopes = nn.Parameter(torch.linspace(0.1, 0.5, heads))

    def need(self, state, average_state):
        return ScoreBias(pairs=self.pairs)

    def pairs(self, q_pos, k_pos):
        distance = (q_pos[..., :, None] - k_pos[..., None, :]).to(self.slopes.dtype)
        return -self.slopes.detach()[:, None, None] * distance[:, None]  # the gradient stops here


class Detached(PositionalEncoding):
    def make_layer(self, layer_idx):
        return DetachedSlopes(self.config.n_heads)


# compile ---------------------------------------------------------------------------------------------------------
class CompiledDiffers(LayerPE):
    def rotate(self, q, k, state):
        return (q * 1.5 if torch.compiler.is_compiling() else q), k


class CompileOnly(PositionalEncoding):
    def make_layer(self, layer_idx):
        return CompiledDiffers()


# claims ----------------------------------------------------------------------------------------------------------
class ClaimsShift(LeftPaddingOnly):
    """Absolute positions (correctly padded), claimed to be shift-invariant."""

    claims = ("shift-invariance",)

    def positions(self, batch, seq_len, start_pos, device, attention_mask=None):
        return default_positions(batch, seq_len, start_pos, device, attention_mask)


class QueriesOnly(RotaryLayer):
    def rotate(self, q, k, state):
        return apply_rotary(q, state.rotary.to(q.dtype)), k


class ClaimsRotation(RoPE):
    """Rotates the queries only, and claims that rotating the state changes nothing."""

    def __init__(self, config, **rope_args) -> None:
        super().__init__(config, **rope_args)
        self.claims = ("rotation-equivariance",)

    def make_layer(self, layer_idx):
        return QueriesOnly()


BROKEN = {"causality": "NonCausal", "kv-cache": "StepPositions", "chunked-prefill": "ChunkedMask",
          "dense": "FastPath", "score-mod": "ScalarScoreMod", "padding": "LeftPaddingOnly", "batch": "BatchMixing",
          "save-load": "UnsavedFrequencies", "finite": "NeedsFp32", "pe-gradients": "Detached",
          "compile": "CompileOnly", "shift-invariance": "ClaimsShift", "rotation-equivariance": "ClaimsRotation"}
