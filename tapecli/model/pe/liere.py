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
head, so grouped queries share their key head's and the relative property holds).

Computing the rotations. Positions are integers, so R(p) = E^p with E = exp(s A), s = 1 / max_seq_len. For the
current tokens' positions lo..hi, `power_table` builds exp(lo s A) E^j for j = 0..hi - lo by doubling: the powers
E^(2^k) are matrix exponentials (a handful, log2 of the span, in fp64, in one batched call), and each doubling step
multiplies the table so far by one of them, so each entry costs one [b, b] product instead of a matrix exponential
and its backward, and its rounding grows with the number of binary digits of j, not with j. Tokens read their
rotation from the table by position (KV-cache decoding: one token at its offset; padding: repeated positions).
Positions that are not integers, or so sparse that the table would be more than 4 times their number, take one
`torch.linalg.matrix_exp` each; so do all positions under torch.compile (the table's size depends on the positions'
values, which a compiled graph cannot). Everything is computed in fp32 at least (fp64 in fp64 models), also under
bf16 autocast. The rotations are applied to q and k together (`rotate_pair`): one [b, b] @ [b, C] product per
position and block, the heads and batch rows that share a rotation as its C columns; attention is then plain q.k
attention on every path (SDPA's fused kernels included). Time and memory stay linear in T, with a b x b matrix per
position and block held for the backward (d x d for the dense default, where RoPE holds d numbers).

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

SPARSE = 4  # table entries per position beyond which positions take one matrix exponential each


def rotations(generator: Tensor, positions: Tensor, scale: float) -> Tensor:
    """exp(p A) for every position: generator [S, n, b, b] skew-symmetric (S heads or 1, n blocks of b dims),
    positions [B|1, T] -> [B|1, S, T, n * b * b] in fp32 at least, each block flattened.

    Integer positions spanning lo..hi read a table of exp(lo s A) E^j, E = exp(s A) (`power_table`); positions
    that are not integers, or so sparse that the table would hold more than `SPARSE` entries per position, and
    positions under torch.compile, take one matrix exponential each."""
    compute = torch.promote_types(generator.dtype, torch.float32)
    generator = generator.to(compute)
    # Under torch.compile the table's size (set by the positions' values) would be data-dependent: no table.
    compiling = torch.compiler.is_compiling()
    integral = not compiling and (not positions.is_floating_point() or bool((positions == positions.round()).all()))
    if integral and positions.numel():
        lo, hi = (int(p) for p in torch.stack(positions.aminmax()).tolist())  # one read back
        if hi - lo + 1 <= SPARSE * positions.numel():
            table = power_table(generator, lo, hi - lo + 1, scale)  # [S, span, n, b, b]
            index = (positions - lo).long()
            if index.shape[0] == 1 and index.shape[1] == table.shape[1] and torch.equal(
                    index[0], torch.arange(index.shape[1], device=index.device)):
                return table.flatten(-3)[None]  # the current tokens are lo..hi in order: the table itself
            return table[:, index].movedim(0, 1).flatten(-3)
    p = positions.to(compute)[:, None, :, None, None, None] * scale
    return torch.linalg.matrix_exp(p * generator[None, :, None]).flatten(-3)


def power_table(generator: Tensor, lo: int, span: int, scale: float) -> Tensor:
    """[S, span, n, b, b]: entry j is exp((lo + j) s A), as exp(lo s A) times the powers E^(2^k), E = exp(s A),
    of j's binary digits. The table doubles per step (T <- [T, T E^(2^k)], one [j b, b] @ [b, b] product per
    block), so entry j is a product of at most 1 + log2(span) exponentials, each computed exactly (matrix_exp in
    fp64, then rounded to the generator's dtype): its rounding grows with the number of j's binary digits, not with
    j. (All the factors are functions of A, so they commute.) The exponentials are one batched matrix_exp call
    (on CUDA each call reads the matrices' norms back to the host to pick its degree: one wait, not one per
    factor)."""
    b = generator.shape[-1]
    wide = generator.to(torch.promote_types(generator.dtype, torch.float64))
    doublings = (span - 1).bit_length()  # entries 1, 2, 4, ... until span
    # (the powers of two made on the device: a list copied there would wait for the GPU too)
    powers = 2.0 ** torch.arange(doublings, dtype=wide.dtype, device=wide.device) * scale
    with torch.autocast(generator.device.type, enabled=False):
        # [1 + doublings, S, n, b, b]: exp(lo s A), then E^(2^k)
        exponents = torch.cat(((lo * scale * wide)[None], powers[:, None, None, None, None] * wide))
        exponentials = torch.linalg.matrix_exp(exponents).to(generator.dtype)
        table = exponentials[0]  # entry 0 [S, n, b, b]
        for step in exponentials[1:]:
            rows = min(table.shape[-2], span * b - table.shape[-2])
            table = torch.cat((table, table[..., :rows, :] @ step), dim=-2)  # [S, n, entries * b, b]
    return table.unflatten(-2, (span, b)).transpose(1, 2)  # [S, span, n, b, b]


def rotate_blocks(x: Tensor, rotation: Tensor) -> Tensor:
    """x [B, H, T, d] times each block's rotation [B|1, S, T, n * b * b] (S = 1, or the key heads: query head h
    uses h // (H / S)), computed in the rotation's dtype (also under bf16 autocast), returned in x's. The heads that
    share a rotation, and the batch rows when the rotation has one row, become the columns of one [b, b] @ [b, C]
    product per position and block."""
    B, H, T, d = x.shape
    rows, S = rotation.shape[:2]
    b = rotation.shape[-1] // d  # n * b * b / (n * b)
    R = rotation.unflatten(-1, (d // b, b, b))  # [rows, S, T, n, b, b]
    X = x.to(R.dtype).reshape(B // rows, rows, S, H // S, T, d // b, b).permute(1, 2, 4, 5, 6, 0, 3).flatten(-2)
    with torch.autocast(x.device.type, enabled=False):
        out = R @ X  # [rows, S, T, n, b, C]
    out = out.unflatten(-1, (B // rows, H // S)).permute(5, 0, 1, 6, 2, 3, 4).reshape(B, H, T, d)
    return out.contiguous().to(x.dtype)  # features contiguous: SDPA's fused kernels want them so


def rotate_pair(q: Tensor, k: Tensor, rotation: Tensor) -> tuple[Tensor, Tensor]:
    """`rotate_blocks` of queries [B, H, T, d] and keys [B, G, T, d] in one product: each key head joins the query
    heads that share its rotation (S = 1 or G), so every rotation is read, and its gradient summed, once."""
    B, H, T, d = q.shape
    G, S = k.shape[1], rotation.shape[1]
    x = torch.cat((q.reshape(B, S, H // S, T, d), k.reshape(B, S, G // S, T, d)), dim=2)
    out = rotate_blocks(x.flatten(1, 2), rotation).unflatten(1, (S, -1))
    return out[:, :, :H // S].flatten(1, 2), out[:, :, H // S:].flatten(1, 2)


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
        return rotate_pair(q, k, rotations(self.generator(), state.positions, self.scale))


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
