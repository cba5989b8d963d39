"""PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations"), parameterised like the official layer (fla-org/flash-linear-attention, `fla/layers/path_attn.py`,
defaults: no forget gate, no q/k norm, short convolution on w).

Every token t carries a Householder-like map, per key/value head (x_t: the layer's normalised input):

  H_t = I - beta_t w_t w_t^T,   beta_t = 2 sigmoid(W_beta x_t + b_beta) in (0, 2)
  w_t = u_t / sqrt(|u_t|^2 + 1e-6),   u = SiLU(causal depthwise conv of W_w x, width conv_size)   (fla's l2_norm)

and the logit of query i for key j <= i accumulates the maps of the tokens after j up to and including i:

  a_ij = q_i^T (H_i H_{i-1} ... H_{j+1}) k_j / sqrt(d)     (a_ii = q_i . k_i / sqrt(d): the empty product)

i.e. the paper's k_j^T (prod_{s=j+1}^{i} H_s) q_i (each H_s is symmetric), and exactly what fla's decoding does:
each new token applies its H to every cached key, then appends its own key untransformed. Attention is
softmax_j(a_ij) v_j; no other PE is applied. W_w is low-rank (dim -> 32 -> kv_dim), fla's `use_low_rank_w=True`
default (earlier fla versions used a full-rank W_w for grouped-query attention: `w_rank: 0`); init follows fla
too: weights N(0, init_std), b_beta = 0.

The exact computation (`path_attention`, any device, any dtype, fp32 at least) runs chunk by chunk. For a chunk
of C tokens with Householder vectors W (C x d) and betas D = diag(beta), the products of the chunk's maps have the
UT/WY form: a vector x that has reached the chunk becomes x - sum_s c_s w_s after the maps H_{c0}, ..., H_s, with
c = A D W x, A = (I + strict_lower(D W W^T))^{-1}; sub-products over a contiguous range use the same entries of A
(diagonal blocks of a triangular inverse). So for query i in the chunk and every key j (earlier chunks: already
transformed up to the chunk start; this chunk: masked to t > j),

  a_ij = q_i . x_j - sum_{s <= i} sum_t (q_i . w_s) A_st beta_t (w_t . x_j),

(for earlier keys one matmul: (q_i - sum_t r_it w_t) . x_j with r_it = sum_{s <= i} (q_i . w_s) A_st beta_t),
and the keys then advance to the chunk's end by x_j <- x_j - sum_s (A D W x_j)_s w_s (for earlier keys one d x d
map, I - W^T (A D)^T W). Work is about that of attention with materialised logits plus one d x d map per chunk;
memory per chunk step is linear in the keys (plus the C x T logits; without padding the causal mask is built per
chunk too). The cached keys of past tokens are exactly these advanced keys: the KV cache's key buffer (fp32 at
least, in place; raw keys are never kept) holds them, and its `state["path_conv"]` the short convolution's last
inputs, so cached decoding gives the logits of recomputation. Tested against a naive fp64 loop over all (i, j).
Training (gradients, no past) computes the same logits carrying each query backwards through the chunks' maps
instead (`path_ops.path_attention_by_queries`: chunks merged up to eight at a time, then one merged chunk of
queries after another, whose logits the hand-written backward recomputes), so memory stays linear in T instead of
keeping every chunk's logits and keys. (The plan names: path-recompute for training, path-chunked otherwise, fla
for fla's kernel.)

An attention temperature T divides every logit (q_i is divided by T first, which is exact: a_ij is linear in
q_i). A sliding window is not offered: the keys' maps accumulate through every later token whether or not a query
sees them, so a window would save nothing; the model refuses one on a PaTH layer.

Padding (`attention_mask`): a padded token gets beta = 0 and u = 0 (H = I, and later tokens' short convolution
sees zeros there, as before a sequence's first token), and attention hides its key, so with left padding (or right
padding, for scoring) every real token computes exactly what its row computes alone.

On CUDA, `kernel: auto` uses fla's fused `parallel_path_attention` when flash-linear-attention is installed (an
optional extra, imported behind a guard) and applicable (fp16/bf16, head_dim 16/32/64/128 (128 since fla PR #503,
July 2025), no cached past, plain causal mask); never required. That path has not been run here (no GPU): the exact
path is the tested one.

pe_args:
  w_rank       rank of W_w (32; 0 = a full-rank dim x kv_dim map)
  short_conv   true (default, fla's default) | false: w comes straight from W_w x
  conv_size    width of the short convolution (3)
  chunk_size   tokens per chunk of the exact path (64)
  kernel       auto (default) | torch (always the exact chunked path)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    forced_path,
    optional_kernel,
    probing_active,
)
from tapecli.model.pe.path_ops import path_attention, path_attention_by_queries

KERNELS = ("auto", "torch")
FLA_HEAD_DIMS = (16, 32, 64, 128)  # 128 since fla PR #503 (fla-org/flash-linear-attention, July 2025)


def fla_path_attention():
    """fla's fused kernel, or None when flash-linear-attention is not installed (or broken)."""
    return optional_kernel("fla.ops.path_attn.parallel", "parallel_path_attention")


