"""CoPE (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's Important").

Positions are counted, not indexed: each query decides which earlier tokens count. For query i and key j <= i
(d = head_dim, all per head; this is the official code's default, facebookresearch/RAM projects/cope,
`ContextPosSelfAttn` with --cope-sep-key, --cope-val-gates and --cope-nodiv off):

  gates       g_ij = sigmoid(q_i . k_j / sqrt(d))                 (0 for keys the query cannot see, padding too)
  positions   p_ij = min(sum_{t=j..i} g_it, npos_max)             (fractional; p_ii = g_ii < 1)
  embedding   e[p] = (1 - w) e[floor p] + w e[ceil p],  w = p - floor p   (interpolated between table rows)
  logits      a_ij = (q_i . k_j + q_i . e[p_ij]) / sqrt(d),       attention = softmax_j(a_ij) v_j

q_i . e[p_ij] is computed without materialising e[p_ij]: one small matmul per query against the whole table,
z_i[n] = q_i . e[n] for n = 0..npos_max, then z_i[floor p] and z_i[ceil p] are gathered and interpolated (the
interpolation weight w carries the gradient to the gates; floor and ceil do not).

Training (`CoPEAttention`, cope_ops.py, the path `cope-recompute`): queries in chunks; the forward keeps only q,
k, v, the table and the output, and the backward recomputes each chunk's logits once and takes every gradient from
them (the softmax's, the lookups' into z, the interpolation weight's, its reversed running sum's for the gates, the
sigmoid's), each a torch op over the chunk's [queries, keys] block, in place where possible. Positions only grow
along the keys (gates are >= 0): once every query of a chunk has counted npos_max, every earlier key sits at
npos_max (w = 0), so its gates are not computed (`chunk_logits`). Without gradients the same forward runs alone;
the plain formulas with autograd (`CoPELayer.chunk_attention`) serve attention.forced("dense") and probing, and are
what the tests hold the function to.

Choices, stated:
- The table e[0..npos_max] is one per layer and shared by all heads, as in the official code; it starts at zero
  like there, so a fresh CoPE model computes exactly NoPE's attention. Parameter: `model.layers.{i}.pe.pos_emb`,
  [npos_max + 1, head_dim].
- Gates use the same keys as the logits: CoPE is the layer's only PE, so there is no separate pre-/post-PE key
  (the official `--cope-sep-key` variant, a second key projection for the gates, is not implemented).
- Gates, positions and the softmax run in fp32 (fp64 for fp64 models) even under bf16 autocast: a cumulative sum
  of hundreds of gates in bf16 cannot resolve fractional positions.
- Grouped-query keys and values are expanded to one per query head (gates are per query head).
- Causal models only (positions count from the query backwards).
- An attention temperature T divides the softmax's logits, the position term included (softmax(a_ij / T)); the
  gates keep q_i . k_j / sqrt(d). A sliding window hides the keys outside it from both, like padding: positions
  count only the gates of the keys a query sees (exact; the chunks still visit every earlier key).

pe_args:
  npos_max   largest position, positions are clamped there (default: min(model.max_seq_len, 1024)). The official
             code's default is its block size + 1 table rows (`--cope-npos` unset): every position a sequence of
             training length can reach, which is what tape used before (npos_max = model.max_seq_len). Each
             query multiplies the whole table (z_i above), so that default made CoPE's cost per query grow with the
             context; the cap keeps it fixed past 1024 (the official default at a 1024-token block, and the
             default of MapFormer's CoPE baseline, `cope_npos_max = 1024`), and changes nothing for models of up
             to 1024 tokens. The resolved value is recorded in the model's config (model_config.json: model.pe_args,
             or the schedule kind of a CoPE layer; `resolved_args`), and a config saved without it (by earlier
             versions) keeps meaning model.max_seq_len for a model whose PE is CoPE (`saved_args`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    by_query_chunks,
    forced_path,
    probing_active,
    report_weights,
)
from tapecli.model.pe.cope_ops import CoPEAttention, Hidden, chunk_rows, cope_forward


class CoPELayer(LayerPE):
    def __init__(self, head_dim: int, npos_max: int) -> None:
        super().__init__()
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.zeros(npos_max + 1, head_dim))  # e[0..npos_max], shared by heads

    def init_weights(self) -> None:
        nn.init.zeros_(self.pos_emb)  # the official init: a fresh CoPE attends like NoPE

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=self.attend, plan=self.plan, reports_weights=True)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool) -> str:
        """cope-recompute (training: query chunks recomputed in the backward), cope-chunked (no gradients), or
        cope-dense (one chunk, under attention.forced("dense"): the reference)."""
        if forced_path() == "dense":
            return "cope-dense"
        return "cope-recompute" if grad else "cope-chunked"

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None, temperature: float = 1.0,
               window: int | None = None) -> Tensor:
        """Attention of queries q [B, H, Tq, d] over keys k, v [B, G, Tk, d], one chunk of queries at a time: in
        training through `CoPEAttention` (each chunk recomputed once in its own backward), otherwise without a
        graph; the plain formulas (`chunk_attention`, autograd) under attention.forced("dense") and while probed."""
        # `mask` already hides padded keys (key_mask) and keys outside the window, so their gates are zero: they never
        # count as positions.
        out_dtype = v.dtype
        if k.shape[1] != q.shape[1]:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        compute = torch.promote_types(q.dtype, torch.float32)
        B, H, Tq, _ = q.shape
        past = k.shape[2] - Tq
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.to(compute), k.to(compute), v.to(compute)
            table = self.pos_emb.to(compute)
            # Keys and values in reverse order, once: each chunk reads its keys as a view of these, latest first.
            k_rev, v_rev = k.flip(2), v.flip(2)
            hidden = Hidden(mask, past, q.device)
            if forced_path() == "dense" or probing_active():
                def chunk(i0: int, i1: int) -> Tensor:
                    keys, values = (t[:, :, t.shape[2] - past - i1:] for t in (k_rev, v_rev))
                    return self.chunk_attention(q[:, :, i0:i1], keys, values, hidden(i0, i1), table, past + i0,
                                                temperature)

                rows = Tq if forced_path() == "dense" else chunk_rows(B, H, past, Tq)
                out = by_query_chunks(chunk, Tq, rows)
            elif torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_rev, v_rev, table)):
                out = CoPEAttention.apply(q, k_rev, v_rev, table, hidden, self.npos_max, temperature)
            else:
                out = cope_forward(q, k_rev, v_rev, table, hidden, self.npos_max, temperature)[0]
        return out.to(out_dtype)

    def chunk_attention(self, q: Tensor, keys: Tensor, values: Tensor, hidden: Tensor, table: Tensor, first: int,
                        temperature: float = 1.0) -> Tensor:
        """CoPE's plain formulas (autograd records every op), for queries q [B, H, C, d] over keys and values
        [B, H, K, d] given in reverse order (latest first); hidden [.., C, K'] (K' <= K): which of the first K'
        keys each query may not see (it sees the rest); `first`: the key index of the first query. While attention
        is probed, the weights and the contextual positions are reported in key order (`report_weights`;
        positions are 0 for unseen keys). The reference `CoPEAttention` is tested against."""
        q = q * q.shape[-1] ** -0.5  # every logit and table product below is scaled once, here
        logits = q @ keys.transpose(-1, -2)  # [B, H, C, K], scaled
        block = hidden.shape[-1]
        # -inf hides a key from both its gate (sigmoid 0: it does not count) and the softmax.
        logits[..., :block].masked_fill_(hidden, float("-inf"))  # in place: the matmul's backward never reads it
        gates = torch.sigmoid(logits)
        positions = gates.cumsum(-1)  # sum over t = j..i
        if keys.shape[2] > self.npos_max:  # (a position never exceeds the number of keys)
            positions = positions.clamp(max=self.npos_max)
        floor = positions.detach().floor()
        weight = positions - floor  # differentiable in the gates
        index = floor.long()
        z = q @ table.T  # z_i[n] = q_i . e[n] (scaled): [B, H, C, npos_max + 1]
        # z[floor p] + w (z[floor p + 1] - z[floor p]): the interpolation between z[floor p] and z[ceil p] (where p
        # is whole, w = 0); the step after the last entry is 0 (p never exceeds npos_max).
        step = torch.nn.functional.pad(z[..., 1:] - z[..., :-1], (0, 1))
        # Added in place (the gates' sigmoid keeps its own output for its backward, not the logits).
        logits = logits.add_(z.gather(-1, index)).addcmul_(weight, step.gather(-1, index))
        weights = (logits if temperature == 1.0 else logits / temperature).softmax(-1)
        if probing_active():
            report_weights(weights.flip(-1), first, positions=positions.flip(-1))
        return weights @ values


NPOS_CAP = 1024  # the default npos_max for contexts longer than this (module docstring)


def saved_args(saved: dict) -> dict:
    """A saved model config (model_config.json as a dict) as today's defaults read it: CoPE configs written before
    npos_max was recorded meant npos_max = max_seq_len (the default then)."""
    if saved.get("pe") != "cope" or "npos_max" in (saved.get("pe_args") or {}) or "max_seq_len" not in saved:
        return saved
    return {**saved, "pe_args": {**(saved.get("pe_args") or {}), "npos_max": saved["max_seq_len"]}}


class CoPE(PositionalEncoding):
    claims = ("shift-invariance",)  # positions are counted from the content, never indexed

    attention_options = frozenset({"temperature", "window"})  # its own attention takes no sinks

    def __init__(self, config, *, npos_max: int | None = None) -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'cope' counts positions backwards from each query; it needs causal "
                             "attention")
        self.npos_max = min(config.max_seq_len, NPOS_CAP) if npos_max is None else npos_max
        if isinstance(self.npos_max, bool) or not isinstance(self.npos_max, int) or self.npos_max < 1:
            raise ValueError(f"model.pe_args.npos_max: expected a positive integer, got {npos_max!r}")

    def resolved_args(self) -> dict:
        """The resolved npos_max, which the model's config records (module docstring)."""
        return {"npos_max": self.npos_max}

    def make_layer(self, layer_idx: int) -> LayerPE:
        return CoPELayer(self.config.head_dim, self.npos_max)
