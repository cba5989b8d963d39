"""MapWM, MapFormer's working-memory variant (Rambaud, Mascarenhas and Lakretz 2025, "MapFormer: Self-Supervised
Learning of Cognitive Maps with Input-Dependent Positional Embeddings", arXiv 2511.19279): RoPE whose angles are a
running sum of content-dependent increments, so a token's "position" is where the path of earlier tokens led.

For each key head g and rotary pair i (d/2 pairs, half-split like our RoPE) and x_t the layer's normalised input:

  increments   delta_t = W_out (W_in x_t + b_in) + b_out       W_in: dim -> rank per head, W_out: rank -> d/2 (shared
                                                                by heads), as the author's ThetaEmbedder
  angles       theta_t = sum_{s <= t} delta_s * w_i,            w_i = exp(l_i), learned per head and pair
  attention    q_t, k_t rotated by theta_t (RoPE's map, pair by pair); logits q_t^T R(theta_t - theta_s) k_s / sqrt(d)

Reference: the paper and the author's code (victoRambaud/nanoGPT, `models/rotation_module.py`: `ThetaEmbedder`,
`RotationModule.forward` with `n_approx_steps = -1`, the cos/sin form), with its language-model settings
(`config/train_gpt2_wm.py`): rank 32, frequencies initialised to base^(-(i+1)/(d/2)) with base = the block size,
biases zero and weights N(0, 0.02) as its GPT init (so a fresh MapWM barely rotates: the increments are learned).
Where we differ from that code:
- pairs are (i, i + d/2) as in our RoPE, not adjacent dims (the same model up to a fixed permutation of q/k dims);
- with grouped-query attention the angles are per key head and the query heads of a group share them (the code is
  multi-head only);
- the angles are computed in fp32 at least, under bf16 autocast too (a running sum over thousands of tokens);
- padding (`attention_mask`) contributes no increment, so left padding never advances the sum and each row
  computes what it computes alone.

Cached decoding carries the running sum: the layer cache's `state["mapwm_angle"]` holds theta of the last cached
token, [B, G, d/2], and the key buffer holds the rotated keys. Attention itself is the plain attention of the
rotated queries and keys (`tapecli.model.attention.attend` with no need: SDPA's fused kernels, the chunked CPU path
with padding, FlexAttention or flash-attn on CUDA), so memory is linear in T; the plan names are `mapwm` (the
rotation) followed by that path's.

pe_args:
  rank        width of the increments' bottleneck per head (32)
  freq_base   base of the initial frequencies (default: model.max_seq_len, the code's block size)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    apply_rotary,
    check_positive_int,
    encoded_attention,
)


class MapWMLayer(LayerPE):
    """Parameters: theta_in (W_in, b_in), theta_out (W_out, b_out), log_freq [n_kv_heads, d/2]."""

    def __init__(self, dim: int, n_kv_heads: int, head_dim: int, rank: int, freq_base: float) -> None:
        super().__init__()
        self.n_kv_heads, self.rank, self.half, self.freq_base = n_kv_heads, rank, head_dim // 2, freq_base
        self.theta_in = nn.Linear(dim, rank * n_kv_heads, bias=True)
        self.theta_out = nn.Linear(rank, self.half, bias=True)
        self.log_freq = nn.Parameter(torch.empty(n_kv_heads, self.half))
        self.init_weights()

    def init_weights(self) -> None:
        nn.init.zeros_(self.theta_in.bias)
        nn.init.zeros_(self.theta_out.bias)
        exponents = -(torch.arange(1, self.half + 1, dtype=torch.float64) / self.half)
        with torch.no_grad():
            self.log_freq.copy_((exponents * math.log(self.freq_base)).expand(self.n_kv_heads, -1))

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        # Its attention is tape's own (`encoded_attention`), which reports the weights while they are probed.
        return OwnAttention(attend=self.attend, plan=self.plan, reports_weights=True)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool) -> str:
        """mapwm: the angles and the rotation; the attention path after it is recorded on its own."""
        return "mapwm"

    def angles(self, x: Tensor, real: Tensor | None, past: Tensor | None) -> tuple[Tensor, Tensor]:
        """(theta_t, theta_t * w), each [B, G, T, d/2], of the current tokens (fp32 at least): theta_t is the sum of
        the increments since the first token (`past`: the sum up to the last cached token, [B, G, d/2]); padding
        (real False) adds nothing."""
        B, T, _ = x.shape
        compute = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            x = x.to(compute)
            hidden = nn.functional.linear(x, self.theta_in.weight.to(compute), self.theta_in.bias.to(compute))
            delta = nn.functional.linear(hidden.view(B, T, self.n_kv_heads, self.rank),
                                         self.theta_out.weight.to(compute), self.theta_out.bias.to(compute))
            if real is not None:
                delta = delta * real[:, :, None, None].to(compute)
            theta = delta.transpose(1, 2).cumsum(dim=2)  # [B, G, T, d/2]
            if past is not None:
                theta = theta + past.to(compute)[:, :, None]
            return theta, theta * self.log_freq.to(compute).exp()[None, :, None]

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache, temperature: float = 1.0, window: int | None = None) -> Tensor:
        """With a cache, k is its buffer (the earlier keys already rotated, then the current raw keys): the current
        keys are rotated in place, so the buffer only ever holds rotated keys."""
        T, Tk = q.shape[2], k.shape[2]
        past = None if cache is None else cache.state.get("mapwm_angle")
        theta, angles = self.angles(x, None if key_mask is None else key_mask[:, -T:], past)
        if cache is not None:
            cache.state["mapwm_angle"] = theta[:, :, -1]
        rotary = torch.cat((angles.cos(), angles.sin()), dim=-1)  # [B, G, T, d]
        rotated = apply_rotary(k[:, :, Tk - T:], rotary.to(k.dtype))
        if cache is not None:
            k[:, :, Tk - T:].copy_(rotated)
        else:
            k = rotated
        # Each group's query heads against its key head's rotation, broadcast (no copy of the rotation per head).
        G = k.shape[1]
        q = apply_rotary(q.unflatten(1, (G, q.shape[1] // G)), rotary.to(q.dtype).unsqueeze(2)).flatten(1, 2)
        positions = torch.arange(Tk, device=q.device)[None]  # index positions: the attention has no bias
        return encoded_attention(q, k, v, x=x, q_pos=positions[:, Tk - T:], k_pos=positions, key_mask=key_mask,
                                 window=window, temperature=temperature)


class MapWM(PositionalEncoding):
    claims = ("shift-invariance",)  # positions enter as differences only, or not at all
    attention_options = frozenset({"temperature", "window"})  # its own attention takes no sinks

    def __init__(self, config, *, rank: int = 32, freq_base: float | None = None) -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'mapwm' sums increments along the causal prefix; it needs causal "
                             "attention")
        check_positive_int("rank", rank)
        self.freq_base = float(config.max_seq_len if freq_base is None else freq_base)
        if not self.freq_base > 1:
            raise ValueError(f"model.pe_args.freq_base: must be > 1, got {freq_base}")
        self.rank = rank

    def make_layer(self, layer_idx: int) -> LayerPE:
        c = self.config
        return MapWMLayer(c.dim, c.n_kv_heads, c.head_dim, self.rank, self.freq_base)
