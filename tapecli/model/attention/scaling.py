"""Per-layer attention scales: the temperature, and the position-dependent query scale (`length_scale`).

    scale = QueryScale.of("llama4", {"floor_scale": 8192.0}, max_seq_len=4096)    # None for "none"
    q = scale(q, positions)          # q [B, H, T, d] times s(p) of each query's position p, [B|1, T]

Temperature T (`model.temperature`): attention is softmax(logits / T), the logits being q.k / sqrt(d) plus the PE's
positional terms (a bias, CoPE's position term), as MapFormer's code computes `softmax(logits / temperature)`;
`tapecli.model.attention.attend` takes it, and PEs that compute attention themselves get it as an option.

Length scale: every query of the layer is multiplied by s(p), p its position (0-based, counting real tokens only, as
every position in a tape model does), before attention; keys are left alone, so the logits q.k / sqrt(d) grow by
s(p) (a bias PE's bias does not; CoPE's gates, computed from the same q.k, do). The kinds (`length_scale_args`
in brackets, with defaults):

  none    s(p) = 1
  llama4  s(p) = 1 + attn_scale * log(1 + floor((p + 1) / floor_scale))      [floor_scale 8192, attn_scale 0.1]
          Llama 4's "attention temperature tuning" of its NoPE layers, as transformers' `Llama4TextAttention`
          computes it (`attn_temperature_tuning`; after Nakanishi 2025, "Scalable-Softmax", arXiv 2501.19399):
          1 up to position 8190, then a slow logarithmic growth.
  log     s(p) = max(1, log(p + 1) / log(length))                              [length = model.max_seq_len]
          log-n scaling (Su 2021, kexue.fm/archives/8823; Qwen-1's `use_logn_attn`, which multiplies the query at
          1-based position n by log_L(n) past its training length L): 1 inside the training length, log_L(n)
          beyond it. SWAN-GPT (Puvvada et al. 2025, arXiv 2504.08719) scales the logits of its global NoPE layers
          logarithmically in the same spirit at inference.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

LENGTH_SCALES: dict[str, dict[str, Any]] = {
    "none": {},
    "llama4": {"floor_scale": 8192.0, "attn_scale": 0.1},
    "log": {"length": None},  # None: model.max_seq_len
}


def check_temperature(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{key}: the attention temperature must be a number > 0, got {value!r}")
    return float(value)


def check_length_scale(kind: Any, args: Any, max_seq_len: int, key: str) -> dict[str, Any]:
    """The arguments of length scale `kind`, defaults filled in; ValueError naming `key` (e.g. model.length_scale)
    for an unknown kind, argument or a value out of range."""
    if kind not in LENGTH_SCALES:
        raise ValueError(f"{key}: unknown length scale {kind!r}; allowed: {', '.join(LENGTH_SCALES)}")
    if not isinstance(args, dict):
        raise ValueError(f"{key}_args: expected a mapping, got {args!r}")
    allowed = LENGTH_SCALES[kind]
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        raise ValueError(f"{key}_args.{unknown[0]}: not an argument of length scale {kind!r}; allowed: "
                         f"{', '.join(allowed) or '(none)'}")
    resolved = {**allowed, **args}
    if kind == "log" and resolved["length"] is None:
        resolved["length"] = max_seq_len
    rules = {"floor_scale": (lambda v: v > 0 and math.isfinite(v), "> 0 (finite)"),
             "attn_scale": (lambda v: v >= 0 and math.isfinite(v), ">= 0 (finite)"),
             "length": (lambda v: v >= 2 and math.isfinite(v), ">= 2 (finite)")}
    for name, value in resolved.items():
        ok, what = rules[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise ValueError(f"{key}_args.{name}: expected a number {what}, got {value!r}")
    return resolved


class QueryScale:
    """q -> s(p) q for one layer (module docstring); `of` returns None for "none"."""

    def __init__(self, kind: str, args: dict[str, Any]) -> None:
        self.kind, self.args = kind, args

    @classmethod
    def of(cls, kind: str, args: dict[str, Any], max_seq_len: int) -> QueryScale | None:
        return None if kind == "none" else cls(kind, check_length_scale(kind, args, max_seq_len, "length_scale"))

    def factors(self, positions: Tensor, dtype: torch.dtype) -> Tensor:
        """s(p) for positions [B|1, T], in `dtype` (fp32 at least)."""
        p = positions.to(torch.promote_types(dtype, torch.float32))
        if self.kind == "llama4":
            return torch.log1p(torch.floor((p + 1) / self.args["floor_scale"])) * self.args["attn_scale"] + 1
        return (torch.log(p + 1) / math.log(self.args["length"])).clamp(min=1)

    def __call__(self, q: Tensor, positions: Tensor) -> Tensor:
        """q [B, H, T, d] scaled per query (computed in fp32 at least, like transformers, then q's dtype)."""
        return (q * self.factors(positions, q.dtype)[:, None, :, None]).to(q.dtype)
