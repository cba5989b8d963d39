"""Multiplicative GRAPE (Zhang et al., ICLR 2026, "Group Representational Position Encoding", arXiv 2512.07805,
Sections 2-3 and Appendix D; official code github.com/model-architectures/GRAPE, `MSGRAPECommuting` in
model/llama-mha-grape-m-nonctx.py): commuting planes, learned planes, and non-commuting mixtures.

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

Contextual GRAPE (`contextual: true`, the official Type-I `MSGRAPEContextType1` of model/llama-mha-grape-m-ctx.py):
the phase of token t is not its position but a running sum of content-dependent increments,

    Phi_t = sum_{s < t} omega_s,   omega_s = softplus(w . x_s + b) >= 0     (x_s: the layer's normalised input)

one increment per token (or per key head, `ctx_per_head`), w = 0 and softplus(b) = 1e-3 at the start (the official
init), so q_t . k_s = q_t^T G(Phi_s - Phi_t) k_s. The layer computes its attention itself around tape's attention
paths (the rotation needs the layer's input): padding adds no increment, and the KV cache carries the running sum
(`state["grape_phase"]`) with the rotated keys.

Learned planes (`learned_planes: true`, Section 3.1's "learned orthogonal basis B in SO(d)", Algorithm 1 of Appendix
H): L = sum_j w_j B L_j B^T, the planes of an orthogonal basis B = exp(W - W^T) learned per layer (and per key head
with `share_across_heads: false`), W = 0 at the start (B = I: the canonical planes exactly). The generators still
commute; G(n) = B exp(n sum_j w_j L_j) B^T, and since an orthogonal map of both q and k cancels in q . k, queries and
keys are mapped by exp(n sum_j w_j L_j) B^T only (O(d^2) per token and head for B^T, then RoPE's rotation).

Non-commuting mixtures (`generators: noncommuting`, Appendix D's thin compression; the official code has no
non-commuting form, so this follows the paper's equations): the first r/2 planes (the fastest) are replaced by
E L_r E^T, E [d, r] the coordinates of those planes and

    L_r = sum_{i < r/2} w_i (a_i b_i^T - b_i a_i^T)      a_i, b_i in R^r learned, w_i = exp(l_i) their frequencies

a mixture of r/2 rank-2 generators whose planes are no longer orthogonal once trained, so they do not commute and
couple the features of the subspace. The other d/2 - r/2 planes stay commuting (they commute with the block). a_i and
b_i start at the canonical planes (a_i = e_{i+r/2}, b_i = e_i, the orientation of L_j above), so the mixture starts
as commuting GRAPE (RoPE with RoPE's spectrum; tested). exp(n L_r) has no product form, so it is computed exactly as
the matrix exponential of the r x r generator at each phase (torch.linalg.matrix_exp: scaling and squaring, accurate
to the working precision; in fp64, as fp32 rounding grows with |n L_r|), then applied to the r coordinates: O(r^3)
per position and spectrum plus O(r^2) per token and head, next to RoPE's O(d). The relative law holds exactly
(exp((s - t) L) = exp(t L)^T exp(s L)), so the KV cache keeps rotated keys as with RoPE. With `learned_planes` the
subspace is spanned by columns of B (a learned E). Both forms compose with `contextual` (the phase in place of the
position).

Every form rotates q and k before attention, so every attention path applies (SDPA's fused kernels, FlexAttention,
the chunked and dense paths), with memory linear in the length where the path has it.

pe_args:
  theta               base of the initial log-uniform spectrum (10000, the official `grape_base`)
  learnable           true (the official default): the frequencies are trained; false: frozen (RoPE, unless the
                      planes or a mixture are learned)
  share_across_heads  true (the official default): one spectrum per layer; false: one per key head
  contextual          false (default) | true: phases from the content (above)
  ctx_per_head        false (the official default) | true: one increment per key head (contextual only)
  generators          commuting (default, the official code's) | noncommuting: the mixture above
  rank                r, the mixture's subspace: even, at most the head width (8; the paper gives no default;
                      noncommuting only)
  learned_planes      false (default, the official code's canonical planes) | true: a learned basis B
No Hugging Face config expresses learned frequencies: `tape export` refuses it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    apply_rotary,
    check_positive_int,
    encoded_attention,
)

CTX_INIT_OMEGA = 1e-3  # the official initial increment (`grape_ctx_init_omega`)
GENERATORS = ("commuting", "noncommuting")
DEFAULT_RANK = 8  # the paper gives no default rank r


class GRAPELayer(LayerPE):
    def __init__(self, n_spectra: int, head_dim: int, theta: float, learnable: bool, rank: int = 0,
                 learned_planes: bool = False) -> None:
        super().__init__()
        self.theta = theta
        self.log_freq = nn.Parameter(torch.empty(n_spectra, head_dim // 2), requires_grad=learnable)
        if rank:  # the mixture's rank-2 generators L(a_i, b_i), a_i and b_i in the rank-r subspace
            self.mix_a = nn.Parameter(torch.empty(n_spectra, rank // 2, rank))
            self.mix_b = nn.Parameter(torch.empty(n_spectra, rank // 2, rank))
            half = head_dim // 2
            self.register_buffer("mix_index", torch.cat((torch.arange(rank // 2), half + torch.arange(rank // 2))),
                                 persistent=False)
        if learned_planes:  # B = exp(W - W^T), the orthogonal basis of the planes
            self.plane_log = nn.Parameter(torch.empty(n_spectra, head_dim, head_dim))
        self.init_weights()

    def init_weights(self) -> None:
        d = 2 * self.log_freq.shape[-1]
        with torch.no_grad():  # RoPE's spectrum, computed as the official code does (fp32), then its log
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
            self.log_freq.copy_(inv_freq.log().expand_as(self.log_freq))
            if hasattr(self, "mix_a"):  # the canonical planes (i, i + r/2) of the subspace: L(e_{i+r/2}, e_i)
                m = self.mix_a.shape[1]
                self.mix_a.copy_(torch.eye(2 * m)[m:].expand_as(self.mix_a))
                self.mix_b.copy_(torch.eye(2 * m)[:m].expand_as(self.mix_b))
            if hasattr(self, "plane_log"):
                self.plane_log.zero_()  # B = I: the canonical planes

    def rotary(self, phase: Tensor) -> Tensor:
        """cos | sin of every plane's angle n w_j for phases n [B|1, 1 or G, T]: [B|1, 1 or G, T, d] in fp32 at
        least."""
        compute = torch.promote_types(self.log_freq.dtype, torch.float32)
        freq = self.log_freq.to(compute).exp()  # [1 or G, d/2]
        angles = phase.to(compute)[..., None] * freq[None, :, None, :]
        return torch.cat((angles.cos(), angles.sin()), dim=-1)

    def mixture(self, phase: Tensor) -> Tensor:
        """exp(n L_r) [B|1, 1 or G, T, r, r] for phases n [B|1, 1 or G, T]: L_r = sum_i w_i (a_i b_i^T - b_i a_i^T),
        the mixture's generator in its subspace, exponentiated exactly (torch.linalg.matrix_exp of n L_r: scaling and
        squaring with a Taylor/Pade approximant accurate to the working precision), in fp64: its rounding grows with
        |n L_r| (in fp32, about 3e-3 at n = 32768, several times RoPE's fp32 angles), and r x r matrices are cheap."""
        compute = torch.float64
        m = self.mix_a.shape[1]
        w = self.log_freq[:, :m].to(compute).exp()[..., None, None]  # [S, m, 1, 1]
        a, b = self.mix_a.to(compute), self.mix_b.to(compute)
        outer = a[..., :, None] * b[..., None, :]  # [S, m, r, r]
        generator = (w * (outer - outer.transpose(-1, -2))).sum(1)  # [S, r, r]
        return torch.linalg.matrix_exp(phase.to(compute)[..., None, None] * generator[None, :, None])

    def basis(self) -> Tensor:
        """B = exp(W - W^T) [S, d, d], orthogonal (I at the start), computed in fp64 (once per forward)."""
        compute = torch.float64
        w = self.plane_log.to(compute)
        return torch.linalg.matrix_exp(w - w.transpose(-1, -2))

    def act(self, q: Tensor, k: Tensor, phase: Tensor) -> tuple[Tensor, Tensor]:
        """q [B, H, T, d] and k [B, G, T, d] acted on by exp(n L_c) B^T at phases n [B|1, 1 or G, T] (per key head:
        query head h uses key head h // (H / G)); L_c = the canonical planes (and the mixture in its subspace). The
        scores are those of G(n) = B exp(n L_c) B^T: (G(t) q)^T G(s) k = (exp(t L_c) B^T q)^T exp(s L_c) B^T k."""
        if not hasattr(self, "mix_a") and not hasattr(self, "plane_log"):
            return rotate_both(q, k, self.rotary(phase))  # commuting on the canonical planes: RoPE's operations
        rotary = self.rotary(phase)
        mix = self.mixture(phase) if hasattr(self, "mix_a") else None
        basis = self.basis() if hasattr(self, "plane_log") else None

        def one(x: Tensor) -> Tensor:
            def heads(t: Tensor, axis: int) -> Tensor:  # rows per key head (or one) -> rows per head of x
                rows = t.shape[axis]
                return t if rows == 1 else t.repeat_interleave(x.shape[1] // rows, dim=axis)

            planes = None if basis is None else heads(basis, 0).to(x.dtype)  # [1 or heads, d, d]
            y = x if planes is None else x @ planes  # B^T x
            out = apply_rotary(y, heads(rotary, 1).to(x.dtype))
            if mix is not None:
                block = (heads(mix, 1).to(x.dtype) @ y[..., self.mix_index, None])[..., 0]
                out = out.index_copy(-1, self.mix_index, block)
            return out  # B G(n) B^T x less the last B: an orthogonal map of both q and k cancels in q . k

        return one(q), one(k)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return self.act(q, k, state.positions[:, None])


def rotate_both(q: Tensor, k: Tensor, rotary: Tensor) -> tuple[Tensor, Tensor]:
    """q [B, H, T, d] and k [B, G, T, d] rotated by rotary [B|1, 1 or G, T, d] (per key head: query head h uses
    key head h // (H / G))."""
    k = apply_rotary(k, rotary.to(k.dtype))
    if rotary.shape[1] > 1:
        rotary = rotary.repeat_interleave(q.shape[1] // rotary.shape[1], dim=1)
    return apply_rotary(q, rotary.to(q.dtype)), k


class ContextualGRAPELayer(GRAPELayer):
    """Contextual GRAPE (the official `MSGRAPEContextType1`): the phase of token t is Phi_t = sum_{s < t} omega_s,
    omega_s = softplus(w . x_s + b) >= 0 one per token (or per key head), instead of its position."""

    def __init__(self, n_spectra: int, head_dim: int, theta: float, learnable: bool, dim: int,
                 n_phases: int, rank: int = 0, learned_planes: bool = False) -> None:
        super().__init__(n_spectra, head_dim, theta, learnable, rank, learned_planes)
        self.omega_proj = nn.Linear(dim, n_phases, bias=True)
        self.init_weights()

    def init_weights(self) -> None:
        super().init_weights()
        if hasattr(self, "omega_proj"):  # the official init: w = 0, softplus(b) = 1e-3
            nn.init.zeros_(self.omega_proj.weight)
            nn.init.constant_(self.omega_proj.bias, math.log(math.expm1(CTX_INIT_OMEGA)))

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        return q, k  # rotated in attend, where the layer's input is known

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=self.attend, plan=self.plan)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool) -> str:
        """grape-ctx: the phases and the rotation; the attention path after it is recorded on its own."""
        return "grape-ctx"

    def phases(self, x: Tensor, real: Tensor | None, cache: LayerCache | None) -> Tensor:
        """Phi of the current tokens [B, 1 or G, T] (fp32 at least), continuing the cached sum; padding (real
        False) adds nothing."""
        compute = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            omega = nn.functional.softplus(nn.functional.linear(
                x.to(compute), self.omega_proj.weight.to(compute), self.omega_proj.bias.to(compute)))
            if real is not None:
                omega = omega * real[..., None].to(compute)
            omega = omega.transpose(1, 2)  # [B, S, T]
            total = omega.cumsum(-1)
            phase = total - omega  # exclusive: the sum over earlier tokens
            past = None if cache is None else cache.state.get("grape_phase")
            if past is not None:
                phase, total = phase + past.to(compute), total + past.to(compute)
            if cache is not None:
                cache.state["grape_phase"] = total[..., -1:]
            return phase

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None, temperature: float = 1.0,
               window: int | None = None) -> Tensor:
        """With a cache, k is its buffer (earlier keys already rotated, then the current raw keys): the current keys
        are rotated in place, so the buffer only ever holds rotated keys."""
        T, Tk = q.shape[2], k.shape[2]
        phase = self.phases(x, None if key_mask is None else key_mask[:, -T:], cache)
        q, rotated = self.act(q, k[:, :, Tk - T:], phase)
        if cache is not None:
            k[:, :, Tk - T:].copy_(rotated)
        else:
            k = rotated
        positions = torch.arange(Tk, device=q.device)[None]  # index positions: the attention has no bias
        return encoded_attention(q, k, v, x=x, q_pos=positions[:, Tk - T:], k_pos=positions, key_mask=key_mask,
                                 window=window, temperature=temperature)


