"""Fused projections: classes that store several of tape's (Llama's) linear weights as one tensor, split on import
and joined again on export.

    FUSED["Phi3ForCausalLM"]                    {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), ...}
    tensors = split_fused(tensors, arch, config)   (name, tensor, file) triples with each fused weight split
    state = join_fused(state, arch)                a state dict with each group of weights joined (the inverse)

Phi-3's `qkv_proj` is [q; k; v] stacked along the output rows (n_heads * head_dim, then n_kv_heads * head_dim
twice) and its `gate_up_proj` [gate; up] (ffn_dim each): transformers' Phi3Attention and Phi3MLP slice them in that
order, so the split weights compute exactly what the fused ones do.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

# class -> {fused weight (under model.layers.N.): the tape weights it stacks, in row order}
FUSED = {"Phi3ForCausalLM": {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
                             "mlp.gate_up_proj": ("gate_proj", "up_proj")}}


def _rows(config, part: str) -> int:
    return {"q_proj": config.n_heads * config.head_dim, "k_proj": config.n_kv_heads * config.head_dim,
            "v_proj": config.n_kv_heads * config.head_dim, "gate_proj": config.ffn_dim, "up_proj": config.ffn_dim}[part]


def split_fused(tensors: Iterable[tuple[str, Any, Any]], arch: str, config) -> Iterator[tuple[str, Any, Any]]:
    """Each fused weight of `arch` as the weights it stacks (sized by `config`); others pass unchanged. A fused
    weight of another number of rows is a TapeError naming its file."""
    from tapecli.errors import TapeError

    groups = FUSED.get(arch, {})
    for name, tensor, file in tensors:
        fused = next((key for key in groups if name.endswith(f".{key}.weight")), None)
        if fused is None:
            yield name, tensor, file
            continue
        sizes = [_rows(config, part) for part in groups[fused]]
        if tensor.dim() != 2 or tensor.shape[0] != sum(sizes):
            raise TapeError(f"{file}: {name} has shape {tuple(tensor.shape)}, config.json implies {sum(sizes)} rows "
                            f"({' + '.join(map(str, sizes))}: {', '.join(groups[fused])})")
        prefix = name.removesuffix(f"{fused.split('.')[-1]}.weight")
        for part, piece in zip(groups[fused], tensor.split(sizes), strict=True):
            yield f"{prefix}{part}.weight", piece, file


def join_fused(state: dict[str, Any], arch: str) -> dict[str, Any]:
    """The state dict with each group of weights `arch` fuses replaced by the fused weight (rows stacked in order)."""
    import torch

    groups = FUSED.get(arch, {})
    out = dict(state)
    for name in state:
        for fused, parts in groups.items():
            module = fused.split(".")[0]
            if name.endswith(f".{module}.{parts[0]}.weight"):
                prefix = name.removesuffix(f"{parts[0]}.weight")
                out[f"{prefix}{fused.split('.')[-1]}.weight"] = torch.cat([out.pop(f"{prefix}{p}.weight")
                                                                          for p in parts])
    return out
