"""Multiplicative GRAPE, commuting (Zhang et al., ICLR 2026, "Group Representational Position Encoding", arXiv
2512.07805, Section 3.1; official code github.com/model-architectures/GRAPE, `MSGRAPECommuting` in
model/llama-mha-grape-m-nonctx.py).

A position n acts on each head's queries and keys as G(n) = exp(n sum_j w_j L_j), the L_j rank-2 skew generators
of d/2 commuting planes. As in the official code, the planes are the canonical coordinate pairs (j, j + d/2) (the
half-split pairs of RoPE) and the frequencies are learned, w_j = exp(l_j) (strictly positive), initialised with
RoPE's log-uniform spectrum l_j = log theta^(-2j/d):

    q_t <- G(t) q_t,   k_s <- G(s) k_s,   q_t . k_s = q_t^T G(s - t) k_s     (the exact relative law)

so GRAPE with frozen frequencies (`learnable: false`) is RoPE (tested), and training moves the spectrum. Each layer
has its own frequencies (`model.layers.{i}.pe.log_freq`): one spectrum shared by the heads (`share_across_heads:
true`, the official default) or one per key head (query heads use their key head's, so the relative law holds
with grouped-query attention). Angles are computed in fp32 at least (fp64 in fp64 models), from the parameter, at
every forward. Attention is plain q.k attention on every path (SDPA's fused kernels, the chunked and dense paths).

Where we differ from the official code: G(n) rotates by +n w (Llama's direction; the official `apply_rotary_emb`
rotates by -n w), so that frozen GRAPE is RoPE exactly rather than RoPE with every pair reflected; the official
cos/sin are rounded to bf16, ours stay fp32 until they meet the activations. The official model also applies a
learned RMSNorm to q and k after the rotation; that is the architecture around the PE (tape's `model.qk_norm`
normalises before it).

pe_args:
  theta               base of the initial log-uniform spectrum (10000, the official `grape_base`)
  learnable           true (the official default): the frequencies are trained; false: RoPE
  share_across_heads  true (the official default): one spectrum per layer; false: one per key head
No Hugging Face config expresses learned frequencies: `tape export` refuses it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, apply_rotary


class GRAPELayer(LayerPE):
    def __init__(self, n_spectra: int, head_dim: int, theta: float, learnable: bool) -> None:
        super().__init__()
        self.theta = theta
        self.log_freq = nn.Parameter(torch.empty(n_spectra, head_dim // 2), requires_grad=learnable)
        self.init_weights()

    def init_weights(self) -> None:
        d = 2 * self.log_freq.shape[-1]
        with torch.no_grad():  # RoPE's spectrum, computed as the official code does (fp32), then its log
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            self.log_freq.copy_(inv_freq.log().expand_as(self.log_freq))

    def rotary(self, positions: Tensor) -> Tensor:
        """cos | sin of every plane's angle n w_j: [B|1, 1 or G, T, d] in fp32 at least."""
        compute = torch.promote_types(self.log_freq.dtype, torch.float32)
        freq = self.log_freq.to(compute).exp()  # [1 or G, d/2]
        angles = positions.to(compute)[:, None, :, None] * freq[None, :, None, :]
        return torch.cat((angles.cos(), angles.sin()), dim=-1)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        rotary = self.rotary(state.positions)
        k = apply_rotary(k, rotary.to(k.dtype))
        if rotary.shape[1] > 1:  # per key head: query head h uses key head h // (H / G)
            rotary = rotary.repeat_interleave(q.shape[1] // rotary.shape[1], dim=1)
        return apply_rotary(q, rotary.to(q.dtype)), k


class GRAPE(PositionalEncoding):
    claims = ("shift-invariance",)

    def __init__(self, config, *, theta: float = 10000.0, learnable: bool = True,
                 share_across_heads: bool = True) -> None:
        super().__init__(config)
        if not theta > 1:
            raise ValueError(f"model.pe_args.theta: the spectrum's base must be > 1, got {theta}")
        self.layer_args = dict(n_spectra=1 if share_across_heads else config.n_kv_heads, head_dim=config.head_dim,
                               theta=theta, learnable=learnable)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return GRAPELayer(**self.layer_args)
