"""Attention over whole [Tq, Tk] score matrices: SDPA's fused kernels when there is no mask, flash-attn on GPUs,
a materialised mask otherwise (the reference path, decoding steps, non-causal analysis models).

    mask, is_causal = dense_mask(bias, key_mask, q_len, k_len, dtype, device, causal, window, q_pos, k_pos)
    out = sdpa(q, k, v, mask, is_causal, scale)   # softmax(q k^T * scale + mask) v, scale 1/sqrt(d) by default

Without bias, padding, window and cache the mask stays implicit (`is_causal`) and SDPA's fused kernels keep memory
linear in T; anything else costs a [B|1, H|1, Tq, Tk] mask, which is why the dispatcher (`tapecli.model.attention`)
sends long sequences with a bias, padding or a window to the chunked or FlexAttention paths instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # optional GPU kernel; a broken build can raise more than ImportError
    from flash_attn import flash_attn_func
except Exception:  # noqa: BLE001
    flash_attn_func = None


def flash_attn_applies(device_type: str, dtype: torch.dtype) -> bool:
    """flash-attn is installed and takes this device and dtype (CUDA, fp16 / bf16)."""
    return flash_attn_func is not None and device_type == "cuda" and dtype in (torch.float16, torch.bfloat16)


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v over [B, H, T, d] tensors (scale: 1/sqrt(d_qk) by default); flash-attn on
    GPU when it is installed and usable. Values may be wider than queries and keys (TAPE's [V | E]): fused kernels
    want equal widths, so for more than one query q and k are zero-padded (q.k unchanged, memory stays linear); a
    single query (a decoding step) computes its [1 x L] weights directly, reading the cached keys once instead of
    copying them padded."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if v.shape[-1] != q.shape[-1] and q.shape[2] == 1:
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        scores = (q * scale) @ k.transpose(-1, -2)  # [B, H, 1, L]: cheap, and the keys are read once
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        return scores.softmax(-1).to(v.dtype) @ v
    if v.shape[-1] != q.shape[-1]:
        pad = (0, v.shape[-1] - q.shape[-1])
        q, k = F.pad(q, pad), F.pad(k, pad)
    if flash_attn_applies(q.device.type, q.dtype) and mask is None and v.shape[-1] == q.shape[-1]:
        # flash-attn aligns the causal mask bottom-right, which is what a KV cache needs.
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=is_causal,
                              softmax_scale=scale)
        return out.transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def dense_mask(bias: Tensor | None, key_mask: Tensor | None, q_len: int, k_len: int, dtype: torch.dtype,
               device: torch.device, causal: bool = True, window: int | None = None, q_pos: Tensor | None = None,
               k_pos: Tensor | None = None) -> tuple[Tensor | None, bool]:
    """The causal mask (queries are the last q_len of k_len tokens), minus padded keys (`key_mask` [B, k_len],
    False for padding; a padded query still sees itself, so its row stays finite), minus keys outside a `window`
    (q_pos - k_pos >= window, positions [B|1, q_len] and [B|1, k_len]), plus an optional logit bias.

    Returns (mask, is_causal): without bias, padding, window and cache the mask stays implicit so SDPA picks its
    fused kernels; otherwise it is [B or 1, 1 or H, q_len, k_len] (bool without bias, else float with -inf).
    """
    past = k_len - q_len
    if bias is None and key_mask is None and window is None and causal:
        if q_len == 1:
            return None, False  # one new token may see everything before it
        if past == 0:
            return None, True
    if bias is None and key_mask is None and window is None and not causal:
        return None, False  # everything sees everything
    allowed = visible(torch.arange(past, k_len, device=device), torch.arange(k_len, device=device), key_mask, causal,
                      window, q_pos, k_pos)
    if bias is None:
        return allowed, False
    return bias.to(dtype).masked_fill(~allowed, float("-inf")), False


def visible(rows: Tensor, keys: Tensor, key_mask: Tensor | None, causal: bool = True, window: int | None = None,
            q_pos: Tensor | None = None, k_pos: Tensor | None = None) -> Tensor:
    """Which keys each query sees: query r (its own key index rows[r]) sees key keys[c] when keys[c] <= rows[r]
    (causal) and the key is not padding (`key_mask` [B, >= max(keys) + 1], False for padding), except itself, so a
    padded query's row stays finite; with a `window` W, only keys less than W positions back (q_pos[r] - k_pos[c] <
    W, positions [B|1, R] and [B|1, K]): the query itself and the W - 1 keys before it when positions are
    consecutive. [1, 1, R, K] bool, or [B, 1, R, K] with a key mask or per-row positions."""
    allowed = keys <= rows[:, None] if causal else torch.ones(len(rows), len(keys), dtype=torch.bool,
                                                                   device=keys.device)
    allowed = allowed[None]  # [1, R, K]
    if window is not None:
        allowed = allowed & (q_pos[..., :, None] - k_pos[..., None, :] < window)
    if key_mask is not None:
        allowed = allowed & (key_mask[:, None, keys] | (keys == rows[:, None]))  # [B, R, K]
    return allowed.unsqueeze(-3)
