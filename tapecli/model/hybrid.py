"""Several PEs in one model: the model-level PE of a model whose layers do not all share one (pe, pe_args).

    pe = model_pe(config, specs)        # the PositionalEncoding itself when every layer shares one, else a HybridPE
    state = pe.initial_state(positions, dtype)      # a PositionState, or a HybridState holding one per PE

Layers with equal (pe, pe_args) form a group and share one model-level PE (`tapecli.model.pe.build_pe`), so a
Gemma-3-like model (local RoPE theta 1e4, global RoPE theta 1e6) has two groups, each with its own rotary table,
and an iRoPE-like one (RoPE x3 + NoPE) has two. Every group sees the same positions: the model's (start_pos + the
count of real tokens), which is why a PE that draws its own (RandPE while training) cannot share a model
(tapecli.model.schedule refuses it). A model whose layers all share one PE has no HybridPE at all: its model-level
PE is that PE, exactly as before schedules existed.

What the positional state means when PEs share a model:
- Stateless PEs (NoPE, RoPE, xPos, ALiBi, T5, FIRE) build their state from the positions alone; layers of other
  PEs in between change nothing for them.
- A stateful PE (TAPE) carries its state E through ITS layers only: E enters the group's first layer as RoPE's
  rotary state, each TAPE layer updates it after attention and after the MLP, and the layers of other PEs pass it
  on unchanged (they neither read nor write it), so a TAPE layer after a NoPE layer sees what the previous TAPE
  layer left. The group's last layer's updates feed nothing and are skipped (their weights frozen, kept), as the
  last layer's are in an all-TAPE model. The hidden state, which every layer shares, is how the other layers'
  work reaches TAPE's updates (its content gates read it).
- Contextual PEs (CoPE, PaTH) compute positions inside their own layer from that layer's queries and keys; nothing
  of theirs crosses layers, so they mix with any other PE freely. Their KV cache holds what their layer needs
  (PaTH's transformed keys), per layer as always.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tapecli.model.pe import LayerPE, PositionalEncoding, PositionState, build_pe
from tapecli.model.pe.base import default_positions
from tapecli.model.schedule import LayerSpec


@dataclass
class HybridState:
    """The positional state of a hybrid model: the token positions and one PositionState per group."""

    positions: Tensor
    parts: tuple[PositionState, ...]

    def with_part(self, group: int, state: PositionState) -> HybridState:
        return HybridState(self.positions, self.parts[:group] + (state,) + self.parts[group + 1:])

    def slice(self, start: int, end: int) -> HybridState:
        """The state of tokens start..end-1 (a chunk of a prompt prefilled in pieces)."""
        return HybridState(self.positions[..., start:end], tuple(p.slice(start, end) for p in self.parts))


class HybridPE(nn.Module):
    """The model-level PE of a model with several groups (module docstring); the same interface as a
    PositionalEncoding, its state a HybridState."""

    carries_state = False  # each group's PE says for itself (`groups`)
    aggregation = None

    def __init__(self, config, specs: list[LayerSpec]) -> None:
        super().__init__()
        keys: dict[tuple, int] = {}
        self.group_of: list[int] = []
        groups = []
        for spec in specs:
            if spec.pe_key not in keys:
                keys[spec.pe_key] = len(groups)
                groups.append(build_pe(config, spec.pe, spec.pe_args))
            self.group_of.append(keys[spec.pe_key])
        self.groups = nn.ModuleList(groups)

    def positions(self, batch: int, seq_len: int, start_pos: int | Tensor, device: torch.device,
                  attention_mask: Tensor | None = None) -> Tensor:
        return default_positions(batch, seq_len, start_pos, device, attention_mask)

    def cache_key(self, positions: Tensor) -> object:
        keys = tuple(pe.cache_key(positions) for pe in self.groups)
        return None if all(key is None for key in keys) else keys

    def initial_state(self, positions: Tensor, dtype: torch.dtype) -> HybridState:
        return HybridState(positions, tuple(pe.initial_state(positions, dtype) for pe in self.groups))

    def make_layer(self, layer_idx: int) -> LayerPE:
        return self.groups[self.group_of[layer_idx]].make_layer(layer_idx)


def model_pe(config, specs: list[LayerSpec]) -> PositionalEncoding | HybridPE:
    """The model-level PE: the one PE every layer shares, or a HybridPE over the groups."""
    if len({spec.pe_key for spec in specs}) == 1:
        return build_pe(config, specs[0].pe, specs[0].pe_args)
    return HybridPE(config, specs)


def layer_groups(pe: PositionalEncoding | HybridPE, n_layers: int) -> list[tuple[int | None, PositionalEncoding]]:
    """(group index or None for a single-PE model, the group's PE) of every layer."""
    if isinstance(pe, HybridPE):
        return [(g, pe.groups[g]) for g in pe.group_of]
    return [(None, pe)] * n_layers
