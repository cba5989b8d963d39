"""RoPE (Su et al.) with the context-extension scalings of transformers 5: linear (position interpolation),
dynamic (NTK), yarn and llama3. Half-split pairing (i, i + d/2), as in Llama, so Llama checkpoints load as is.

pe_args:
  theta             base wavelength (10000; Llama 3 uses 500000)
  scaling           none | linear | dynamic | yarn | llama3
  factor            context-extension factor s (e.g. 2 for 4K -> 8K)
  original_max_len  pre-training context of the scaled model (default: model.max_seq_len)
  beta_fast, beta_slow, attention_factor, truncate      yarn's knobs (defaults 32, 1, 0.1 ln s + 1, true)
  low_freq_factor, high_freq_factor                     llama3's knobs (defaults 1, 4)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, apply_rotary

SCALINGS = ("none", "linear", "dynamic", "yarn", "llama3")


def default_inv_freq(theta: float, dim: int) -> Tensor:
    """theta^(-2i/d) for i < d/2, computed exactly as transformers does (fp32)."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def dynamic_inv_freq(theta: float, dim: int, factor: float, seq_len: int, original_max_len: int) -> Tensor:
    """Dynamic NTK: enlarge the base once a sequence grows past the original context. The base is a float32
    tensor, as in transformers, so the frequencies match it bit for bit."""
    seq_len = torch.tensor(max(seq_len, original_max_len))
    base = theta * ((factor * seq_len / original_max_len) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def yarn_inv_freq(theta: float, dim: int, factor: float, original_max_len: int, beta_fast: float, beta_slow: float,
                  truncate: bool) -> Tensor:
    """YaRN: interpolate low frequencies by 1/factor, keep high ones, blend linearly between the two bounds."""

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original_max_len / (num_rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 = keep the original (high) frequency
    return interpolation * (1 - keep) + extrapolation * keep


def llama3_inv_freq(theta: float, dim: int, factor: float, original_max_len: int, low_freq_factor: float,
                    high_freq_factor: float) -> Tensor:
    """Llama 3.1: divide long wavelengths by factor, keep short ones, smooth in between."""
    inv_freq = default_inv_freq(theta, dim)
    low_freq_wavelen = original_max_len / low_freq_factor
    high_freq_wavelen = original_max_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryLayer(LayerPE):
    """Rotates queries and keys by the (fixed) rotary state of the current tokens."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        rotary = state.rotary.to(q.dtype)  # like transformers: cos/sin computed in fp32, used in the activation dtype
        return apply_rotary(q, rotary), apply_rotary(k, rotary)


class RoPE(PositionalEncoding):
    def __init__(self, config, *, theta: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                 original_max_len: int | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 attention_factor: float | None = None, truncate: bool = True, low_freq_factor: float = 1.0,
                 high_freq_factor: float = 4.0) -> None:
        super().__init__(config)
        if scaling not in SCALINGS:
            raise ValueError(f"model.pe_args.scaling: unknown RoPE scaling {scaling!r}; allowed: {', '.join(SCALINGS)}")
        if scaling != "none" and factor < 1:
            raise ValueError(f"model.pe_args.factor: must be >= 1 for scaling {scaling!r}, got {factor}")
        self.theta, self.scaling, self.factor = theta, scaling, factor
        self.original_max_len = original_max_len or config.max_seq_len
        dim = config.head_dim
        self.attention_factor = 1.0
        if scaling == "linear":
            inv_freq = default_inv_freq(theta, dim) / factor
        elif scaling == "yarn":
            inv_freq = yarn_inv_freq(theta, dim, factor, self.original_max_len, beta_fast, beta_slow, truncate)
            self.attention_factor = attention_factor if attention_factor is not None else (
                0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
        elif scaling == "llama3":
            inv_freq = llama3_inv_freq(theta, dim, factor, self.original_max_len, low_freq_factor, high_freq_factor)
        else:  # none, and dynamic below its threshold
            inv_freq = default_inv_freq(theta, dim)
        # A plain fp32 tensor, not a buffer: `model.to(torch.bfloat16)` must not round the frequencies.
        self.inv_freq = inv_freq
        # Relative, and rotating the state leaves q.k alone; dynamic NTK's frequencies follow the sequence length.
        self.claims = ("rotation-equivariance",) if scaling == "dynamic" else ("shift-invariance",
                                                                              "rotation-equivariance")

    def frequencies(self, positions: Tensor) -> Tensor:
        """Inverse frequencies [d/2] for this forward. Only dynamic NTK depends on the sequence: each row of
        positions [B, T] gets its own, from its own length (largest position + 1), returned as [B, 1, d/2]."""
        inv_freq = self.inv_freq
        if self.scaling == "dynamic":
            lengths = self.cache_key(positions)
            if max(lengths) > self.original_max_len:
                rows = [dynamic_inv_freq(self.theta, self.config.head_dim, self.factor, n, self.original_max_len)
                        for n in lengths]
                inv_freq = rows[0] if positions.dim() == 1 else torch.stack(rows).unsqueeze(-2)
        return inv_freq.to(positions.device)

    def cache_key(self, positions: Tensor) -> object:
        """Dynamic NTK: the per-row lengths its frequencies depend on (at least the original context)."""
        if self.scaling != "dynamic":
            return None
        lengths = (positions.amax(-1) + 1).reshape(-1).tolist()
        return tuple(max(int(n), self.original_max_len) for n in lengths)

    def rotary(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """[B or 1, 1, T, d]: cos of every pair's angle, then sin; fp32 (fp64 for fp64 models)."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        angles = positions[..., None].to(compute) * self.frequencies(positions).to(compute)  # [B, T, d/2]
        rotary = torch.cat((angles.cos(), angles.sin()), dim=-1) * self.attention_factor
        return rotary.unsqueeze(1)

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        return PositionState(positions=positions, rotary=self.rotary(positions, dtype))

    def make_layer(self, layer_idx: int) -> LayerPE:
        return RotaryLayer()

    def hf_export(self) -> dict[str, Any]:
        """transformers' `rope_parameters` and `max_position_embeddings` for this RoPE (tapecli.model.hf reads them
        back)."""
        params: dict[str, Any] = {"rope_theta": self.theta, "rope_type": "default"}
        max_pos = self.config.max_seq_len
        if self.scaling == "none":
            return {"rope_parameters": params, "max_position_embeddings": max_pos}
        params.update(rope_type=self.scaling, factor=self.factor)
        if self.scaling == "dynamic":
            max_pos = self.original_max_len  # transformers' dynamic NTK measures growth from max_position_embeddings
        elif self.scaling != "linear":
            params["original_max_position_embeddings"] = self.original_max_len
        args = self.config.pe_args
        if self.scaling == "yarn":
            params.update(beta_fast=args.get("beta_fast", 32.0), beta_slow=args.get("beta_slow", 1.0),
                          truncate=args.get("truncate", True), attention_factor=self.attention_factor)
        if self.scaling == "llama3":
            params.update(low_freq_factor=args.get("low_freq_factor", 1.0),
                          high_freq_factor=args.get("high_freq_factor", 4.0))
        return {"rope_parameters": params, "max_position_embeddings": max_pos}
