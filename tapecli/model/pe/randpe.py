"""Randomized RoPE positions (Ruoss et al. 2023): during training every sequence uses a sorted random subset of
[0, max_range) as its positions, so the model sees large relative distances on short inputs. Evaluation uses the
ordinary positions 0..T-1.

pe_args (plus every RoPE argument):
  max_range   size of the position range to sample from (default 2 * model.max_seq_len)
  per_layer   false: one draw per sequence shared by all layers (the method);
              true: every layer draws its own positions, as the official TAPE code does (training only here).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tapecli.model.pe.base import PositionState
from tapecli.model.pe.rope import RoPE, RotaryLayer


def sample_sorted_positions(batch: int, seq_len: int, max_range: int, device: torch.device) -> Tensor:
    """[batch, seq_len] sorted draws without replacement from [0, max_range), one draw per sequence."""
    if seq_len > max_range:
        raise ValueError(f"model.pe_args.max_range: {max_range} is smaller than the sequence length {seq_len}")
    scores = torch.rand(batch, max_range, device=device)
    return scores.topk(seq_len, dim=-1).indices.sort(dim=-1).values


class PerLayerRandomRotary(RotaryLayer):
    """The official code's variant: each layer re-draws positions while training."""

    def __init__(self, pe: RandPE) -> None:
        super().__init__()
        self._pe = [pe]  # a list, so the shared model-level module is not registered twice

    def rotate(self, q: Tensor, k: Tensor, state: PositionState) -> tuple[Tensor, Tensor]:
        if self.training:
            pe = self._pe[0]
            positions = sample_sorted_positions(q.shape[0], q.shape[2], pe.max_range, q.device)
            state = state.replace(rotary=pe.rotary(positions, state.rotary.dtype))
        return super().rotate(q, k, state)


class RandPE(RoPE):
    def __init__(self, config, *, max_range: int | None = None, per_layer: bool = False, **rope_args) -> None:
        super().__init__(config, **rope_args)
        self.max_range = max_range or 2 * config.max_seq_len
        self.per_layer = per_layer

    def positions(self, batch: int, seq_len: int, start_pos: int | Tensor, device: torch.device,
                  attention_mask: Tensor | None = None) -> Tensor:
        if self.training and not self.per_layer:
            return sample_sorted_positions(batch, seq_len, self.max_range, device)
        return super().positions(batch, seq_len, start_pos, device, attention_mask)

    def make_layer(self, layer_idx: int) -> RotaryLayer:
        return PerLayerRandomRotary(self) if self.per_layer else RotaryLayer()
