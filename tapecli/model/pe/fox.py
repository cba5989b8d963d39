"""FoX, the Forgetting Transformer (Lin et al., ICLR 2025, "Forgetting Transformer: Softmax Attention with a
Forget Gate", arXiv 2503.02130; official code zhixuan-lin/forgetting-transformer, `ForgettingAttentionLayer`).

Every head h gets a data-dependent forget gate per token (x_t: the layer's normalised input),

  f_t = sigmoid(w_f^T x_t + b_f),      D_ij = sum_{l = j+1}^{i} log f_l = c_i - c_j,   c_t = sum_{l <= t} log f_l

and attention is softmax_j(q_i . k_j / sqrt(d) + D_ij) v_j over j <= i: a key fades by the gates of every token
after it up to the query (D_ii = 0). No position encoding is needed (`rope: false`, the paper's FoX); with
`rope: true` queries and keys are also rotated (RoPE, base `theta`), the paper's "FoX with RoPE". Parameters as in
the official layer: `fgate_proj` (dim -> heads, with bias; weight N(0, init_std), bias 0). The attention itself
(all paths exact; SDPA's fused kernel on the CPU, FlexAttention or fla's kernel on CUDA):
`tapecli.model.pe.fox_ops`.

The "FoX (Pro)" block's parts, each a switch (the official Pro configuration turns all five on):
  output_gate   o <- o * sigmoid(W_o x) before o_proj (`ogate_proj`, dim -> dim, no bias)
  output_norm   o <- RMSNorm of each head's output, weight per head and dimension (then the gate)
  qk_norm       q, k <- RMSNorm per head (eps 1e-5, weights per head and dimension), before RoPE
  k_shift       k_t <- a_t k_{t-1} + (1 - a_t) k_t, a_t = sigmoid(W_a x_t) per key head (`k_shift_proj`, no bias):
                the official data-dependent token shift; v_shift does the same for values
Order, as in the official layer: projections, shifts, QK-norm, RoPE, attention, output norm and gate.

Where we differ from the official code, and why:
- Grouped-query attention is supported (the official layer asserts it away): gates stay per query head (fla's
  `parallel_forgetting_attn` takes them so too); shifts are per key head.
- Padding: a padded token's gate is 1 (log f = 0) and its shifted key / value input is zero (as before a
  sequence's first token), so any padding layout gives each row what it computes alone (the official code
  handles left padding only, through its kernel's `seq_start`).
- c is summed in float64 (one rounding to the attention's dtype; the official kernel sums in fp32).
- The official "pruning" of fully decayed key blocks (log_pruning_tolerance) is a speed-up of its Triton kernel
  and is not implemented; the result is the same up to the tolerance.

KV cache: the key and value buffers hold the final (shifted, normalised, rotated) keys and values, written over
the raw ones in place; `state` holds c of the last token (`fox_decay`) and the last raw key / value projections
for the shifts; the per-token c of past tokens is one more cache buffer (`fox_decay`, float64). Cached decoding
and chunked prefill give the logits of the full forward.

pe_args:
  rope          false (default) | true
  theta         RoPE's base (500000, the official `rope_base`)
  output_gate, output_norm, qk_norm, k_shift, v_shift    false (default) | true
  kernel        auto (default: fla's kernel on CUDA when installed) | torch (never fla)
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tapecli.model.pe.base import (
    LayerCache,
    LayerPE,
    OwnAttention,
    PositionalEncoding,
    PositionState,
    apply_rotary,
    check_range,
    forced_path,
    kernels_available,
    probing_active,
)
from tapecli.model.pe.fox_ops import fla_forgetting_attention, forgetting_attention
from tapecli.model.pe.rope import RoPE

KERNELS = ("auto", "torch")
FLA_HEAD_DIMS = (16, 32, 64, 128)
QK_NORM_EPS = 1e-5  # the official GroupNorm's default


def head_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dimension of x [B, H, T, d] with weight [H, d], in fp32 at least, back to x's dtype."""
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight[:, None, :].to(h.dtype)).to(x.dtype)


