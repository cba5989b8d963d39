"""ComRoPE (Yu et al., CVPR 2025, "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by
Trainable Commuting Angle Matrices", arXiv 2506.03737; official code github.com/Longin-Yu/ComRoPE, `model.py`),
for 1-D token positions.

A token at position p is rotated by R(p) = exp(p A) with a block-diagonal skew-symmetric angle matrix
A = diag(B_1, ..., B_m) of m blocks of b dims, trainable per head and layer. ComRoPE's point is that the angle
matrices of the position axes commute, so that R(p)^T R(p') = R(p' - p) (the relative property LieRE loses with
several axes). With 1-D positions there is one axis; its ComRoPE-AP form is every block B_j = P_j - P_j^T
(P_j trainable, initialised N(0, init_std) as the official `freqs`), and ComRoPE-LD multiplies each block by a
trainable scale theta_j (`variant: ld`; the official `multiplier`, initialised N(0, 1)):

    AP: B_j = P_j - P_j^T          LD: B_j = theta_j (P_j - P_j^T)
    q_t . k_s = q_t^T exp((p_s - p_t) A) k_s,    p = t / max_seq_len

Positions are normalised as the official code normalises patch coordinates (`axis_scale`: the training range spans
[0, 1)). One angle matrix per key head (query heads use their key head's, so the relative property holds with
grouped-query attention) and per layer (`model.layers.{i}.pe.raw`, and `.theta` for LD). The rotations are
LieRE's (`tapecli.model.pe.liere`): a table of exp(p A) per block over the current positions, built from a few matrix
exponentials by doubling (one [b, b] product per position and block), in fp32 at least, applied to q and k as
block products; attention is plain q.k attention on every path.

pe_args:
  block_size   b, dims per block (8; a divisor of head_dim, at least 2). The official config class defaults to 2,
               which makes ComRoPE a RoPE with trainable frequencies; 8 couples features within larger blocks
  variant      ap (default) | ld
  init_std     standard deviation of the initial P (1.0, the official default)
No Hugging Face config expresses a learned angle matrix: `tape export` refuses it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, check_positive_int
from tapecli.model.pe.liere import rotate_pair, rotations

VARIANTS = ("ap", "ld")


class ComRoPELayer(LayerPE):
    def __init__(self, shape: tuple[int, ...], scale: float, variant: str, init_std: float) -> None:
        super().__init__()
        self.scale, self.init_std = scale, init_std
        self.raw = nn.Parameter(torch.empty(shape))  # [G, m, b, b]
        self.theta = nn.Parameter(torch.empty(shape[1], 1, 1)) if variant == "ld" else None  # per block
        self.init_weights()

    def init_weights(self) -> None:
        with torch.no_grad():
            self.raw.normal_(0.0, self.init_std)
            if self.theta is not None:
                self.theta.normal_(0.0, 1.0)

    def generator(self) -> Tensor:
        """A's blocks [G, m, b, b]: P - P^T (times theta for LD)."""
        blocks = self.raw - self.raw.transpose(-1, -2)
        return blocks if self.theta is None else blocks * self.theta

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return rotate_pair(q, k, rotations(self.generator(), state.positions, self.scale))


class ComRoPE(PositionalEncoding):
    claims = ("shift-invariance",)

    def __init__(self, config, *, block_size: int = 8, variant: str = "ap", init_std: float = 1.0) -> None:
        super().__init__(config)
        check_positive_int("block_size", block_size)
        d = config.head_dim
        if d % block_size or block_size < 2:
            raise ValueError(f"model.pe_args.block_size: must divide head_dim {d} and be at least 2, got {block_size}")
        if variant not in VARIANTS:
            raise ValueError(f"model.pe_args.variant: unknown ComRoPE variant {variant!r}; allowed: "
                             f"{', '.join(VARIANTS)}")
        if not init_std > 0:
            raise ValueError(f"model.pe_args.init_std: must be > 0, got {init_std}")
        self.layer_args = dict(shape=(config.n_kv_heads, d // block_size, block_size, block_size),
                               scale=1.0 / config.max_seq_len, variant=variant, init_std=init_std)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return ComRoPELayer(**self.layer_args)
