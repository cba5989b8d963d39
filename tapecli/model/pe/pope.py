"""PoPE (Gopalakrishnan, Csordás, Schmidhuber and Mozer 2025, "Decoupling the 'What' and 'Where' With Polar
Coordinate Positional Embeddings", arXiv 2509.10534).

Each of the d components of a query or key head (d = head_dim) becomes a complex number whose magnitude comes from
the content only and whose phase from the position only (RoPE pairs the d components into d/2 complex numbers, so
the content's own angle mixes with the position's; PoPE removes that):

  q~_tc = softplus(q_tc) e^(i t w_c),   k~_sc = softplus(k_sc) e^(i (s w_c + delta_c)),   w_c = theta^(-c/d), c < d
  a_ts = Re[sum_c q~_tc conj(k~_sc)] / sqrt(d)
       = sum_c softplus(q_tc) softplus(k_sc) cos((t - s) w_c - delta_c) / sqrt(d)

delta [H, d]: a learned phase bias per head and component (the paper's optional bias), clamped to [-2 pi, 0] and
starting at 0. Attention is softmax_s(a_ts) v_s; the values are untouched.

Reference: the paper's equations, checked against the unofficial implementations lucidrains/PoPE-pytorch
(`PoPE`, `apply_pope_to_qk`) and x-transformers (`PolarEmbedding`, `apply_polar_pos_emb`; no official code was
published), which agree: d frequencies theta^(-c/d) (twice RoPE's d/2), softplus magnitudes and phases in fp32,
the bias clamped to [-2 pi, 0] and added to the keys' phases, scores scaled by 1/sqrt(d) of the original head.

As computed here, queries and keys become real vectors of width 2d, [mu cos(phi) | mu sin(phi)], so that
q~ . k~ = sum_c mu_q mu_k cos(phi_q - phi_k) is a plain dot product and attention takes the same fused paths as
RoPE (SDPA, flash-attn, the chunked CPU path with padding; `tapecli.model.attention` zero-pads the values to 2d for
the kernels, which want equal widths). The KV cache holds these 2d-wide keys. Where we differ from the reference
code, with the same logits:
- the bias enters the query's phase as -delta rather than the key's as +delta: the logit depends on phi_q - phi_k
  only, and this way grouped-query keys (shared by query heads with different delta) and cached keys do not
  depend on the query head;
- the queries carry a factor sqrt(2), so the kernels' 1/sqrt(2d) scale is the reference's 1/sqrt(d).

pe_args:
  theta   base wavelength (10000)
  bias    true (default): the learned phase bias delta; false: none
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState


class PoPELayer(LayerPE):
    """Parameter: bias (delta) [n_heads, head_dim], when pe_args.bias."""

    def __init__(self, n_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n_heads, head_dim)) if bias else None

    def init_weights(self) -> None:
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        """q [B, H, T, d], k [B, G, T, d] -> [B, H|G, T, 2d]: sqrt(2) mu_q [cos(t w - delta) | sin(t w - delta)] and
        mu_k [cos(s w) | sin(s w)], computed in fp32 at least (state.rotary: cos(t w) | sin(t w), [B|1, 1, T, 2d])."""
        compute = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            cos, sin = state.rotary.to(compute).chunk(2, dim=-1)
            mu_q, mu_k = F.softplus(q.to(compute)), F.softplus(k.to(compute))
            keys = torch.cat((mu_k * cos, mu_k * sin), dim=-1)
            if self.bias is not None:  # the query's phase t w - delta: cos(a - b), sin(a - b) by the sum formulas
                delta = self.bias.clamp(-2 * math.pi, 0.0).to(compute)[:, None, :]  # [H, 1, d]
                cos_d, sin_d = delta.cos(), delta.sin()
                cos, sin = cos * cos_d + sin * sin_d, sin * cos_d - cos * sin_d
            queries = torch.cat((mu_q * cos, mu_q * sin), dim=-1) * math.sqrt(2.0)
        return queries.to(q.dtype), keys.to(k.dtype)


class PoPE(PositionalEncoding):
    claims = ("shift-invariance",)  # positions enter as differences only, or not at all
    def __init__(self, config, *, theta: float = 10000.0, bias: bool = True) -> None:
        super().__init__(config)
        if not theta > 1:
            raise ValueError(f"model.pe_args.theta: must be > 1, got {theta}")
        self.bias = bias
        d = config.head_dim
        # A plain fp32 tensor on the CPU (even when the model is built on the meta device), like RoPE's.
        with torch.device("cpu"):
            self.inv_freq = theta ** (-torch.arange(d, dtype=torch.float32) / d)

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        """rotary [B|1, 1, T, 2d]: cos(t w_c) for c < d, then sin(t w_c); fp32 (fp64 for fp64 models)."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        angles = positions[..., None].to(compute) * self.inv_freq.to(positions.device, compute)
        return PositionState(positions=positions, rotary=torch.cat((angles.cos(), angles.sin()), dim=-1).unsqueeze(1))

    def make_layer(self, layer_idx: int) -> LayerPE:
        return PoPELayer(self.config.n_heads, self.config.head_dim, self.bias)