class FoXLayer(LayerPE):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, head_dim: int, norm_eps: float, rope: bool,
                 output_gate: bool, output_norm: bool, qk_norm: bool, k_shift: bool, v_shift: bool,
                 kernel: str) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.norm_eps, self.rope, self.kernel = n_heads, head_dim, norm_eps, rope, kernel
        self.fgate_proj = nn.Linear(dim, n_heads, bias=True)
        self.ogate_proj = nn.Linear(dim, n_heads * head_dim, bias=False) if output_gate else None
        self.output_norm = nn.Parameter(torch.ones(n_heads, head_dim)) if output_norm else None
        self.q_norm = nn.Parameter(torch.ones(n_heads, head_dim)) if qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(n_kv_heads, head_dim)) if qk_norm else None
        self.k_shift_proj = nn.Linear(dim, n_kv_heads, bias=False) if k_shift else None
        self.v_shift_proj = nn.Linear(dim, n_kv_heads, bias=False) if v_shift else None

    def init_weights(self) -> None:
        nn.init.zeros_(self.fgate_proj.bias)  # the official init; the weights got N(0, init_std) like every linear
        for norm in (self.output_norm, self.q_norm, self.k_norm):
            if norm is not None:
                nn.init.ones_(norm)

    def need(self, state: PositionState, average_state: bool) -> OwnAttention:
        return OwnAttention(attend=functools.partial(self.attend, rotary=state.rotary), plan=self.plan,
                            reports_weights=True)

    def plan(self, device_type: str, dtype: torch.dtype, q_len: int, k_len: int, grad: bool, cached: bool,
             padded: bool = False) -> str:
        """The path of `fox_ops.forgetting_attention`: fox-dense (one query, or attention.forced("dense")), fla (CUDA,
        fp16/bf16, no past, no padding, fla installed), fox-flex (CUDA), fox-flash (the CPU's flash kernels on
        widened heads); fox-probe while attention is probed (`tape analyze attention`: the widened heads' weights,
        which are FoX's, formed and reported a chunk of queries at a time)."""
        if probing_active():
            return "fox-probe"
        if forced_path() == "dense" or q_len == 1:
            return "fox-dense"
        if device_type == "cuda":
            if (self.kernel == "auto" and dtype in (torch.float16, torch.bfloat16) and not cached and not padded
                    and self.head_dim in FLA_HEAD_DIMS and fla_forgetting_attention() is not None):
                return "fla"
            return "fox-flex" if kernels_available()["flex"] else "fox-dense"
        return "fox-flash" if not (cached or padded) or kernels_available()["chunked"] else "fox-dense"

    def shift(self, proj: nn.Linear, x: Tensor, raw: Tensor, real: Tensor | None, cache: LayerCache | None,
              name: str) -> Tensor:
        """a_t raw_{t-1} + (1 - a_t) raw_t for the current tokens' projections raw [B, G, T, d], a = sigmoid(proj x);
        the previous token's projection comes from the cache (zero at a sequence's start and for padding)."""
        if real is not None:
            raw = raw * real[:, None, :, None].to(raw.dtype)
        earlier = None if cache is None else cache.state.get(name)
        if earlier is None:
            earlier = raw.new_zeros(*raw.shape[:2], 1, raw.shape[-1])
        if cache is not None:
            cache.state[name] = raw[:, :, -1:].clone()  # raw may be the cache's buffer, overwritten below
        previous = torch.cat((earlier.to(raw.dtype), raw[:, :, :-1]), dim=2)
        compute = torch.promote_types(raw.dtype, torch.float32)
        alpha = torch.sigmoid(proj(x).to(compute)).transpose(1, 2)[..., None]  # [B, G, T, 1]
        return (alpha * previous.to(compute) + (1 - alpha) * raw.to(compute)).to(raw.dtype)

    def decay(self, x: Tensor, real: Tensor | None, cache: LayerCache | None) -> tuple[Tensor, Tensor]:
        """The log gates of the current tokens [B, H, T] (fp32 at least) and c of every cached and current token
        [B, H, Tk] (float64), continuing the cached sum."""
        log_gates = F.logsigmoid(self.fgate_proj(x).to(torch.promote_types(x.dtype, torch.float32))).transpose(1, 2)
        if real is not None:
            log_gates = log_gates * real[:, None, :]  # a padded token forgets nothing
        decay = log_gates.to(torch.float64).cumsum(-1)
        if cache is not None:
            last = cache.state.get("fox_decay")
            if last is not None:
                decay = decay + last
            cache.state["fox_decay"] = decay[..., -1:]
            (decay,) = cache.append(fox_decay=decay[..., None])
            decay = decay[..., 0]
        return log_gates, decay

    def attend(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
               key_mask: Tensor | None, cache: LayerCache | None, rotary: Tensor | None = None) -> Tensor:
        """Queries q [B, H, Tq, d] and keys / values k, v [B, G, Tk, d] as projected (with a cache: its buffers, the
        current tokens' raw projections last, overwritten here with their final form); `key_mask` hides padding
        (`mask`, its dense form, is not used)."""
        T = q.shape[2]
        past = k.shape[2] - T
        real = None if key_mask is None else key_mask[:, past:]
        k_now, v_now = k[:, :, past:], v[:, :, past:]
        if self.k_shift_proj is not None:
            k_now = self.shift(self.k_shift_proj, x, k_now, real, cache, "fox_k_shift")
        if self.v_shift_proj is not None:
            v_now = self.shift(self.v_shift_proj, x, v_now, real, cache, "fox_v_shift")
        if self.q_norm is not None:
            q, k_now = head_rms_norm(q, self.q_norm, QK_NORM_EPS), head_rms_norm(k_now, self.k_norm, QK_NORM_EPS)
        if self.rope:
            q, k_now = apply_rotary(q, rotary.to(q.dtype)), apply_rotary(k_now, rotary.to(k_now.dtype))
        if cache is not None:  # the buffers keep the final keys and values
            k[:, :, past:], v[:, :, past:] = k_now, v_now
            k_now, v_now = k, v
        log_gates, decay = self.decay(x, real, cache)
        path = self.plan(q.device.type, q.dtype, T, k.shape[2], torch.is_grad_enabled(), past > 0,
                         key_mask is not None)
        scale = self.head_dim ** -0.5
        if path in ("fla", "fox-flex"):
            out = forgetting_attention(path, q, k_now, v_now, decay, log_gates, key_mask, scale)
        else:  # the CPU kernels in fp32 at least, even under bf16 autocast (c must not be rounded to bf16)
            compute = torch.promote_types(q.dtype, torch.float32)
            with torch.autocast(q.device.type, enabled=False):
                out = forgetting_attention(path, q.to(compute), k_now.to(compute), v_now.to(compute), decay,
                                           log_gates, key_mask, scale)
        return self.finish(out, x).to(v.dtype)

    def finish(self, out: Tensor, x: Tensor) -> Tensor:
        """The Pro block's output norm and output gate on out [B, H, T, d]."""
        if self.output_norm is not None:
            out = head_rms_norm(out, self.output_norm, self.norm_eps)
        if self.ogate_proj is not None:
            B, T = x.shape[:2]
            gate = self.ogate_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
            out = out * torch.sigmoid(gate.to(torch.promote_types(gate.dtype, torch.float32))).to(out.dtype)
        return out


