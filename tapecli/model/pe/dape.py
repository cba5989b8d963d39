"""DAPE, data-adaptive positional encoding (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding
for Length Extrapolation", arXiv 2405.14722; official code github.com/chuanyang-Zheng/DAPE, `AliBi_DAPE` and
`ParallelKerpleLog_DAPE` in DAPE.py), version 1.

A relative bias B (ALiBi or KERPLE) is adapted to the content by a small MLP that reads, for each query-key pair,
every head's attention logit and bias at once:

    A_ij = q_i . k_j / sqrt(d)                              [H] per pair (query heads)
    logits_ij = A_ij + B_ij + f([A_ij ; B_ij])             f: Linear(2H -> width), LeakyReLU, Linear(width -> H)
    out_i = softmax_j(logits_ij) v_j over the visible keys

with the bases, per head h and distance i - j >= 0:
  alibi    B = -m_h (i - j), ALiBi's fixed slopes
  kerple   B = -r1_h log(1 + r2_h (i - j)), r1 ~ U(0, 2), r2 ~ U(0, 1) learned, kept >= 0.01 (KERPLE's log kernel)

f needs the logits of every head for every pair, so the scores are materialised: DAPE computes attention itself,
one chunk of queries at a time (`by_query_chunks`: chunks recomputed in the backward, memory linear in the length,
time quadratic like any softmax attention; no fused kernel applies). Every path is exact: `dape-dense` (one chunk,
under attention.forced("dense"): the reference) and `dape-chunked` compute the same logits. The KV cache keeps the
keys and every key's position (`dape_pos`), so cached decoding and chunked prefill equal the full forward. It
honours windows (through attention's mask) and temperatures; it does not report its weights to `tape analyze
attention` (refused in one line while probing).

Defaults as the official code: MLP width 32 (`mlp_width`), PyTorch's default initialisation of its two linear
layers (kaiming-uniform weights and uniform biases; tape's generic N(0, init_std) is undone in `init_weights`);
KERPLE's initialisation and clamp as in its code (the clamp applied in the computation rather than to the stored
value). Where we differ: grouped-query attention is supported (keys and values repeated per query head, the MLP
over the query heads); the bias and f are computed in fp32 at least under bf16 autocast.

pe_args:
  base        kerple (default) | alibi
  mlp_width   the MLP's hidden width (32)
No Hugging Face config expresses the MLP: `tape export` refuses it.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from tapecli.model.pe.alibi import alibi_slopes
from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    by_query_chunks,
    check_positive_int,
    forced_path,
    rows_for,
)

BASES = ("kerple", "alibi")
KERPLE_EPS = 1e-2  # r1 and r2 are kept >= this, as in KERPLE's code


class DAPELayer(LayerPE):
    def __init__(self, n_heads: int, base: str, mlp_width: int) -> None:
        super().__init__()
        self.base = base
        if base == "alibi":
            self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)
            self.r1 = self.r2 = None
        else:
            self.r1 = nn.Parameter(torch.empty(n_heads))
            self.r2 = nn.Parameter(torch.empty(n_heads))
        self.mlp = nn.Sequential(nn.Linear(2 * n_heads, mlp_width), nn.LeakyReLU(), nn.Linear(mlp_width, n_heads))
        self.init_weights()

    def init_weights(self) -> None:
        for layer in (self.mlp[0], self.mlp[2]):
            layer.reset_parameters()  # PyTorch's default, as the official code
        if self.r1 is not None:
            with torch.no_grad():
                self.r1.uniform_(0, 2)
                self.r2.uniform_(0, 1)

    def bias(self, distance: Tensor) -> Tensor:
        """The base bias [B|1, H, C, K] at distances i - j [B|1, C, K] (float)."""
        distance = distance[:, None]
        if self.base == "alibi":
            return -self.slopes.to(distance)[:, None, None] * distance
        r1 = self.r1.clamp(min=KERPLE_EPS).to(distance)[:, None, None]
        r2 = self.r2.clamp(min=KERPLE_EPS).to(distance)[:, None, None]
        return -r1 * torch.log1p(r2 * distance.clamp(min=0))

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=functools.partial(self.attend, positions=state.positions), plan=self.plan)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool) -> str:
        """dape-dense (one chunk, under attention.forced("dense"): the reference) or dape-chunked."""
        return "dape-dense" if forced_path() == "dense" else "dape-chunked"

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None, positions: Tensor, temperature: float = 1.0,
               window: int | None = None) -> Tensor:
        """Queries q [B, H, Tq, d] over keys and values k, v [B, G, Tk, d] (cached ones first); `positions` [B|1, Tq]
        of the queries; `mask` (with the window and padding) or plain causality says which keys each query sees."""
        B, H, Tq, d = q.shape
        Tk = k.shape[2]
        past = Tk - Tq
        q_pos = positions.expand(B, Tq)
        if cache is not None:
            (k_pos,) = cache.append(dape_pos=q_pos[:, None, :, None].to(torch.float64))
            k_pos = k_pos[:, 0, :, 0]
        else:
            k_pos = q_pos
        if k.shape[1] != H:
            k, v = (t.repeat_interleave(H // k.shape[1], dim=1) for t in (k, v))
        out_dtype = v.dtype
        compute = torch.promote_types(q.dtype, torch.float32)
        keys = torch.arange(Tk, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.to(compute) * d ** -0.5, k.to(compute), v.to(compute)

            def chunk(i0: int, i1: int) -> Tensor:
                if mask is None:  # the queries are the last Tq of Tk keys (one decoding step sees them all)
                    hidden = keys[None, :] > past + torch.arange(i0, i1, device=q.device)[:, None]
                else:
                    hidden = ~(mask[..., i0:i1, :] if mask.dtype == torch.bool else mask[..., i0:i1, :] > float("-inf"))
                distance = (q_pos[:, i0:i1, None] - k_pos[:, None, :]).to(compute)  # [B, C, Tk]
                scores = q[:, :, i0:i1] @ k.transpose(-1, -2)  # [B, H, C, Tk], scaled
                bias = self.bias(distance).expand_as(scores)
                adapted = self.mlp(torch.cat((scores, bias), dim=1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
                logits = (scores + bias + adapted).masked_fill(hidden, float("-inf"))
                weights = (logits if temperature == 1.0 else logits / temperature).softmax(-1)
                return weights @ v

            width = 2 * H + self.mlp[0].out_features  # [B, C, Tk, width] is the largest temporary of a chunk
            rows = Tq if forced_path() == "dense" else rows_for(B, width, Tk, Tq)
            out = by_query_chunks(chunk, Tq, rows)
        return out.to(out_dtype)


class DAPE(PositionalEncoding):
    claims = ("shift-invariance",)

    attention_options = frozenset({"temperature", "window"})  # its own attention takes no sinks

    def __init__(self, config, *, base: str = "kerple", mlp_width: int = 32) -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'dape' adapts causal biases (distances i - j >= 0); it needs causal "
                             "attention")
        if base not in BASES:
            raise ValueError(f"model.pe_args.base: unknown DAPE base bias {base!r}; allowed: {', '.join(BASES)}")
        check_positive_int("mlp_width", mlp_width)
        self.layer_args = dict(n_heads=config.n_heads, base=base, mlp_width=mlp_width)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return DAPELayer(**self.layer_args)

