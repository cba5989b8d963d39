"""The PE under check: tiny models built with it, and the inputs and tolerances every check shares.

    subject = Subject("alibi", pe_args={}, device=torch.device("cpu"))
    model = subject.model()                  # 2 layers, dim 64, 4 query / 2 key heads, eval mode, exact dtype
    x = subject.tokens(2, 24, seed=1)        # [2, 24] on the device

Models: the same seed for every build, then every PE parameter (and q/k/v bias and q/k norm) moved away from its
initial value (zeros, which hide what TAPE's and CoPE's maps do, become N(0, 0.3); any other value is scaled by
exp(N(0, 0.5)), which keeps its sign and magnitude), as after training. Exact checks compare two computations of the
same thing: in fp64 on the CPU (tolerance 1e-9 on logits of order 1e-1, where a bug shows as 1e-4 or more) and in
fp32 on CUDA (2e-3, TF32 matmuls included). `max_abs` and `relative` are how every check compares two tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tapecli.errors import TapeError
from tapecli.model import ModelConfig, Transformer

VOCAB = 97
SIZE = dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
SIZE_TEXT = "2 layers, dim 64, 4 query / 2 key heads"
EXACT_TOLERANCE = {"cpu": 1e-9, "cuda": 2e-3}  # exact checks, in the exact dtype of the device
FP32_TOLERANCE = {"cpu": 1e-4, "cuda": 2e-3}  # fp32 on the device vs the fp64 CPU reference (relative to max |ref|)


@dataclass
class Subject:
    pe: str  # a model.pe value (a built-in or plugin name, or FILE.py:CLASS)
    pe_args: dict[str, Any] = field(default_factory=dict)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    compile_backend: str = "inductor"  # what --compile uses (tests use aot_eager: same tracing, no C++ build)
    keys: dict[str, Any] = field(default_factory=dict)  # further model keys (a hybrid layout: 4 layers)

    def config(self) -> ModelConfig:
        size = {**SIZE, "n_layers": 4} if "schedule" in self.keys else SIZE
        try:
            return ModelConfig(**size, pe=self.pe, pe_args=dict(self.pe_args), **self.keys)
        except ValueError as e:
            raise TapeError(str(e)) from None

    @property
    def exact_dtype(self) -> torch.dtype:
        return torch.float64 if self.device.type == "cpu" else torch.float32

    @property
    def tolerance(self) -> float:
        return EXACT_TOLERANCE.get(self.device.type, 2e-3)

    @property
    def fp32_tolerance(self) -> float:
        return FP32_TOLERANCE.get(self.device.type, 2e-3)

    def model(self, dtype: torch.dtype | None = None, device: torch.device | None = None,
              train: bool = False) -> Transformer:
        """A fresh model (always the same weights), in `dtype` (default: the exact dtype) on `device` (default:
        the subject's), in eval mode unless `train`."""
        torch.manual_seed(0)
        model = Transformer(self.config())
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                attention_extras = name.endswith(("_proj.bias", "q_norm.weight", "k_norm.weight"))  # qkv_bias, qk_norm
                if (".pe." not in f".{name}" and not attention_extras) or name in model.inert_parameters:
                    continue
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype)
                p.copy_(0.3 * noise if bool((p == 0).all()) else p * (0.5 * noise).exp())
        model.to(device=device or self.device, dtype=dtype or self.exact_dtype)
        return model.train(train)

    def tokens(self, batch: int, length: int, seed: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(0, VOCAB, (batch, length), generator=generator).to(self.device)

    def left_padding(self, batch: int, length: int, pads: int) -> torch.Tensor:
        """A 0/1 attention mask [batch, length] whose last row starts with `pads` padding tokens."""
        mask = torch.ones(batch, length, dtype=torch.long, device=self.device)
        mask[-1, :pads] = 0
        return mask


def max_abs(a: Tensor, b: Tensor) -> float:
    """max |a - b|; inf when either side holds a NaN or an infinity, so no check compares non-finite values as
    equal (NaN - NaN is NaN, and Python's max() and <= would let a NaN through)."""
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    return (a.double() - b.double()).abs().max().item()


def relative(got: Tensor, want: Tensor, floor: float = 0.0) -> float:
    diff = max_abs(got, want)
    return diff if math.isinf(diff) else diff / max(want.abs().max().item(), floor, 1e-30)
