"""DAPE, data-adaptive positional encoding (Zheng et al., NeurIPS 2024, "DAPE: Data-Adaptive Positional Encoding
for Length Extrapolation", arXiv 2405.14722; DAPE v2: Zheng et al., "DAPE V2: Process Attention Score as Feature Map
for Length Extrapolation", arXiv 2410.04798; official code github.com/chuanyang-Zheng/DAPE: `AliBi_DAPE` and
`ParallelKerpleLog_DAPE` in DAPE.py, `Alibi_DAPEV2`, `Kerple_DAPEV2` and `FIRE_DAPEV2` in
megatron/model/positional_embeddings.py).

A relative bias B (ALiBi, KERPLE or FIRE) is adapted to the content by a small network f that reads every head's
attention logit and bias at once:

    A_ij = q_i . k_j / sqrt(d)                              [H] per pair (query heads)
    logits_ij = A_ij + B_ij + f(A, B)_ij
    out_i = softmax_j(logits_ij) v_j over the visible keys

  version 1  f = Linear(2H -> width), LeakyReLU, Linear(width -> H) on each pair's [A_ij ; B_ij] alone
  version 2  f = Conv(2H -> width), LeakyReLU, Conv(width -> H): the [2H, T, T] logits and biases as a feature map,
             each convolution 1 x `kernel` along the keys of a query's row (zero padding kernel // 2), its input
             zero at the keys the query does not see (the official code's torch.tril)

with the bases, per head h and distance n = i - j >= 0:
  alibi    B = -m_h n, ALiBi's fixed slopes
  kerple   B = -r1_h log(1 + r2_h n), r1 ~ U(0, 2), r2 ~ U(0, 1) learned, kept >= 0.01 (KERPLE's log kernel)
  fire     B = g(psi(n) / (psi(max(i, L)) + 1e-6)), psi(z) = log(|c z| + 1), g = Linear(1 -> width), LeakyReLU,
           Linear(width -> H), c (init 0.1) and L = |l L0| (l init 1) learned: FIRE as the official `FIRE_DAPEV2`

A version-2 output at key j reads the hidden units at keys j - p .. j + p (p = kernel // 2), which read the inputs
up to j + 2p: past the query's own key those are the zeros of the unseen keys, so no later token's content reaches
a query. Where we differ from the official code: its convolution pads at the matrix's edge, so its last p queries
see padding where every other query sees the convolution of the zeroed future (their logits then depend on whether
later tokens exist); here every query's row continues with zero inputs past its own key, as the official code's
other rows do, so a query's logits do not depend on the sequence's length and cached decoding equals the full
forward (the official code supports only single-token decoding with v1). Keys hidden from a query for other
reasons (padding, outside a window) are zero inputs and zero hidden units, as the padding at the matrix's start:
a left-padded prompt gives the logits of the unpadded one.

f needs the logits of every head for every pair (and, in v2, a row's neighbouring pairs), so the scores are
materialised: DAPE computes attention itself, one chunk of queries at a time (`by_query_chunks`: chunks recomputed
in the backward, memory linear in the length, time quadratic like any softmax attention; no fused kernel applies).
Every path is exact: `dape-dense` (one chunk, under attention.forced("dense"): the reference) and `dape-chunked`
compute the same logits. The KV cache keeps the keys and every key's position (`dape_pos`), so cached decoding and
chunked prefill equal the full forward. It honours windows (through attention's mask) and temperatures; it does
not report its weights to `tape analyze attention` (refused in one line while probing).

Defaults as the official code: width 32 (`mlp_width`, also FIRE's hidden width), kernel 3 (`dapev2_kernel` of its
configs), PyTorch's default initialisation of the linear and convolution layers (tape's generic N(0, init_std) is
undone in `init_weights`); KERPLE's initialisation and clamp as in its code (the clamp applied in the computation
rather than to the stored value); FIRE's L0 = 256 (the official code's half of its 512-token training length).
Where we differ: grouped-query attention is supported (keys and values repeated per query head, f over the query
heads); the bias and f are computed in fp32 at least under bf16 autocast.

pe_args:
  version     1 (default) | 2
  base        kerple (default) | alibi | fire
  mlp_width   f's hidden width, and FIRE's (32)
  kernel      version 2's kernel size along the keys, odd (3)
  threshold   FIRE's initial L0 (256; base fire only)
No Hugging Face config expresses f: `tape export` refuses it.
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
    check_range,
    forced_path,
    rows_for,
)

BASES = ("kerple", "alibi", "fire")
VERSIONS = (1, 2)
KERPLE_EPS = 1e-2  # r1 and r2 are kept >= this, as in KERPLE's code
FIRE_EPS = 1e-6  # FIRE's normaliser offset, as in the official code


class DAPELayer(LayerPE):
    def __init__(self, n_heads: int, base: str, mlp_width: int, version: int = 1, kernel: int = 3,
                 threshold: float = 256.0) -> None:
        super().__init__()
        self.base, self.version, self.threshold = base, version, threshold
        self.r1 = self.r2 = None
        if base == "alibi":
            self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)
        elif base == "kerple":
            self.r1 = nn.Parameter(torch.empty(n_heads))
            self.r2 = nn.Parameter(torch.empty(n_heads))
        else:  # FIRE, as the official FIRE_DAPEV2
            self.fire = nn.Sequential(nn.Linear(1, mlp_width), nn.LeakyReLU(), nn.Linear(mlp_width, n_heads))
            self.c = nn.Parameter(torch.empty(()))
            self.threshold_scale = nn.Parameter(torch.empty(()))
        if version == 1:
            self.mlp = nn.Sequential(nn.Linear(2 * n_heads, mlp_width), nn.LeakyReLU(),
                                     nn.Linear(mlp_width, n_heads))
        else:
            pad = (0, kernel // 2)
            self.conv = nn.Sequential(nn.Conv2d(2 * n_heads, mlp_width, (1, kernel), padding=pad), nn.LeakyReLU(),
                                      nn.Conv2d(mlp_width, n_heads, (1, kernel), padding=pad))
        self.init_weights()

    def init_weights(self) -> None:
        net = self.mlp if self.version == 1 else self.conv
        for layer in (net[0], net[2]):
            layer.reset_parameters()  # PyTorch's default, as the official code
        with torch.no_grad():
            if self.base == "kerple":
                self.r1.uniform_(0, 2)
                self.r2.uniform_(0, 1)
            elif self.base == "fire":
                for layer in (self.fire[0], self.fire[2]):
                    layer.reset_parameters()
                self.c.fill_(0.1)
                self.threshold_scale.fill_(1.0)

    def bias(self, distance: Tensor, q_pos: Tensor) -> Tensor:
        """The base bias [B|1, H, C, K] at distances i - j [B|1, C, K] (float) of queries at positions q_pos
        [B|1, C]."""
        if self.base == "fire":
            c = self.c.to(distance)
            limit = torch.abs(self.threshold_scale.to(distance) * self.threshold)
            normaliser = torch.log(torch.abs(c * torch.maximum(q_pos.to(distance), limit)) + 1) + FIRE_EPS
            z = torch.log(torch.abs(c * distance) + 1) / normaliser[..., None]
            return self.fire(z[..., None]).permute(0, 3, 1, 2)
        distance = distance[:, None]
        if self.base == "alibi":
            return -self.slopes.to(distance)[:, None, None] * distance
        r1 = self.r1.clamp(min=KERPLE_EPS).to(distance)[:, None, None]
        r2 = self.r2.clamp(min=KERPLE_EPS).to(distance)[:, None, None]
        return -r1 * torch.log1p(r2 * distance.clamp(min=0))

    def adapt(self, scores: Tensor, bias: Tensor, hidden: Tensor, future: Tensor) -> Tensor:
        """f(A, B) [B, H, C, K] from the scaled scores and biases [B, H, C, K]; `hidden` [.., C, K]: the keys each
        query does not see, `future` [C, K]: those after its own key (version 2 only)."""
        if self.version == 1:
            return self.mlp(torch.cat((scores, bias), dim=1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        first, second = self.conv[0], self.conv[2]
        p = first.kernel_size[1] // 2
        dtype, K = scores.dtype, scores.shape[-1]
        features = torch.cat((scores, bias), dim=1).masked_fill(hidden, 0.0)  # the official torch.tril
        # keys -p .. K - 1 + 2p: the padding before the first key, then the unseen keys after the last one
        units = nn.functional.conv2d(nn.functional.pad(features, (p, 2 * p)), first.weight.to(dtype),
                                     first.bias.to(dtype))  # hidden units at keys 0 .. K - 1 + p
        units = nn.functional.leaky_relu(units)
        absent = hidden & ~future  # hidden but not after the query (padding, a window): as the matrix's start
        units = torch.cat((units[..., :K].masked_fill(absent, 0.0), units[..., K:]), dim=-1)
        return nn.functional.conv2d(nn.functional.pad(units, (p, 0)), second.weight.to(dtype), second.bias.to(dtype))

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
                future = keys[None, :] > past + torch.arange(i0, i1, device=q.device)[:, None]  # [C, Tk]
                if mask is None:  # the queries are the last Tq of Tk keys (one decoding step sees them all)
                    hidden = future
                else:
                    hidden = ~(mask[..., i0:i1, :] if mask.dtype == torch.bool else mask[..., i0:i1, :] > float("-inf"))
                distance = (q_pos[:, i0:i1, None] - k_pos[:, None, :]).to(compute)  # [B, C, Tk]
                scores = q[:, :, i0:i1] @ k.transpose(-1, -2)  # [B, H, C, Tk], scaled
                bias = self.bias(distance, q_pos[:, i0:i1]).expand_as(scores)
                logits = (scores + bias + self.adapt(scores, bias, hidden, future)).masked_fill(hidden, float("-inf"))
                weights = (logits if temperature == 1.0 else logits / temperature).softmax(-1)
                return weights @ v

            hidden_width = self.mlp[0].out_features if self.version == 1 else self.conv[0].out_channels
            width = 2 * H + hidden_width  # [B, C, Tk, width] is the largest temporary of a chunk
            rows = Tq if forced_path() == "dense" else rows_for(B, width, Tk, Tq)
            out = by_query_chunks(chunk, Tq, rows)
        return out.to(out_dtype)


class DAPE(PositionalEncoding):
    claims = ("shift-invariance",)

    attention_options = frozenset({"temperature", "window"})  # its own attention takes no sinks

    def __init__(self, config, *, version: int = 1, base: str = "kerple", mlp_width: int = 32,
                 kernel: int | None = None, threshold: float | None = None) -> None:
        super().__init__(config)
        if not config.causal:
            raise ValueError("model.causal: pe 'dape' adapts causal biases (distances i - j >= 0); it needs causal "
                             "attention")
        if version not in VERSIONS or isinstance(version, bool):
            raise ValueError(f"model.pe_args.version: DAPE's version is 1 (an MLP) or 2 (a convolution), got "
                             f"{version!r}")
        if base not in BASES:
            raise ValueError(f"model.pe_args.base: unknown DAPE base bias {base!r}; allowed: {', '.join(BASES)}")
        check_positive_int("mlp_width", mlp_width)
        if kernel is not None and version == 1:
            raise ValueError("model.pe_args.kernel: the convolution's size applies to DAPE version 2 only; set "
                             "version: 2 or leave kernel out")
        kernel = 3 if kernel is None else kernel
        check_positive_int("kernel", kernel)
        if kernel % 2 == 0:
            raise ValueError(f"model.pe_args.kernel: must be odd (the convolution is centred on each key), got "
                             f"{kernel}")
        if threshold is not None and base != "fire":
            raise ValueError("model.pe_args.threshold: FIRE's initial L applies to base: fire only; leave it out")
        threshold = 256.0 if threshold is None else threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(f"model.pe_args.threshold: expected a number, got {threshold!r}")
        check_range("threshold", threshold, 0)
        self.layer_args = dict(n_heads=config.n_heads, base=base, mlp_width=mlp_width, version=version,
                               kernel=kernel, threshold=float(threshold))

    def make_layer(self, layer_idx: int) -> LayerPE:
        return DAPELayer(**self.layer_args)
