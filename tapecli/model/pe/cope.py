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

pe_args:
  npos_max   largest position, positions are clamped there (default: model.max_seq_len, i.e. the official code's
             default of block size + 1 table rows: every position a sequence of training length can reach)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tapecli.model.cache import LayerCache
from tapecli.model.pe.base import LayerPE, PositionalEncoding


def visible_keys(mask: Tensor | None, q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Boolean [..., Tq, Tk]: which keys each query may see, from `attention_mask`'s (mask, is_causal) for causal
    models (mask None means plain causal: the queries are the last q_len of k_len tokens)."""
    if mask is None:
        return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
    return mask if mask.dtype == torch.bool else mask > float("-inf")


class CoPELayer(LayerPE):
    def __init__(self, head_dim: int, npos_max: int) -> None:
        super().__init__()
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.zeros(npos_max + 1, head_dim))  # e[0..npos_max], shared by heads

    def init_weights(self) -> None:
        nn.init.zeros_(self.pos_emb)  # the official init: a fresh CoPE attends like NoPE

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None) -> Tensor:
        # `mask` already hides padded keys (key_mask), so their gates are zero: padding never counts as a position.
        out_dtype = v.dtype
        if k.shape[1] != q.shape[1]:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        compute = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            q, k, v = q.to(compute), k.to(compute), v.to(compute)
            scale = q.shape[-1] ** -0.5
            seen = visible_keys(mask, q.shape[2], k.shape[2], q.device)
            logits = q @ k.transpose(-1, -2)  # [B, H, Tq, Tk]
            gates = torch.sigmoid(logits * scale).masked_fill(~seen, 0.0)
            positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max)  # sum over t = j..i
            floor = positions.detach().floor()
            weight = positions - floor  # differentiable in the gates
            table = q @ self.pos_emb.to(compute).T  # z_i[n] = q_i . e[n]: [B, H, Tq, npos_max + 1]
            low = table.gather(-1, floor.long())
            high = table.gather(-1, positions.detach().ceil().long())
            scores = (logits + low + weight * (high - low)) * scale
            attention = scores.masked_fill(~seen, float("-inf")).softmax(-1)
            return (attention @ v).to(out_dtype)


class CoPE(PositionalEncoding):
    def __init__(self, config, *, npos_max: int | None = None) -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'cope' counts positions backwards from each query; it needs causal "
                             "attention")
        self.npos_max = config.max_seq_len if npos_max is None else npos_max
        if isinstance(self.npos_max, bool) or not isinstance(self.npos_max, int) or self.npos_max < 1:
            raise ValueError(f"model.pe_args.npos_max: expected a positive integer, got {npos_max!r}")

    def make_layer(self, layer_idx: int) -> LayerPE:
        return CoPELayer(self.config.head_dim, self.npos_max)
