"""TAPE (Zhu et al., ICML 2025): contextualized equivariant positional encoding.

A positional state E travels beside the hidden state through every layer. It starts as RoPE's rotary state and
is used by attention exactly like RoPE (queries and keys rotated by each token's state). Each layer then updates
it from the content, in two places:

  after attention   E <- E + P(A E)                       A: the same attention weights that mix the values,
                                                          P: an M x M head-mixing map (zero-initialised)
  after the MLP     E <- E + W2 diag(SiLU(Wx u)) W1 E     u: the MLP output (the official code's choice),
                                                          W1: I x M (zero-initialised), W2: M x I, I = 4M

Every map mixes heads only and acts identically on every entry of a head's state, so the model stays equivariant
to token permutations and to a shared orthogonal transform of E; with RoPE's start that makes it exactly
invariant to a global shift of all positions. Because W1 and P start at zero, a fresh TAPE model computes
exactly what a RoPE model with the same shared weights computes.

Storage: for each head and rotary pair i the state is a 2x2 block [[c, -s], [s, c]] (RoPE's rotation, later a
scaled rotation); since every update treats all entries alike, the two halves that the official code stores
(cos and sin duplicated over i and i + d/2) stay equal forever, so we keep one copy: E is [B, M, T, d] =
[c_0..c_{d/2-1} | s_0..s_{d/2-1}], the same width as a value head, held in fp32 by default; its updates
are computed in the state dtype, under autocast too (attention's average A E runs in the activation dtype).

pe_args (plus every RoPE argument, which shapes the initial state):
  variant      paper: P is a real M x M head-mixing map (default);
               official: P is the official code's per-head scalar (row sums of the M x M weight), for comparison
  hidden       I, hidden width of the content gate (default 4 * n_heads)
  gate_input   mlp_out (default, official) | mlp_in (normalised MLP input) | residual (hidden state after the MLP)
  attn_update  false disables the update after attention (ablation)
  mlp_update   false disables the update after the MLP (ablation)
  mix          heads (default, equivariant) | full (ablation without equivariance: dense maps over heads x dims,
               like the official `adawoeq`; breaks shift invariance)
  aggregation  concat (default) | separate: how attention also averages E. `concat` runs one attention over
               [V | E], with queries and keys zero-padded to that width so fused kernels (and flash-attn) apply:
               the weights are computed once, like the paper's fused kernel. `separate` runs a second attention
               call with E as the values. Both are exact; on the 2-core CPU concat was as fast or faster in 2 of
               3 `tape bench` runs (docs/speed.md)
  state_dtype  float32 (default; fp64 for fp64 models) | model (the parameter dtype, like the official code)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tapecli.model.pe.base import LayerPE, PositionState, WideValue, apply_rotary, check_positive_int
from tapecli.model.pe.rope import RoPE

VARIANTS = ("paper", "official")
GATE_INPUTS = ("mlp_out", "mlp_in", "residual")
MIXES = ("heads", "full")
AGGREGATIONS = ("concat", "separate")
STATE_DTYPES = ("float32", "model")


def state_precision(E: Tensor):
    """The state's updates are small M x M maps: run them in the state's dtype (fp32 by default) even under
    autocast, which would otherwise round them to bf16 and let the state drift."""
    return torch.autocast(E.device.type, enabled=False)


def mix_heads(weight: Tensor, E: Tensor) -> Tensor:
    """weight [out, M] applied along the head axis of E [B, M, T, d] -> [B, out, T, d], as one batched matmul on
    E's own layout (no permute copies)."""
    B, M, T, d = E.shape
    return torch.matmul(weight, E.reshape(B, M, T * d)).view(B, weight.shape[0], T, d)


