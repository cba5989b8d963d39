"""Additive GRAPE: path-integral GRAPE-AP and the gated GRAPE-A (Zhang et al., ICLR 2026, "Group Representational
Position Encoding", arXiv 2512.07805, Sections 4-5; official code github.com/model-architectures/GRAPE,
`CausalSelfAttention` in model/llama-mha-grape-a-pi.py, `QueryGatedAdditiveBias`, `KeyGatedAdditiveBias` and
`QueryKeyGatedAdditiveBias` in model/llama-mha-grape-a-{querygated,keygated,querykeygated}.py).

Additive GRAPE adds to the logit of query t and key j a bias that is a path sum of edge potentials over the tokens
between them,

    logits_tj = q_t . k_j / sqrt(d) + b_h(t, j),     b_h(t, j) = sum_{l = j+1}^{t} psi_h(t, l)      (b_h(t, t) = 0)

`potential` picks psi:
  official   psi_h(t, l) = m_h log sigmoid(p_t . R(l) p^_l / D_p)    (the official code: p = W_p x per head, of width
             D_p = `p_head_dim`; p^ its RMS-normalisation without weight; R(l) rotates every pair (i, i + D_p/2) of
             p^_l by the angle -l, the official rotary of base 1; m_h ALiBi's slopes)
  alibi      psi_h(t, l) = -m_h: b = -m_h (t - j), ALiBi exactly (the paper's rank-1 unipotent special case)
  fox        psi_h(t, l) = log sigmoid(w_h . x_l + b_h): FoX's forget gates exactly (the paper's content-gated case;
             parameters `fgate_proj` as FoX's, weight N(0, init_std), bias 0)

or, not a path sum, the gated linear biases of GRAPE-A (the paper's Eq. 4.5, the rank-1 unipotent action with
content-gated slopes):

    b_h(t, j) = -(t - j) w_h (lambda_q(q_t) + lambda_k(k_j)),   lambda_q = softplus(v_h . q_t / sqrt(d)),
                                                                lambda_k = softplus(u_h . k_j / sqrt(d))
  querygated      lambda_k = 0          keygated   lambda_q = 0          querykeygated   both
with w_h = softplus(o_h) m_h (o_h learned, softplus(o_h) = 1 at the start; m_h ALiBi's slopes), u_h and v_h learned
per query head, N(0, 1/d) at the start and L2-normalised where used (eps 1e-6): all as the official code. t - j is
the distance in tokens (padding sits at the ends, so between real tokens it is their position difference); the
gates read the queries and keys attention receives, so the KV cache's keys give every cached key's gate.

The official potential reads the key's absolute position through R(l), so it is not shift-invariant (no `claims`);
the others are. The bias depends on the query and on every key, so the scores are materialised:
GRAPE-AP computes attention itself, one chunk of queries at a time (`by_query_chunks`: recomputed in the backward,
memory linear in the length). For each chunk the potentials of every visible key are summed from the far end,
sum_{l > j}, in fp32 at least; a padded token's potential is 0, so padding changes nothing. The KV cache keeps each
key's part of the potential (R(l) p^_l, or the log gate). `grape-ap-dense` (one chunk, under
attention.forced("dense"): the reference) and `grape-ap-chunked` are exact.

pe_args:
  potential    official (default) | alibi | fox | querygated | keygated | querykeygated
  p_head_dim   D_p, even (0, the default: head_dim, the official default; its GRAPE-AP runs used 8)
Where we differ from the official code: the positional projection is never tied to q, k or v (`p_tie_mode: none`,
its default); grouped-query attention is supported (the potentials are per query head). No Hugging Face config
expresses the bias: `tape export` refuses it.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tapecli.model.pe.alibi import alibi_slopes
from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    by_query_chunks,
    forced_path,
    rows_for,
)

GATED = ("querygated", "keygated", "querykeygated")
POTENTIALS = ("official", "alibi", "fox", *GATED)
GATE_EPS = 1e-6  # the official L2 normalisation's eps


class GRAPEAPLayer(LayerPE):
    def __init__(self, dim: int, n_heads: int, potential: str, p_head_dim: int, head_dim: int = 0) -> None:
        super().__init__()
        self.n_heads, self.potential, self.p_head_dim = n_heads, potential, p_head_dim
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)
        self.p_proj = nn.Linear(dim, n_heads * p_head_dim, bias=False) if potential == "official" else None
        self.fgate_proj = nn.Linear(dim, n_heads, bias=True) if potential == "fox" else None
        if potential in GATED:
            self.gate_omega = nn.Parameter(torch.empty(n_heads))
            self.gate_v = nn.Parameter(torch.empty(n_heads, head_dim)) if potential != "keygated" else None
            self.gate_u = nn.Parameter(torch.empty(n_heads, head_dim)) if potential != "querygated" else None
            self.init_weights()

    def init_weights(self) -> None:
        if self.fgate_proj is not None:
            nn.init.zeros_(self.fgate_proj.bias)  # FoX's init; the weights got N(0, init_std) like every linear
        if self.potential in GATED:  # the official init: softplus(o) = 1, u and v ~ N(0, 1/d)
            with torch.no_grad():
                self.gate_omega.fill_(math.log(math.expm1(1.0)))
                for p in (self.gate_v, self.gate_u):
                    if p is not None:
                        p.normal_(0.0, p.shape[-1] ** -0.5)

    def gate(self, x: Tensor, vector: Tensor | None) -> Tensor | None:
        """softplus(w_h . x / sqrt(d)) [B, H, T] with w_h L2-normalised, for x [B, H, T, d] (None: no gate)."""
        if vector is None:
            return None
        w = F.normalize(vector.to(x.dtype), p=2, dim=-1, eps=GATE_EPS)
        return F.softplus((x * w[None, :, None, :]).sum(-1) / x.shape[-1] ** 0.5)

    def gated_bias(self, gate_q: Tensor | None, gate_k: Tensor | None, distance: Tensor) -> Tensor:
        """-(t - j) w_h (lambda_q + lambda_k) [B, H, C, Tk] for a chunk's query gates [B, H, C], every key's gate
        [B, H, Tk] and the distances t - j [C, Tk] (>= 0)."""
        w = F.softplus(self.gate_omega.to(distance)) * self.slopes.to(distance)
        rate = sum(g for g in (None if gate_q is None else gate_q[..., :, None],
                               None if gate_k is None else gate_k[..., None, :]) if g is not None)
        return -distance * w[None, :, None, None] * rate

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=functools.partial(self.attend, positions=state.positions), plan=self.plan)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool) -> str:
        """grape-ap-dense (one chunk, under attention.forced("dense"): the reference) or grape-ap-chunked."""
        return "grape-ap-dense" if forced_path() == "dense" else "grape-ap-chunked"

    def features(self, x: Tensor, positions: Tensor, compute: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """(the queries' part [B, H, T, D_p] or None, the keys' part [B, H, T, D_p or 1] or None) of the potential
        for the current tokens x [B, T, dim] at positions [B|1, T]."""
        if self.potential in ("alibi", *GATED):
            return None, None
        B, T, _ = x.shape
        x = x.to(compute)
        if self.potential == "fox":
            gate = F.linear(x, self.fgate_proj.weight.to(compute), self.fgate_proj.bias.to(compute))
            return None, F.logsigmoid(gate).transpose(1, 2)[..., None]
        p = F.linear(x, self.p_proj.weight.to(compute)).view(B, T, self.n_heads, self.p_head_dim).transpose(1, 2)
        normed = F.rms_norm(p, (self.p_head_dim,))
        half = self.p_head_dim // 2
        angle = positions.to(compute)[:, None, :, None]  # every pair at angle l (base 1), rotated by -l
        cos, sin = angle.cos(), angle.sin()
        x1, x2 = normed[..., :half], normed[..., half:]
        return p, torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)

    def potentials(self, query: Tensor | None, keys: Tensor | None, shape: tuple[int, ...],
                   compute: torch.dtype) -> Tensor:
        """psi [B, H, C, Tk] of a chunk's queries (their part [B, H, C, D_p]) and every key (their part)."""
        m = self.slopes.to(compute)
        if self.potential == "alibi":
            return (-m)[None, :, None, None].expand(shape)
        if self.potential == "fox":
            return keys[..., 0][:, :, None, :].expand(shape)
        return m[None, :, None, None] * F.logsigmoid(query @ keys.transpose(-1, -2) / self.p_head_dim)

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None, positions: Tensor, temperature: float = 1.0,
               window: int | None = None) -> Tensor:
        """Queries q [B, H, Tq, d] over keys and values k, v [B, G, Tk, d] (cached ones first); `positions` [B|1, Tq]
        of the current tokens; `mask` (window, padding) or plain causality says which keys each query sees."""
        B, H, Tq, d = q.shape
        Tk = k.shape[2]
        past = Tk - Tq
        if k.shape[1] != H:
            k, v = (t.repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
        out_dtype = v.dtype
        compute = torch.promote_types(q.dtype, torch.float32)
        key_index = torch.arange(Tk, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            query, keys = self.features(x, positions.expand(B, Tq), compute)
            if cache is not None and keys is not None:
                (keys,) = cache.append(grape_ap=keys)
            q, k, v = q.to(compute), k.to(compute), v.to(compute)
            gate_q = gate_k = None  # bound for every potential: torch.compile reads the closure's cells
            if self.potential in GATED:  # the official gates read the unscaled queries and keys
                gate_q, gate_k = self.gate(q, self.gate_v), self.gate(k, self.gate_u)
            q = q * d ** -0.5
            real = None if key_mask is None else key_mask[:, None, None, :]  # padded keys: no potential

            def chunk(i0: int, i1: int) -> Tensor:
                query_index = past + torch.arange(i0, i1, device=q.device)[:, None]
                later = key_index[None, :] > query_index  # [C, Tk]
                if self.potential in GATED:
                    distance = (query_index - key_index[None, :]).clamp(min=0).to(compute)
                    bias = self.gated_bias(None if gate_q is None else gate_q[:, :, i0:i1], gate_k, distance)
                else:
                    psi = self.potentials(None if query is None else query[:, :, i0:i1], keys,
                                          (B, H, i1 - i0, Tk), compute)
                    psi = psi.masked_fill(later, 0.0)
                    if real is not None:
                        psi = psi.masked_fill(~real, 0.0)
                    bias = psi.flip(-1).cumsum(-1).flip(-1) - psi  # sum over l > j (l <= t: later keys are 0)
                hidden = later if mask is None else ~(mask[..., i0:i1, :] if mask.dtype == torch.bool
                                                      else mask[..., i0:i1, :] > float("-inf"))
                logits = (q[:, :, i0:i1] @ k.transpose(-1, -2) + bias).masked_fill(hidden, float("-inf"))
                weights = (logits if temperature == 1.0 else logits / temperature).softmax(-1)
                return weights @ v

            rows = Tq if forced_path() == "dense" else rows_for(B, H, Tk, Tq, budget=2)
            out = by_query_chunks(chunk, Tq, rows)
        return out.to(out_dtype)


class GRAPEAP(PositionalEncoding):
    attention_options = frozenset({"temperature", "window"})  # its own attention takes no sinks

    def __init__(self, config, *, potential: str = "official", p_head_dim: int = 0) -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'grape-ap' sums potentials along the causal path; it needs causal "
                             "attention")
        if potential not in POTENTIALS:
            raise ValueError(f"model.pe_args.potential: unknown GRAPE-AP potential {potential!r}; allowed: "
                             f"{', '.join(POTENTIALS)}")
        if isinstance(p_head_dim, bool) or not isinstance(p_head_dim, int) or p_head_dim < 0 or p_head_dim % 2:
            raise ValueError(f"model.pe_args.p_head_dim: must be an even whole number (0: head_dim), got "
                             f"{p_head_dim!r}")
        self.claims = ("shift-invariance",) if potential != "official" else ()
        self.layer_args = dict(dim=config.dim, n_heads=config.n_heads, potential=potential,
                               p_head_dim=p_head_dim or config.head_dim, head_dim=config.head_dim)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return GRAPEAPLayer(**self.layer_args)
