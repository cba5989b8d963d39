"""RoPE's inverse frequencies under each context-extension scaling (transformers 5's formulas: dynamic NTK, YaRN,
LongRoPE, Llama 3), the frequencies p-RoPE, HoPE and FoPE keep, and FoPE's fixed Fourier coefficients; the equations
and sources are in tapecli/model/pe/rope.py's docstring, which uses them."""

from __future__ import annotations

import math

import torch
from torch import Tensor

FOPE_SEED = 123  # FoPE's coefficients come from this generator seed (as in xtuner's FoPE): a function of the config


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


def longrope_inv_freq(theta: float, dim: int, factors: list[float]) -> Tensor:
    """LongRoPE: theta^(-2i/d) / factors[i], computed exactly as transformers does (fp32)."""
    ext_factors = torch.tensor(factors, dtype=torch.float32)
    return 1.0 / (ext_factors * theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def longrope_attention_factor(factor: float, original_max_len: int) -> float:
    """LongRoPE's default scale of cos and sin (transformers' `_compute_longrope_parameters`)."""
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_max_len))


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


def kept_frequencies(inv_freq: Tensor, fraction: float, floor: float) -> Tensor:
    """p-RoPE and HoPE/FoPE's zeroing: `inv_freq` (decreasing) with all but the round(fraction * n) highest
    frequencies, and every frequency below `floor`, set to 0."""
    keep = torch.ones_like(inv_freq, dtype=torch.bool)
    keep[round(fraction * inv_freq.shape[-1]):] = False
    return torch.where(keep & (inv_freq >= floor), inv_freq, torch.zeros_like(inv_freq))


def fope_coefficients(n_freqs: int, head_dim: int, n_heads: int, sigma: float) -> tuple[Tensor, Tensor]:
    """FoPE's fixed coefficient matrices (cos, sin), each [n_heads, D, m], m = min(D, head_dim / 4) (head_dim: the
    rotary width), columns
    normalised to sum 1: a step identity (pair j's own frequency is number floor(j D / m)) plus xavier-normal
    noise of gain `sigma`, drawn from a generator seeded with FOPE_SEED (fixed, like the official code's)."""
    m = max(1, min(n_freqs, head_dim // 4))
    eye = torch.zeros(n_freqs, m, dtype=torch.float64)
    eye[torch.arange(m) * n_freqs // m, torch.arange(m)] = 1.0
    generator = torch.Generator().manual_seed(FOPE_SEED)
    out = []
    for _ in ("cos", "sin"):
        noise = torch.empty(n_heads, n_freqs, m)
        torch.nn.init.xavier_normal_(noise, gain=sigma, generator=generator)
        coef = noise.double() + eye
        out.append(coef / coef.sum(dim=-2, keepdim=True))
    return out[0], out[1]