class TAPELayer(LayerPE):
    """One layer's contextualisers. Parameter names: x_proj (Wx), up_proj (W1), down_proj (W2), post_attn_proj (P)."""

    def __init__(self, dim: int, n_heads: int, head_dim: int, hidden: int, variant: str, gate_input: str,
                 attn_update: bool, mlp_update: bool, mix: str, aggregation: str) -> None:
        super().__init__()
        self.variant, self.gate_input, self.mix, self.aggregation = variant, gate_input, mix, aggregation
        self.attn_update, self.mlp_update = attn_update, mlp_update
        mixed = n_heads if mix == "heads" else n_heads * head_dim  # the axis W1/W2 mix
        self.x_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(mixed, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, mixed, bias=False)
        self.post_attn_proj = nn.Linear(n_heads, n_heads, bias=False)

    def init_weights(self) -> None:
        # Zero W1 and P so both updates start at exactly zero: a fresh TAPE model is its RoPE model.
        nn.init.zeros_(self.up_proj.weight)
        nn.init.zeros_(self.post_attn_proj.weight)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        # E is per query head, so grouped keys are expanded to one key per query head first.
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return apply_rotary(q, state.rotary), apply_rotary(k, state.rotary)

    def need(self, state: PositionState, average_state: bool) -> WideValue | None:
        """Attention also averages E with its weights: E rides along as extra value columns ([V | E])."""
        return WideValue(state.rotary, self.aggregation) if average_state else None

    def after_attention(self, state: PositionState, aggregated: Tensor) -> PositionState:
        """aggregated = A E, per head: [B, M, T, d] in the state dtype."""
        if not self.attn_update:
            return state
        with state_precision(state.rotary):
            weight = self.post_attn_proj.weight.to(aggregated.dtype)
            if self.variant == "official":
                # The official einsum `bqnd,qe->bqnd` sums the weight over its second index: a per-head scalar.
                update = aggregated * weight.sum(-1)[:, None, None]
            else:
                update = mix_heads(weight, aggregated)
        return state.replace(rotary=state.rotary + update)

    def after_mlp(self, state: PositionState, mlp_in: Tensor, mlp_out: Tensor, hidden: Tensor) -> PositionState:
        """E <- E + W2 diag(SiLU(Wx u)) W1 E, with u chosen by gate_input; hidden states are [B, T, C]."""
        if not self.mlp_update:
            return state
        u = {"mlp_out": mlp_out, "mlp_in": mlp_in, "residual": hidden}[self.gate_input]
        E = state.rotary
        with state_precision(E):
            gate = F.silu(F.linear(u.to(E.dtype), self.x_proj.weight.to(E.dtype)))  # [B, T, I]
            w1, w2 = self.up_proj.weight.to(E.dtype), self.down_proj.weight.to(E.dtype)
            if self.mix == "heads":
                # Per token this is one M x M map, G_t = W2 diag(g_t) W1, applied to E_t: forming G first keeps
                # the intermediates at M x M per token instead of I x d (1.5-3x faster for 12-32 heads).
                G = torch.einsum("mi,bti,in->btmn", w2, gate, w1)
                update = torch.einsum("btmn,bntd->bmtd", G, E)
            else:
                B, M, T, d = E.shape
                mixed = E.transpose(1, 2).reshape(B, T, M * d)
                update = F.linear(F.linear(mixed, w1) * gate, w2).reshape(B, T, M, d).transpose(1, 2)
        return state.replace(rotary=E + update)


class TAPE(RoPE):
    rotary_layouts = False  # its layers use the full-width, one-copy rotary state

    carries_state = True

    def __init__(self, config, *, variant: str = "paper", hidden: int | None = None, gate_input: str = "mlp_out",
                 attn_update: bool = True, mlp_update: bool = True, mix: str = "heads", aggregation: str = "concat",
                 state_dtype: str = "float32", **rope_args) -> None:
        super().__init__(config, **rope_args)
        for key, value, allowed in (("variant", variant, VARIANTS), ("gate_input", gate_input, GATE_INPUTS),
                                    ("mix", mix, MIXES), ("aggregation", aggregation, AGGREGATIONS),
                                    ("state_dtype", state_dtype, STATE_DTYPES)):
            if value not in allowed:
                raise ValueError(f"model.pe_args.{key}: unknown value {value!r}; allowed: {', '.join(allowed)}")
        if hidden is None:
            hidden = 4 * config.n_heads
        check_positive_int("hidden", hidden)
        self.layer_args = dict(dim=config.dim, n_heads=config.n_heads, head_dim=config.head_dim,
                               hidden=hidden, variant=variant, gate_input=gate_input,
                               attn_update=attn_update, mlp_update=mlp_update, mix=mix, aggregation=aggregation)
        # How attention also averages E (None: it doesn't, when the post-attention update is ablated).
        self.aggregation = aggregation if attn_update else None
        self.state_dtype = state_dtype
        if mix == "full":
            self.claims = ()  # dense maps over heads x dims: neither equivariant nor shift-invariant

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        """RoPE's rotary state, one copy per head (heads diverge as soon as the layers update them)."""
        rotary = self.rotary(positions, dtype)
        if self.state_dtype == "model":
            rotary = rotary.to(dtype)
        rotary = rotary.expand(positions.shape[0], self.config.n_heads, -1, -1)
        return PositionState(positions=positions, rotary=rotary)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return TAPELayer(**self.layer_args)
