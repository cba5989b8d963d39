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
to the chunk's end, and M_b = I - W_b^T (A D)_b^T W_b the d x d map of chunk b (keys <- keys M_b). For training,
`training_pieces` first merges S consecutive chunks into one (`merge_chunks`: each merged chunk's keys carried to
its end, its map the product of its chunks', its own logits; linear in T), so the walk over earlier chunks pays
one d x d map per S C keys instead of per C; the chunks' own pieces are recomputed in the backward (a
checkpoint), the merge's intermediates kept (linear in T). Then `path_groups.QueryGroups` runs
the walk one merged chunk of queries at a time, with its backward written out (on the CPU the blocks against
earlier chunks go through torch's fused flash kernel), so training keeps O(T (d + S C)) per head. Both arrangements
are tested against a naive fp64 loop over all (i, j).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from tapecli.model.pe.base import probing_active, report_weights, rows_for
from tapecli.model.pe.path_groups import QueryGroups, fused_available

MERGE = 8  # chunks per merged chunk of the training arrangement (`merge_chunks`)


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
    and, when keep_keys, all n + T keys transformed up to the last token (what the next call's `keys` starts with).
    While attention is probed, each chunk's weights are reported (`tapecli.model.attention.probe`)."""
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
        weights = logits.masked_fill(~seen, float("-inf")).softmax(-1)  # [B, G, r, C, m + C]
        if probing_active():
            report_weights(weights.view(B, H, C, m + C), m)
        outputs.append(weights @ v[..., :m + C, :])
        if c1 < T or keep_keys:
            # Advance every key through the chunk's maps, x_j <- x_j - sum_s (A D W x_j)_s w_s: for the earlier
            # keys one d x d map, I - W^T (A D)^T W.
            keys = torch.cat((keys - keys @ (wc.transpose(-1, -2) @ (AD.transpose(-1, -2) @ wc)),
                              kc - (AD @ wk).transpose(-1, -2) @ wc), dim=2)
    return torch.cat(outputs, dim=-2).reshape(B, H, T, d), keys if keep_keys else None


def merge_chunks(q_own: Tensor, own: Tensor, keys: Tensor, maps: Tensor,
                 S: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`QueryGroups`'s inputs for chunks of S C tokens from those for chunks of C (N a multiple of S), every merged
    chunk at once: its keys carried to its end and its map (the product of its chunks' maps), and, walking its
    chunks back as `QueryGroups` walks key chunks, its queries carried to its start (q_own) and its own logits."""
    B, G, r, N, C, d = q_own.shape
    n = N // S
    # Unbound once: the gradient of each chunk's piece lands in its own tensor (slicing would allocate a full-size
    # gradient per slice).
    q_own, own = q_own.unflatten(3, (n, S)).unbind(4), own.unflatten(3, (n, S)).unbind(4)  # [B, G, r, n, C, .]
    keys, maps = keys.unflatten(2, (n, S)).unbind(3), maps.unflatten(2, (n, S)).unbind(3)  # [B, G, n, d, .]
    merged_keys, merged_map = keys[0], maps[0]
    for j in range(1, S):  # keys <- keys M_j, and the map M_0 ... M_j (transposed: maps of row vectors)
        merged_keys = torch.cat((maps[j] @ merged_keys, keys[j]), dim=-1)
        merged_map = maps[j] @ merged_map
    columns: list[Tensor] = []  # columns[j]: every chunk's logits against chunk j, [B, G, r, n, S C, C]
    x = None  # the queries of chunks j+1..S-1 carried to the end of chunk j, [B, G, r, n, rows, d]
    for j in range(S - 1, -1, -1):
        column = [own[j].new_full((B, G, r, n, j * C, C), float("-inf")), own[j]]
        if x is not None:  # one map for the r query heads of a key head
            column.append(x @ keys[j].unsqueeze(2))
            x = x @ maps[j].unsqueeze(2)
        columns.insert(0, torch.cat(column, dim=-2))
        x = q_own[j] if x is None else torch.cat((q_own[j], x), dim=-2)
    return x, torch.cat(columns, dim=-1), merged_keys, merged_map


def training_pieces(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, C: int,
                    S: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`QueryGroups`'s inputs (q_own, own, keys, maps) for chunks of S C tokens, from q [B, H, N C, d] and k, w
    [B, G, N C, d], beta [B, G, N C] (N a multiple of S). The chunks' own pieces are recomputed in the backward
    (their factors' intermediates, a dozen tensors of T x C per head, are not kept: a checkpoint); the merge, whose
    forward costs more, is kept."""
    pieces = checkpoint(chunk_pieces, q, k, w, beta, C, use_reentrant=False, preserve_rng_state=False)
    return pieces if S == 1 else merge_chunks(*pieces, S)


def chunk_pieces(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, C: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`QueryGroups`'s inputs for the unmerged chunks of C tokens (`training_pieces`)."""
    B, H, T, d = q.shape
    G, N = k.shape[1], T // C
    # Every logit is linear in its query: scale the queries once instead of every logit (forward and backward).
    q = (q * d ** -0.5).view(B, G, H // G, N, C, d)  # the heads of a group share its keys and maps
    k, w, beta = k.view(B, G, N, C, d), w.view(B, G, N, C, d), beta.view(B, G, N, C)
    AD, corr, wk = chunk_factors(q, k, w, beta)
    q_own = q - corr @ w.unsqueeze(2)  # each query after its own chunk's maps up to itself
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    own = (q @ k.unsqueeze(2).transpose(-1, -2) - corr @ wk.unsqueeze(2)).masked_fill(~causal, float("-inf"))
    k_end = k - (AD @ wk).transpose(-1, -2) @ w  # each key after its own chunk's maps, to the chunk's end
    maps_t = torch.eye(d, dtype=q.dtype, device=q.device) - (AD.transpose(-1, -2) @ w).transpose(-1, -2) @ w
    return q_own, own, k_end.transpose(-1, -2), maps_t


def path_attention_by_queries(q: Tensor, k: Tensor, v: Tensor, w: Tensor, beta: Tensor, mask: Tensor | None,
                              chunk_size: int) -> Tensor:
    """`path_attention` of T tokens with no earlier ones (same arguments; k, v [B, G, T, d]), by merged chunks of
    queries carried back (module docstring): memory O(T (d + S C)) per head plus one merged chunk's [S C, T]
    logits (on the CPU its blocks' outputs only). T is padded to whole merged chunks."""
    B, H, T, d = q.shape
    G, C = k.shape[1], chunk_size
    N = -(-T // C)
    fused = fused_available(q.device)
    if fused and mask is None:  # only a merged chunk's own block [S C, S C] is materialised: up to MERGE
        S = max(1, min(MERGE, N))
    else:  # up to MERGE, as many as keep one merged chunk's logits (or mask) [B, H, S C, T] in budget
        S = max(1, min(MERGE, N, rows_for(B, H, N * C, N * C, budget=4) // C))
    N = -(-N // S) * S
    if N * C != T:  # pad to whole chunks: H = I there (w = 0, beta = 0), and real queries never see those keys
        pad = N * C - T
        q, k, v, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, w))
        beta = F.pad(beta, (0, pad))
        if mask is not None:
            mask = torch.cat((F.pad(mask, (0, pad), value=False),
                              mask.new_ones(*mask.shape[:2], pad, N * C)), dim=-2)
    if mask is not None:
        mask = mask.unsqueeze(2) if mask.shape[1] == 1 else mask.unflatten(1, (G, H // G))
    pieces = training_pieces(q, k, w, beta, C, S)
    out = QueryGroups.apply(*pieces, v, mask, C, fused)
    return out[..., :T, :].reshape(B, H, T, d)
