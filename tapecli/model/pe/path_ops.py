"""PaTH's exact attention (the math of `tapecli.model.pe.path`, whose docstring derives it), in two arrangements.

    out, keys = path_attention(q, keys, v, w, beta, mask, chunk_size, keep_keys)   # chunk by chunk, with a past
    out = path_attention_by_queries(q, k, v, w, beta, mask, chunk_size)            # for training

`path_attention` walks the sequence chunk by chunk and carries every earlier key transformed up to the current
chunk; it continues a KV cache (the keys it returns are what the cache holds) and, without gradients, its memory
is linear. Under autograd, though, every chunk's logits and transformed keys would be kept for the backward
([T, T] per head in all). `path_attention_by_queries` computes the same logits so that each group of query chunks
is independent of the others: a query is carried backwards through the chunks' maps instead of the keys forward,

  a_ij = (q'_i M_{c-1}^T ... M_{c'+1}^T) . k^_j     (i in chunk c, j in an earlier chunk c')

with q'_i the query after its own chunk's maps up to itself, k^_j the key after its own chunk's maps from itself
to the chunk's end, and M_b = I - W_b^T (A D)_b^T W_b the d x d map of chunk b (keys <- keys M_b). Each group of
queries then runs under `tapecli.model.attention.recompute` (recomputed in the backward), so training keeps only
O(T d) per head. Both are tested against a naive fp64 loop over all (i, j).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tapecli.model.attention import recompute


def chunk_factors(q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The UT/WY factors of chunks of C tokens: q [B, G, r, (N,) C, d]; k, w [B, G, (N,) C, d]; beta [B, G, (N,) C].
    Returns AD [.., C, C] (A_st beta_t, A = (I + strict_lower(D W W^T))^-1), corr [B, G, r, (N,) C, C]
    (sum_{s <= i} (q_i . w_s) A_st beta_t) and wk [.., C, C] (w_t . k_j for t > j, else 0)."""
    C = w.shape[-2]
    later = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)  # [s, t]: t < s
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    lower = (beta[..., :, None] * (w @ w.transpose(-1, -2))).masked_fill(~later, 0.0)
    A = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    AD = A * beta[..., None, :]
    corr = (q @ w.unsqueeze(2).transpose(-1, -2)).tril() @ AD.unsqueeze(2)
    wk = (w @ k.transpose(-1, -2)).masked_fill(~later, 0.0)
    return AD, corr, wk