class PaTHLayer(LayerPE):
    """Parameters (as in fla): w_proj (W_w, two linears when low-rank), w_conv1d (depthwise, no bias), bt_proj."""

    def __init__(self, dim: int, n_kv_heads: int, head_dim: int, w_rank: int, short_conv: bool, conv_size: int,
                 chunk_size: int, kernel: str, init_std: float) -> None:
        super().__init__()
        kv_dim = n_kv_heads * head_dim
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim
        self.chunk_size, self.kernel, self.init_std = chunk_size, kernel, init_std
        if w_rank:
            self.w_proj = nn.Sequential(nn.Linear(dim, w_rank, bias=False), nn.Linear(w_rank, kv_dim, bias=False))
        else:
            self.w_proj = nn.Linear(dim, kv_dim, bias=False)
        self.w_conv1d = nn.Conv1d(kv_dim, kv_dim, conv_size, groups=kv_dim, bias=False) if short_conv else None
        self.bt_proj = nn.Linear(dim, n_kv_heads, bias=True)

    def init_weights(self) -> None:
        if self.w_conv1d is not None:
            nn.init.normal_(self.w_conv1d.weight, mean=0.0, std=self.init_std)
        nn.init.zeros_(self.bt_proj.bias)

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        """No rotation; keys go to fp32 at least, so the cached keys, which every later token transforms, keep the
        precision the uncached computation has (under bf16 autocast too)."""
        return q, k.to(torch.promote_types(k.dtype, torch.float32))

    def householder(self, x: Tensor, real: Tensor | None, cache: LayerCache | None) -> tuple[Tensor, Tensor]:
        """u [B, G, T, d] (w before its normalisation) and beta [B, G, T] of the current tokens; padding (real
        False) gets u = 0 and beta = 0, H = I, and its zero u is what the short convolution of later tokens sees,
        as they see zeros before a sequence's first token."""
        B, T, _ = x.shape
        u = self.w_proj(x)  # [B, T, kv_dim]
        beta = 2 * torch.sigmoid(self.bt_proj(x))  # [B, T, G]
        if real is not None:
            u, beta = u * real[..., None], beta * real[..., None]
        if self.w_conv1d is not None:
            width = self.w_conv1d.kernel_size[0]
            earlier = None if cache is None else cache.state.get("path_conv")
            if earlier is None:
                earlier = u.new_zeros(B, width - 1, u.shape[-1])
            u = torch.cat((earlier.to(u.dtype), u), dim=1)
            if cache is not None:
                cache.state["path_conv"] = u[:, u.shape[1] - (width - 1):]
            u = F.silu(F.conv1d(u.transpose(1, 2), self.w_conv1d.weight.to(u.dtype), groups=u.shape[-1]))
            u = u.transpose(1, 2)
        return u.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2), beta.transpose(1, 2)

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=self.attend, plan=self.plan, reports_weights=True)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool,
             padded: bool = False) -> str:
        """fla: fla's fused kernel (CUDA, half precision, no past, no padding); path-recompute: training without a
        past, query chunks recomputed in the backward (path_ops.path_attention_by_queries);
        path-chunked: chunk by chunk carrying the transformed keys (a KV cache, no gradients, or the reference under
        attention.forced("dense"), and while attention is probed: it reports its weights, chunk by chunk)."""
        if forced_path() == "dense" or probing_active():
            return "path-chunked"
        if (device_type == "cuda" and self.kernel == "auto" and dtype in (torch.float16, torch.bfloat16)
                and not cached and not padded and self.head_dim in FLA_HEAD_DIMS and fla_path_attention() is not None):
            return "fla"
        return "path-recompute" if grad and not cached else "path-chunked"

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None, temperature: float = 1.0) -> Tensor:
        """With a cache, k is its buffer (earlier keys already transformed, then the current raw keys): it is
        overwritten in place with every key transformed up to the last token, so only transformed keys are kept."""
        T = q.shape[2]
        if temperature != 1.0:
            q = q / temperature
        u, beta = self.householder(x, None if key_mask is None else key_mask[:, -T:], cache)
        path = self.plan(q.device.type, q.dtype, T, k.shape[2], torch.is_grad_enabled(), k.shape[2] > T,
                         mask is not None)
        if path == "fla":
            w = u * torch.rsqrt(u.float().pow(2).sum(-1, keepdim=True) + 1e-6).to(u.dtype)
            out, keys = fla_path_attention()(q=q.transpose(1, 2), k=k.to(q.dtype).transpose(1, 2),
                                             v=v.transpose(1, 2), w=w.transpose(1, 2),
                                             beta=beta.transpose(1, 2).to(q.dtype), use_cache=cache is not None)
            if cache is not None:
                k.copy_(keys.transpose(1, 2))
            return out.transpose(1, 2)
        compute = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            u = u.to(compute)
            w = u * torch.rsqrt(u.pow(2).sum(-1, keepdim=True) + 1e-6)
            # No bias, so `mask` is None (plain causal) or boolean, padded keys hidden.
            q, k_in, v_in, beta = q.to(compute), k.to(compute), v.to(compute), beta.to(compute)
            if path == "path-recompute":
                return path_attention_by_queries(q, k_in, v_in, w, beta, mask, self.chunk_size).to(v.dtype)
            out, keys = path_attention(q, k_in, v_in, w, beta, mask, self.chunk_size, keep_keys=cache is not None)
        if cache is not None:
            k.copy_(keys)
        return out.to(v.dtype)


class PaTH(PositionalEncoding):
    claims = ("shift-invariance",)  # no position enters, only the order of the maps
    attention_options = frozenset({"temperature"})

    def __init__(self, config, *, w_rank: int = 32, short_conv: bool = True, conv_size: int = 3,
                 chunk_size: int = 64, kernel: str = "auto") -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'path' accumulates maps along the causal prefix; it needs causal "
                             "attention")
        if kernel not in KERNELS:
            raise ValueError(f"model.pe_args.kernel: unknown value {kernel!r}; allowed: {', '.join(KERNELS)}")
        for key, value, least in (("w_rank", w_rank, 0), ("conv_size", conv_size, 1), ("chunk_size", chunk_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"model.pe_args.{key}: expected an integer >= {least}, got {value!r}")
        self.layer_args = dict(dim=config.dim, n_kv_heads=config.n_kv_heads, head_dim=config.head_dim, w_rank=w_rank,
                               short_conv=short_conv, conv_size=conv_size, chunk_size=chunk_size, kernel=kernel,
                               init_std=config.init_std)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return PaTHLayer(**self.layer_args)