class FoX(PositionalEncoding):
    claims = ("shift-invariance",)  # positions enter as differences only, or not at all
    attention_options: frozenset[str] = frozenset()  # its own attention has no temperature or window (yet)

    def __init__(self, config, *, rope: bool = False, theta: float = 500000.0, output_gate: bool = False,
                 output_norm: bool = False, qk_norm: bool = False, k_shift: bool = False, v_shift: bool = False,
                 kernel: str = "auto") -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'fox' decays keys by the gates between them and the query; it needs "
                             "causal attention")
        if kernel not in KERNELS:
            raise ValueError(f"model.pe_args.kernel: unknown value {kernel!r}; allowed: {', '.join(KERNELS)}")
        check_range("theta", theta, 1, what=" (the base wavelength of its RoPE)")
        self.rotary = RoPE(config, theta=theta) if rope else None
        self.layer_args = dict(dim=config.dim, n_heads=config.n_heads, n_kv_heads=config.n_kv_heads,
                               head_dim=config.head_dim, norm_eps=config.norm_eps, rope=rope,
                               output_gate=output_gate, output_norm=output_norm, qk_norm=qk_norm, k_shift=k_shift,
                               v_shift=v_shift, kernel=kernel)

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        rotary = None if self.rotary is None else self.rotary.rotary(positions, dtype)
        return PositionState(positions=positions, rotary=rotary)

    def make_layer(self, layer_idx: int) -> LayerPE:
        return FoXLayer(**self.layer_args)
