"""RoPE (Su et al.) with the context-extension scalings of transformers 5: linear (position interpolation),
dynamic (NTK), yarn, llama3 and longrope, and the frequency family of 2024-25 as options: p-RoPE, HoPE, FoPE and Hugging
Face's partial rotary. Half-split pairing (i, i + d/2), as in Llama, so Llama checkpoints load as is.

Query/key pair i (of d/2, d = head_dim) at position t is rotated by the angle t * w_i, w_i = theta^(-2i/d) (after
the scaling). The frequency options (docs/positional-encodings.md has the equations and sources):
  p-RoPE (Barbero et al. 2024, arXiv 2410.06205): only the round(p * d/2) highest frequencies rotate; the others
      are set to w_i = 0, so their pairs are never rotated (p = 0 is NoPE, p = 1 RoPE).
  HoPE (Chen et al. 2024, arXiv 2410.21216): every frequency whose period 2 pi / w_i is longer than the training
      context L (original_max_len) is set to 0: those components become position-independent.
  FoPE (Hua et al. 2024, arXiv 2412.17739): the same under-trained frequencies are zeroed, and each of the first
      m = min(D, d/4) pairs (D: the frequencies left) carries a Fourier series over all D of them instead of one
      wave: c_j(t) = sum_k C_kj cos(w_k t) / sum_k C_kj, s_j(t) = sum_k S_kj sin(w_k t) / sum_k S_kj, with
      fixed random coefficients C, S = I_step + N(0, sigma) (xavier-normal with gain sigma, one set per key head);
      q_j and k_j are mapped by [[c, -s], [s, c]]. The other pairs are position-independent (c = 1, s = 0).
  partial_rotary_factor (Hugging Face's): only the first r = d * factor dims of a head rotate, in pairs
      (i, i + r/2), with w_i = theta^(-2i/r); the rest pass unchanged (GPT-NeoX, Phi). Unlike p-RoPE it keeps
      every frequency of theta's range (spread over fewer pairs) and leaves the *last* dims of a head unrotated.

pe_args:
  theta             base wavelength (10000; Llama 3 uses 500000)
  scaling           none | linear | dynamic | yarn | llama3 | longrope
  factor            context-extension factor s (e.g. 2 for 4K -> 8K)
  original_max_len  pre-training context of the scaled model (default: model.max_seq_len); HoPE's and FoPE's L
  beta_fast, beta_slow, attention_factor, truncate      yarn's knobs (defaults 32, 1, 0.1 ln s + 1, true)
  low_freq_factor, high_freq_factor                     llama3's knobs (defaults 1, 4)
  short_factor, long_factor   longrope's (Ding et al. 2024, arXiv 2402.13753; Phi-3): one rescale factor per
      frequency (d/2 of them, r/2 with partial rotary): w_i = theta^(-2i/d) / factor_i, the short factors while a
      forward's largest position + 1 is at most original_max_len, the long ones past it (for every row and every
      token of that forward, as transformers switches); cos and sin are multiplied by attention_factor (default
      sqrt(1 + ln s / ln original_max_len), s = factor, or model.max_seq_len / original_max_len when factor is 1;
      1 when s <= 1). Cached keys keep the factors they were encoded with: `cache_key` says which, and generation
      re-encodes every token once a sequence crosses original_max_len, as transformers' Phi-3 drops its cache then
  frequency_fraction   p-RoPE's p, in [0, 1] (1)
  hope                 true: HoPE (false)
  fope                 true: FoPE (false); fope_sigma: the coefficients' xavier gain (0.3, the paper's small models)
  partial_rotary_factor   Hugging Face's, in (0, 1] (1)
The frequency options apply to every RoPE-based PE (randpe, xpos, tape); FoPE and partial_rotary_factor change
the rotary state's layout, so only rope and randpe take them. None of them works with scaling: dynamic or longrope
(the frequencies they zero would change with the length).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from tapecli.model.pe.base import (
    LayerPE,
    PositionalEncoding,
    PositionState,
    apply_rotary,
    check_positive_int,
    check_range,
)
from tapecli.model.pe.rope_freqs import (
    default_inv_freq,
    dynamic_inv_freq,
    fope_coefficients,
    kept_frequencies,
    llama3_inv_freq,
    longrope_attention_factor,
    longrope_inv_freq,
    yarn_inv_freq,
)

SCALINGS = ("none", "linear", "dynamic", "yarn", "llama3", "longrope")


def rotate_heads(x: Tensor, rotary: Tensor) -> Tensor:
    """`apply_rotary` of x [B, H, T, d] by rotary [B|1, 1|G, T, r]: G groups of heads (FoPE's per-key-head
    coefficients: query head h uses group h // (H / G)); r < d rotates only the first r dims (partial rotary)."""
    H, G = x.shape[1], rotary.shape[1]
    if G not in (1, H):  # each group's heads against its rotary, broadcast: no copy of the rotary per head
        return rotate_heads(x.unflatten(1, (G, H // G)), rotary.unsqueeze(2)).flatten(1, 2)
    r = rotary.shape[-1]
    if r == x.shape[-1]:
        return apply_rotary(x, rotary)
    return torch.cat((apply_rotary(x[..., :r], rotary), x[..., r:]), dim=-1)


class RotaryLayer(LayerPE):
    """Rotates queries and keys by the (fixed) rotary state of the current tokens."""

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        rotary = state.rotary.to(q.dtype)  # like transformers: cos/sin computed in fp32, used in the activation dtype
        return rotate_heads(q, rotary), rotate_heads(k, rotary)


class RoPE(PositionalEncoding):
    # Whether this PE's layers take a rotary state of another layout (FoPE's per-key-head values, a partial width).
    rotary_layouts = True

    def __init__(self, config, *, theta: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                 original_max_len: int | None = None, beta_fast: float = 32.0, beta_slow: float = 1.0,
                 attention_factor: float | None = None, truncate: bool = True, low_freq_factor: float = 1.0,
                 high_freq_factor: float = 4.0, frequency_fraction: float = 1.0, hope: bool = False,
                 fope: bool = False, fope_sigma: float = 0.3, partial_rotary_factor: float = 1.0,
                 short_factor: list[float] | None = None, long_factor: list[float] | None = None) -> None:
        super().__init__(config)
        if scaling not in SCALINGS:
            raise ValueError(f"model.pe_args.scaling: unknown RoPE scaling {scaling!r}; allowed: {', '.join(SCALINGS)}")
        if scaling != "none" and factor < 1:
            raise ValueError(f"model.pe_args.factor: must be >= 1 for scaling {scaling!r}, got {factor}")
        check_range("theta", theta, 1, what=" (the base wavelength: 10000 in Llama 2, 500000 in Llama 3)")
        check_range("factor", factor, 0)
        if original_max_len is not None:
            check_positive_int("original_max_len", original_max_len)
        for key, value in (("beta_fast", beta_fast), ("beta_slow", beta_slow), ("low_freq_factor", low_freq_factor),
                           ("high_freq_factor", high_freq_factor), ("attention_factor", attention_factor)):
            if value is not None:
                check_range(key, value, 0)
        if scaling == "llama3" and not high_freq_factor > low_freq_factor:
            raise ValueError(f"model.pe_args.high_freq_factor: must be > low_freq_factor ({low_freq_factor}) for "
                             f"scaling 'llama3', got {high_freq_factor}")
        self.theta, self.scaling, self.factor = theta, scaling, factor
        self.original_max_len = original_max_len or config.max_seq_len
        self.check_frequency_options(frequency_fraction, hope, fope, fope_sigma, partial_rotary_factor)
        self.frequency_fraction, self.hope, self.fope, self.fope_sigma = frequency_fraction, hope, fope, fope_sigma
        self.partial_rotary_factor = partial_rotary_factor
        # The rotary width: Hugging Face's partial rotary rotates the first int(d * factor) dims (even).
        self.rotary_dim = int(config.head_dim * partial_rotary_factor) // 2 * 2
        self.short_factor, self.long_factor = self.check_longrope(short_factor, long_factor)
        self.given_attention_factor = attention_factor
        with torch.device("cpu"):  # real tensors even when the model is built on the meta device
            self.init_frequencies(beta_fast, beta_slow, attention_factor, truncate, low_freq_factor,
                                  high_freq_factor)

    def init_frequencies(self, beta_fast: float, beta_slow: float, attention_factor: float | None, truncate: bool,
                         low_freq_factor: float, high_freq_factor: float) -> None:
        """The inverse frequencies (scaling, then the frequency options) and FoPE's coefficients."""
        theta, scaling, factor, dim = self.theta, self.scaling, self.factor, self.rotary_dim
        frequency_fraction, hope, fope = self.frequency_fraction, self.hope, self.fope
        self.attention_factor = 1.0
        if scaling == "linear":
            inv_freq = default_inv_freq(theta, dim) / factor
        elif scaling == "yarn":
            inv_freq = yarn_inv_freq(theta, dim, factor, self.original_max_len, beta_fast, beta_slow, truncate)
            self.attention_factor = attention_factor if attention_factor is not None else (
                0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)
        elif scaling == "llama3":
            inv_freq = llama3_inv_freq(theta, dim, factor, self.original_max_len, low_freq_factor, high_freq_factor)
        elif scaling == "longrope":
            inv_freq = longrope_inv_freq(theta, dim, self.short_factor)
            self.long_inv_freq = longrope_inv_freq(theta, dim, self.long_factor)
            growth = factor if factor > 1 else self.config.max_seq_len / self.original_max_len
            self.attention_factor = attention_factor if attention_factor is not None else (
                longrope_attention_factor(growth, self.original_max_len))
        else:  # none, and dynamic below its threshold
            inv_freq = default_inv_freq(theta, dim)
        if frequency_fraction < 1 or hope or fope:
            floor = 2 * math.pi / self.original_max_len if hope or fope else 0.0
            inv_freq = kept_frequencies(inv_freq, frequency_fraction, floor)
        # A plain fp32 tensor, not a buffer: `model.to(torch.bfloat16)` must not round the frequencies.
        self.inv_freq = inv_freq
        # Relative, and rotating the state leaves q.k alone; dynamic NTK's frequencies follow the sequence length.
        self.claims = ("rotation-equivariance",) if scaling == "dynamic" else ("shift-invariance",
                                                                              "rotation-equivariance")
        if fope or self.partial_rotary_factor < 1:  # FoPE mixes frequencies in a pair
            self.claims = () if fope else ("shift-invariance",)
        self.fope_cos = self.fope_sin = None
        if fope:
            n_freqs = int((inv_freq > 0).sum())
            if n_freqs == 0:
                raise ValueError(f"model.pe_args.fope: no frequency of theta {theta} completes a period within "
                                 f"original_max_len {self.original_max_len}; raise it or lower theta")
            self.fope_freqs = inv_freq[:n_freqs]  # the kept frequencies are the highest, so the first n_freqs
            self.fope_cos, self.fope_sin = fope_coefficients(n_freqs, self.rotary_dim, self.config.n_kv_heads,
                                                             self.fope_sigma)

    def check_longrope(self, short: list[float] | None, long: list[float] | None) -> tuple[list[float], list[float]]:
        """LongRoPE's factor lists: both given with scaling longrope (one positive number per rotary frequency),
        neither without it; ValueError naming the key."""
        n = self.rotary_dim // 2
        if self.scaling != "longrope":
            if short is not None or long is not None:
                key = "short_factor" if short is not None else "long_factor"
                raise ValueError(f"model.pe_args.{key}: only scaling 'longrope' takes it (scaling is "
                                 f"{self.scaling!r}); set scaling: longrope or remove it")
            return [], []
        for key, value in (("short_factor", short), ("long_factor", long)):
            if value is None:
                raise ValueError(f"model.pe_args.{key}: scaling 'longrope' needs it: a list of {n} rescale factors, "
                                 "one per rotary frequency (e.g. from the base's config.json rope_parameters)")
            if not isinstance(value, (list, tuple)) or len(value) != n:
                got = f"{len(value)} values" if isinstance(value, (list, tuple)) else repr(value)
                raise ValueError(f"model.pe_args.{key}: expected a list of {n} numbers (one per rotary frequency: "
                                 f"head_dim {self.config.head_dim} x partial_rotary_factor "
                                 f"{self.partial_rotary_factor:g} / 2), got {got}")
            for x in value:
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
                    raise ValueError(f"model.pe_args.{key}: every factor must be a finite number > 0, got {x!r}")
        return [float(x) for x in short], [float(x) for x in long]

    def check_frequency_options(self, fraction: float, hope: bool, fope: bool, sigma: float,
                                partial: float) -> None:
        """The frequency options' values, and which PEs and scalings take them (module docstring)."""
        if not 0 <= fraction <= 1:
            raise ValueError(f"model.pe_args.frequency_fraction: p-RoPE's fraction must be in [0, 1], got {fraction}")
        if not 0 < partial <= 1 or int(self.config.head_dim * partial) < 2:
            raise ValueError(f"model.pe_args.partial_rotary_factor: must be in (0, 1] and rotate at least one pair "
                             f"of the head's {self.config.head_dim} dims, got {partial}")
        check_range("fope_sigma", sigma, 0, inclusive=True)
        if (fope or partial < 1) and not self.rotary_layouts:
            key = "fope" if fope else "partial_rotary_factor"
            raise ValueError(f"model.pe_args.{key}: changes the rotary state's layout, which pe "
                             f"{type(self).__name__.lower()!r} cannot take; use it with pe rope or randpe")
        if self.scaling in ("dynamic", "longrope") and (fraction < 1 or hope or fope):
            key = "frequency_fraction" if fraction < 1 else "hope" if hope else "fope"
            raise ValueError(f"model.pe_args.{key}: cannot combine with scaling {self.scaling!r} (the frequencies it "
                             "zeroes would change with the length); use scaling linear, yarn or llama3")

    def frequencies(self, positions: Tensor) -> Tensor:
        """Inverse frequencies [d/2] for this forward. Dynamic NTK depends on the sequence: each row of
        positions [B, T] gets its own, from its own length (largest position + 1), returned as [B, 1, d/2];
        longrope takes its long factors for the whole forward once its largest position + 1 passes the original
        length (transformers' switch)."""
        inv_freq = self.inv_freq
        if self.scaling == "longrope" and self.cache_key(positions) == "long":
            inv_freq = self.long_inv_freq
        if self.scaling == "dynamic":
            lengths = self.cache_key(positions)
            if max(lengths) > self.original_max_len:
                rows = [dynamic_inv_freq(self.theta, self.rotary_dim, self.factor, n, self.original_max_len)
                        for n in lengths]
                inv_freq = rows[0] if positions.dim() == 1 else torch.stack(rows).unsqueeze(-2)
        return inv_freq.to(positions.device)

    def cache_key(self, positions: Tensor) -> object:
        """Dynamic NTK: the per-row lengths its frequencies depend on (at least the original context); longrope:
        which factors ("short" or "long") the forward's largest position selects."""
        if self.scaling == "longrope":
            return "long" if int(positions.max()) + 1 > self.original_max_len else "short"
        if self.scaling != "dynamic":
            return None
        lengths = (positions.amax(-1) + 1).reshape(-1).tolist()
        return tuple(max(int(n), self.original_max_len) for n in lengths)

    def rotary(self, positions: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """[B or 1, 1, T, r]: cos of every pair's angle, then sin (r = d, or the partial rotary width); FoPE:
        [B or 1, n_kv_heads, T, r], each pair's two Fourier series; fp32 (fp64 for fp64 models)."""
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        if self.fope:
            return self.fope_rotary(positions, compute)
        angles = positions[..., None].to(compute) * self.frequencies(positions).to(compute)  # [B, T, d/2]
        rotary = torch.cat((angles.cos(), angles.sin()), dim=-1) * self.attention_factor
        return rotary.unsqueeze(1)

    def fope_rotary(self, positions: Tensor, compute: torch.dtype) -> Tensor:
        """FoPE's state: per key head, pair j < m gets (sum_k C_kj cos(w_k t), sum_k S_kj sin(w_k t)), the others
        (1, 0): position-independent."""
        angles = positions[..., None].to(compute) * self.fope_freqs.to(positions.device, compute)  # [B, T, D]
        cos = torch.einsum("btk,gkj->bgtj", angles.cos(), self.fope_cos.to(angles))
        sin = torch.einsum("btk,gkj->bgtj", angles.sin(), self.fope_sin.to(angles))
        rest = self.rotary_dim // 2 - cos.shape[-1]
        cos = torch.nn.functional.pad(cos, (0, rest), value=1.0)
        sin = torch.nn.functional.pad(sin, (0, rest), value=0.0)
        return torch.cat((cos, sin), dim=-1) * self.attention_factor

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> PositionState:
        return PositionState(positions=positions, rotary=self.rotary(positions, dtype))

    def make_layer(self, layer_idx: int) -> LayerPE:
        return RotaryLayer()

    def hf_export(self) -> dict[str, Any]:
        """transformers' `rope_parameters` and `max_position_embeddings` for this RoPE (tapecli.model.hf.load reads them
        back); a ValueError naming the first frequency option that no Hugging Face config expresses. A partial
        rotary and longrope run in transformers' Phi3 only (tapecli.model.hf.arch_export picks the class)."""
        plain = {"frequency_fraction": 1.0, "hope": False, "fope": False}
        for key, value in plain.items():
            if getattr(self, key) != value:
                raise ValueError(f"pe_args.{key}: {getattr(self, key)!r} has no Hugging Face Llama equivalent "
                                 "(transformers rotates every dim of a head at its rope type's frequencies)")
        params: dict[str, Any] = {"rope_theta": self.theta, "rope_type": "default"}
        if self.partial_rotary_factor != 1.0:
            params["partial_rotary_factor"] = self.partial_rotary_factor
        max_pos = self.config.max_seq_len
        if self.scaling == "none":
            return {"rope_parameters": params, "max_position_embeddings": max_pos}
        if self.scaling == "longrope":
            params.update(rope_type="longrope", short_factor=self.short_factor, long_factor=self.long_factor,
                          original_max_position_embeddings=self.original_max_len)
            if self.factor > 1:
                params["factor"] = self.factor
            if self.given_attention_factor is not None:  # else transformers computes it as tape does
                params["attention_factor"] = self.given_attention_factor
            return {"rope_parameters": params, "max_position_embeddings": max_pos}
        params.update(rope_type=self.scaling, factor=self.factor)
        if self.scaling == "dynamic":
            max_pos = self.original_max_len  # transformers' dynamic NTK measures growth from max_position_embeddings
        elif self.scaling != "linear":
            params["original_max_position_embeddings"] = self.original_max_len
        args = self.config.pe_args
        if self.scaling == "yarn":
            params.update(beta_fast=args.get("beta_fast", 32.0), beta_slow=args.get("beta_slow", 1.0),
                          truncate=args.get("truncate", True), attention_factor=self.attention_factor)
        if self.scaling == "llama3":
            params.update(low_freq_factor=args.get("low_freq_factor", 1.0),
                          high_freq_factor=args.get("high_freq_factor", 4.0))
        return {"rope_parameters": params, "max_position_embeddings": max_pos}