def path_attention(q: Tensor, keys: Tensor, v: Tensor, w: Tensor, beta: Tensor, mask: Tensor | None,
                   chunk_size: int, keep_keys: bool) -> tuple[Tensor, Tensor | None]:
    """Exact PaTH attention of T new tokens after n earlier ones (module docstring), in the dtype of its inputs.

    q [B, H, T, d]; keys [B, G, n + T, d] with G key heads (H a multiple of G): the n earlier tokens' keys already
    transformed up to the last of them, then the T current keys; w [B, G, T, d], beta [B, G, T]: the current
    tokens' maps; v [B, G, n + T, d]; mask: bool [B or 1, 1 or H, T, n + T], which keys each query may see, or None
    for plain causal (built one chunk at a time, so memory stays linear in n + T). Returns the output [B, H, T, d]
    and, when keep_keys, all n + T keys transformed up to the last token (what the next call's `keys` starts with)."""
    B, H, T, d = q.shape
    G, n = keys.shape[1], keys.shape[2] - T
    q = q.view(B, G, H // G, T, d)  # the heads of a group share its keys and maps
    v = v.unsqueeze(2)
    if mask is not None:
        mask = mask.unsqueeze(2) if mask.shape[1] == 1 else mask.unflatten(1, (G, H // G))
    keys, k = keys[:, :, :n], keys[:, :, n:]
    outputs = []
    for c0 in range(0, T, chunk_size):
        c1 = min(c0 + chunk_size, T)
        qc, kc, wc, bc = q[..., c0:c1, :], k[:, :, c0:c1], w[:, :, c0:c1], beta[:, :, c0:c1]
        C, m = c1 - c0, keys.shape[2]  # m = n + c0 earlier keys
        AD, corr, wk = chunk_factors(qc, kc, wc, bc)
        # Earlier keys: the correction factors through the key, (q_i - sum_t corr_it w_t) . x_j: one matmul.
        past_logits = (qc - corr @ wc.unsqueeze(2)) @ keys.unsqueeze(2).transpose(-1, -2)
        chunk_logits = qc @ kc.unsqueeze(2).transpose(-1, -2) - corr @ wk.unsqueeze(2)
        logits = torch.cat((past_logits, chunk_logits), dim=-1) * d ** -0.5
        if mask is None:
            seen = torch.ones(C, m + C, dtype=torch.bool, device=q.device).tril(m)
        else:
            seen = mask[..., c0:c1, :m + C]
        outputs.append(logits.masked_fill(~seen, float("-inf")).softmax(-1) @ v[..., :m + C, :])
        if c1 < T or keep_keys:
            # Advance every key through the chunk's maps, x_j <- x_j - sum_s (A D W x_j)_s w_s: for the earlier
            # keys one d x d map, I - W^T (A D)^T W.
            keys = torch.cat((keys - keys @ (wc.transpose(-1, -2) @ (AD.transpose(-1, -2) @ wc)),
                              kc - (AD @ wk).transpose(-1, -2) @ wc), dim=2)
    return torch.cat(outputs, dim=-2).reshape(B, H, T, d), keys if keep_keys else None


def path_attention_by_queries(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, mask: Tensor | None,
                              chunk_size: int) -> Tensor:
    """`path_attention` of T tokens with no earlier ones (same arguments; k, v [B, G, T, d]), arranged by groups
    of query chunks, each recomputed in the backward: memory O(T d) per head plus one group's [rows, T] logits."""
    B, H, T, d = q.shape
    G, C = k.shape[1], chunk_size
    N = -(-T // C)
    if N * C != T:  # pad to whole chunks: H = I there (w = 0, beta = 0), and real queries never see those keys
        pad = N * C - T
        q, k, v, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, w))
        beta = F.pad(beta, (0, pad))
        if mask is not None:
            mask = torch.cat((F.pad(mask, (0, pad), value=False),
                              mask.new_ones(*mask.shape[:2], pad, N * C)), dim=-2)
    r = H // G
    # Every logit is linear in its query: scale the queries once instead of every logit (forward and backward).
    q = (q * d ** -0.5).view(B, G, r, N, C, d)  # the heads of a group share its keys and maps
    k, w, beta = k.view(B, G, N, C, d), w.view(B, G, N, C, d), beta.view(B, G, N, C)
    AD, corr, wk = chunk_factors(q, k, w, beta)
    q_own = q - corr @ w.unsqueeze(2)  # each query after its own chunk's maps up to itself
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    own = (q @ k.unsqueeze(2).transpose(-1, -2) - corr @ wk.unsqueeze(2)).masked_fill(~causal, float("-inf"))
    k_end = k - (AD @ wk).transpose(-1, -2) @ w  # each key after its own chunk's maps, to the chunk's end
    maps_t = torch.eye(d, dtype=q.dtype, device=q.device) - (AD.transpose(-1, -2) @ w).transpose(-1, -2) @ w
    v = v.unsqueeze(2)
    if mask is not None:
        mask = mask.unsqueeze(2) if mask.shape[1] == 1 else mask.unflatten(1, (G, r))
    # Per-chunk pieces as separate tensors: each step's gradient lands in its own piece (slicing one big tensor
    # would allocate and add a full-size gradient at every step).
    q_own, own = q_own.unbind(3), own.unbind(3)  # [B, G, r, C, d], [B, G, r, C, C]
    key_maps = torch.cat((k_end.transpose(-1, -2), maps_t), dim=-1).unbind(2)  # [B, G, d, C + d]: keys | map
    k_end = k_end.transpose(-1, -2).unbind(2)  # [B, G, d, C]

    def group(i0: int, i1: int) -> Tensor:
        a, b = i0 // C, i1 // C  # query chunks a..b-1 against key chunks 0..b-1
        hidden = q.new_full((B, G, r, b - a, C, C), float("-inf"))
        blocks, carried = [], None  # carried [B, G, r, n, C, d]: the queries of the n chunks after m, carried back
        for m in range(b - 1, -1, -1):
            block = None
            if carried is not None:  # one batched matmul over (B, G): key chunk m's logits and, for m > 0, the
                both = carried.reshape(B, G, -1, d) @ (key_maps[m] if m > 0 else k_end[m])  # rows through its maps
                block = both[..., :C].unflatten(2, carried.shape[2:-1])
                if m > 0:
                    carried = both[..., C:].unflatten(2, carried.shape[2:-1])
            if m >= a:  # the group's chunks before m cannot see key chunk m; chunk m sees it causally
                block = torch.cat([hidden[:, :, :, :m - a], own[m].unsqueeze(3)] + ([] if block is None else [block]),
                                  dim=3)
            blocks.append(block)
            if m > 0 and m >= a:  # on to key chunk m - 1: chunk m's own queries join
                joined = q_own[m].unsqueeze(3)
                carried = joined if carried is None else torch.cat((joined, carried), dim=3)
        logits = torch.cat(blocks[::-1], dim=-1).flatten(3, 4)  # [B, G, r, rows, b C]
        if mask is not None:
            logits = logits.masked_fill(~mask[..., i0:i1, :b * C], float("-inf"))
        return logits.softmax(-1) @ v[..., :b * C, :]

    # Groups 4x the usual query chunk: every step of a group is a batched matmul over its rows, and fewer, larger
    # steps cost less than many small ones.
    rows = recompute.rows_for(B, H, N * C, N * C, 4 * recompute.SCORE_ELEMENTS, multiple=C)
    out = recompute.by_query_chunks(group, N * C, rows)
    return out[..., :T, :].reshape(B, H, T, d)
