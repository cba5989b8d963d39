"""LoRA (Hu et al. 2021) on chosen linear layers: W x + (alpha / r) B A dropout(x), with W frozen.

    spec = LoraSpec(rank=8, alpha=16.0, dropout=0.0, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
    names = apply_lora(model, spec)     # wraps every nn.Linear whose attribute name is a target; returns A/B names
    merge_lora(model)                   # folds B A into W and puts plain nn.Linear layers back (for eval, export)

Written here rather than taken from PEFT because it must wrap tape's own model in place, keep the base weight's
name (`...q_proj.weight`, so checkpoints and Hugging Face export need no renaming) and work on the meta device;
it is a few lines. Initialisation follows PEFT: A Kaiming-uniform (a = sqrt 5), B zero, so a fresh adapter changes
nothing and the model starts exactly at its base.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class LoraSpec:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LoRALinear(nn.Linear):
    """An nn.Linear plus a low-rank update; `weight` (and `bias`, if any) is the base layer's own parameter (shared,
    not copied).

    Parameters: weight [out, in] and bias [out] or None (frozen by the caller), lora_A [r, in], lora_B [out, r]."""

    def __init__(self, base: nn.Linear, spec: LoraSpec) -> None:
        nn.Module.__init__(self)  # not nn.Linear.__init__: that would allocate a second weight
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias  # a parameter or None (registered either way)
        # Adapters train in fp32 even over a bf16 base (they are tiny); the forward casts them to the input dtype.
        kwargs = {"device": base.weight.device, "dtype": torch.float32}
        self.lora_A = nn.Parameter(torch.empty(spec.rank, self.in_features, **kwargs))
        self.lora_B = nn.Parameter(torch.empty(self.out_features, spec.rank, **kwargs))
        self.scaling = spec.scaling
        self.dropout = nn.Dropout(spec.dropout) if spec.dropout > 0 else nn.Identity()
        self.reset_lora_parameters()

    def reset_lora_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B)

    def forward(self, x: Tensor) -> Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_A.to(x.dtype)), self.lora_B.to(x.dtype))
        return F.linear(x, self.weight, self.bias) + update * self.scaling

    @torch.no_grad()
    def merged_weight(self) -> Tensor:
        """W + (alpha / r) B A, in W's dtype (computed in fp32)."""
        delta = (self.lora_B.float() @ self.lora_A.float()) * self.scaling
        return (self.weight.float() + delta).to(self.weight.dtype)


def apply_lora(model: nn.Module, spec: LoraSpec) -> list[str]:
    """Wrap every nn.Linear whose attribute name is in `spec.targets`; returns the new parameter names.
    A target that names no layer is a ValueError (a typo must not silently train nothing)."""
    found: set[str] = set()
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if child_name in spec.targets and type(child) is nn.Linear:
                setattr(module, child_name, LoRALinear(child, spec))
                found.add(child_name)
    missing = [t for t in spec.targets if t not in found]
    if missing:
        raise ValueError(f"LoRA target {missing[0]!r} names no linear layer of the model")
    return [name for name, _ in model.named_parameters() if name.endswith((".lora_A", ".lora_B"))]


def merge_lora(model: nn.Module) -> None:
    """Replace every LoRALinear by a plain nn.Linear holding W + (alpha / r) B A."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                plain = nn.Linear(child.in_features, child.out_features, bias=False, device="meta")
                plain.weight = nn.Parameter(child.merged_weight(), requires_grad=child.weight.requires_grad)
                plain.bias = child.bias
                setattr(module, child_name, plain)