class GRAPE(PositionalEncoding):
    claims = ("shift-invariance",)

    attention_options = frozenset({"temperature", "window"})  # its own attention takes no sinks

    def __init__(self, config, *, theta: float = 10000.0, learnable: bool = True,
                 share_across_heads: bool = True, contextual: bool = False, ctx_per_head: bool = False,
                 generators: str = "commuting", rank: int | None = None, learned_planes: bool = False) -> None:
        super().__init__(config)
        if not theta > 1:
            raise ValueError(f"model.pe_args.theta: the spectrum's base must be > 1, got {theta}")
        if generators not in GENERATORS:
            raise ValueError(f"model.pe_args.generators: {generators!r} is not a GRAPE generator form; allowed: "
                             f"{', '.join(GENERATORS)}")
        if rank is not None and generators != "noncommuting":
            raise ValueError("model.pe_args.rank: the mixture's rank applies to generators: noncommuting only")
        rank = (DEFAULT_RANK if rank is None else rank) if generators == "noncommuting" else 0
        if generators == "noncommuting":
            check_positive_int("rank", rank)
            if rank % 2 or rank > config.head_dim:
                raise ValueError(f"model.pe_args.rank: must be even and at most the head width {config.head_dim}, "
                                 f"got {rank}")
        if contextual and not config.causal:
            raise ValueError("model.causal: contextual GRAPE sums increments along the causal prefix; it needs "
                             "causal attention")
        if ctx_per_head and not contextual:
            raise ValueError("model.pe_args.ctx_per_head: applies to contextual GRAPE only; set contextual: true")
        self.contextual = contextual
        self.layer_args = dict(n_spectra=1 if share_across_heads else config.n_kv_heads, head_dim=config.head_dim,
                               theta=theta, learnable=learnable, rank=rank, learned_planes=learned_planes)
        if contextual:
            self.layer_args.update(dim=config.dim, n_phases=config.n_kv_heads if ctx_per_head else 1)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return ContextualGRAPELayer(**self.layer_args) if self.contextual else GRAPELayer(**self.layer_args)
