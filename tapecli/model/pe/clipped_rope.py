"""Clipped RoPE (Li et al., ICML 2026, "CoPE: Clipped RoPE as A Scalable Free Lunch for Long Context LLMs",
arXiv 2602.05258; official code github.com/hrlics/CoPE, `LlamaRotaryEmbedding` of modeling_cope.py). Its paper
calls it CoPE; here it is `clipped-rope`, since `cope` is contextual position encoding.

RoPE whose lowest frequencies are softly clipped: of the d/2 inverse frequencies w_0 > ... > w_{d/2-1} (after
RoPE's scaling, so it composes with linear, dynamic, yarn and llama3 scaling and every theta), the last
n = min(clip_low_n, d/2) are multiplied by a raised-cosine taper that falls from 1 to 0,

    w_{d/2-n+j} <- w_{d/2-n+j} * (1 + cos(pi j / (n - 1))) / 2,     j = 0..n-1   (n = 1: the factor is 1)

so the boundary frequency is kept and the lowest one stops rotating (the official `smooth_mask`, computed in fp32
with torch.linspace). `hard: true` is the paper's HardClip baseline: the same n frequencies set to 0. With
`clip_low_n: 0` it is RoPE exactly. Like the official code, the taper is applied after every scaling, dynamic NTK's
recomputed frequencies included.

pe_args: RoPE's (theta, scaling, factor, ...; not fope, whose coefficients mix the frequencies), and
  clip_low_n   how many of the lowest frequencies are clipped (20, the official value for head_dim 128)
  hard         false (the soft taper) | true (HardClip)
No Hugging Face config expresses the taper: `tape export` refuses it (a subclass of RoPE does not inherit RoPE's
export).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tapecli.model.pe.rope import RoPE


def clip_mask(n_freqs: int, clip_low_n: int, hard: bool) -> Tensor:
    """[n_freqs] fp32 factors: 1 for the highest frequencies, the taper (or zeros) over the last min(clip_low_n,
    n_freqs)."""
    mask = torch.ones(n_freqs, dtype=torch.float32)
    clip = min(clip_low_n, n_freqs)
    if clip > 0:
        angle = torch.linspace(0.0, math.pi, steps=clip, dtype=torch.float32)
        mask[n_freqs - clip:] = 0.0 if hard else 0.5 * (1.0 + torch.cos(angle))
    return mask


class ClippedRoPE(RoPE):
    def __init__(self, config, *, clip_low_n: int = 20, hard: bool = False, **rope_args) -> None:
        if isinstance(clip_low_n, bool) or not isinstance(clip_low_n, int) or clip_low_n < 0:
            raise ValueError(f"model.pe_args.clip_low_n: must be a whole number >= 0 (0: RoPE), got {clip_low_n!r}")
        if rope_args.get("fope"):
            raise ValueError("model.pe_args.fope: FoPE mixes the frequencies within a pair, which the clipping "
                             "taper does not define; use pe rope for FoPE")
        super().__init__(config, **rope_args)
        self.clip_low_n, self.hard = clip_low_n, hard
        self.clip = clip_mask(self.rotary_dim // 2, clip_low_n, hard)  # a plain fp32 tensor, like inv_freq

    def frequencies(self, positions: Tensor) -> Tensor:
        """RoPE's frequencies for this forward (scaled; dynamic NTK's per row), the lowest clipped."""
        inv_freq = super().frequencies(positions)
        return inv_freq * self.clip.to(inv_freq)
