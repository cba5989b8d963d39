"""LieRE, Lie rotational position encodings (Ostmeier et al., ICML 2025, "LieRE: Lie Rotational Positional
Encodings", arXiv 2406.10322; official code github.com/StanfordMIMI/LieRE, `LierePositionEncoder` and
`FlexibleAttention.apply_transforms` in models/rope_vit.py), for 1-D token positions.

RoPE rotates fixed planes at fixed frequencies; LieRE learns the generator: a skew-symmetric matrix A (per head
block of `generator_dim` dims; the official default is one dense block over the whole head), and a token at
position p is rotated by R(p) = exp(p A):

    q_t <- R(p_t) q_t,   k_s <- R(p_s) k_s,   q_t . k_s = q_t^T exp((p_s - p_t) A) k_s

With one position axis every R(p) is a power of the same exp(A), so they commute and the logit depends on the
offset only (the relative property the paper's multi-dimensional positions lose unless the generators commute,
which is what ComRoPE adds: `tapecli.model.pe.comrope`). As in the official code, A = U - U^T with U the strictly
upper triangle of a raw parameter initialised U(0, 2 pi), and positions are normalised so that the training range
spans [0, 1): p = t / max_seq_len (the official code scales an image's patch grid into [0, 1] the same way); past
the training length p grows beyond 1. One generator per layer (`model.layers.{i}.pe.raw`: the official
`rotary_embedding_per_layer: true`; its default shares one across layers, while tape keeps every PE parameter in
its layer), shared by the heads (`per_head: false`, the official default; with `per_head` there is one per key
head, so grouped queries share their key head's and the relative property holds). The rotations are computed in
fp32 at least (fp64 in fp64 models) with `torch.linalg.matrix_exp`, and applied to q and k as block matrix
products; attention is then plain q.k attention on every path.

pe_args:
  generator_dim   dims per generator block (0, the default: the whole head, the official dense generator); a
                  divisor of head_dim
  per_head        false (official default) | true: one generator per key head
No Hugging Face config expresses a learned generator: `tape export` refuses it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, check_positive_int


def rotations(generator: Tensor, positions: Tensor, scale: float) -> Tensor:
    """exp(p A) for every position: generator [S, n, b, b] skew-symmetric (S heads or 1, n blocks of b dims),
    positions [B|1, T] -> [B|1, S, T, n * b * b] in fp32 at least, each block flattened."""
    compute = torch.promote_types(generator.dtype, torch.float32)
    p = positions.to(compute)[:, None, :, None, None, None] * scale
    exp = torch.linalg.matrix_exp(p * generator.to(compute)[None, :, None])
    return exp.flatten(-3)


def rotate_blocks(x: Tensor, rotation: Tensor) -> Tensor:
    """x [B, H, T, d] times each block's rotation [B|1, S, T, n * b * b] (S = 1, or the key heads: query head h
    uses h // (H / S)), computed in the rotation's dtype, returned in x's."""
    H, d = x.shape[1], x.shape[-1]
    b = rotation.shape[-1] // d  # n * b * b / (n * b)
    if rotation.shape[1] not in (1, H):
        rotation = rotation.repeat_interleave(H // rotation.shape[1], dim=1)
    R = rotation.unflatten(-1, (d // b, b, b))
    return (R @ x.to(R.dtype).unflatten(-1, (d // b, b, 1))).flatten(-3).to(x.dtype)


def skew(raw: Tensor) -> Tensor:
    """The official generator: U - U^T, U the strictly upper triangle of `raw` [..., b, b]."""
    upper = torch.triu(raw, diagonal=1)
    return upper - upper.transpose(-1, -2)


class LieRELayer(LayerPE):
    """One layer's generator `raw` [S, n, b, b] (S = 1 or the key heads, n blocks of b dims)."""

    def __init__(self, shape: tuple[int, ...], scale: float) -> None:
        super().__init__()
        self.scale = scale
        self.raw = nn.Parameter(torch.empty(shape))
        self.init_weights()

    def init_weights(self) -> None:
        with torch.no_grad():
            self.raw.uniform_(0.0, 2 * math.pi)  # the official initialisation (after RoPE-Mixed's random angles)

    def generator(self) -> Tensor:
        return skew(self.raw)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        rotation = rotations(self.generator(), state.positions, self.scale)
        return rotate_blocks(q, rotation), rotate_blocks(k, rotation)


class LieRE(PositionalEncoding):
    claims = ("shift-invariance",)

    def __init__(self, config, *, generator_dim: int = 0, per_head: bool = False) -> None:
        super().__init__(config)
        d = config.head_dim
        if generator_dim != 0:
            check_positive_int("generator_dim", generator_dim)
            if d % generator_dim or generator_dim < 2:
                raise ValueError(f"model.pe_args.generator_dim: must divide head_dim {d} and be at least 2 (0: the "
                                 f"whole head), got {generator_dim}")
        b = generator_dim or d
        self.shape = (config.n_kv_heads if per_head else 1, d // b, b, b)
        self.scale = 1.0 / config.max_seq_len

    def make_layer(self, layer_idx: int) -> LayerPE:
        return LieRELayer(self.shape, self.scale)
