"""TAPE's picture: how far each layer moves the positional state away from RoPE's, along the sequence.

TAPE's state E holds, per head and rotary pair, a 2x2 block [[c, -s], [s, c]] (`tapecli.model.pe.tape`): RoPE's
rotation by the angle position x frequency at the start, then updated by every layer but the last from the content.
Writing each pair as a length r and an angle phi, the picture compares the state after layer k with the state the
first layer received (RoPE's), per head, averaged over pairs and sequences, at each position (binned as the length
position + 1):

  norm ratio      r_k / r_0: 1 keeps RoPE's scale; the state is no unit rotation any more where it is not
  angle drift     |phi_k - phi_0| wrapped to [0, pi] (radians): 0 is RoPE's angle; pi/2 is what an angle unrelated
                  to RoPE's would drift on average
"""

from __future__ import annotations

from typing import Any

import torch

from tapecli.experiments.analyze.pictures.base import Picture
from tapecli.experiments.analyze.stats import log2_bin


def carrying(model: Any) -> list[int]:
    """The blocks that update the state (every one but the last)."""
    return [k for k, block in enumerate(model.model.layers) if block.carries_state]


class TAPEPicture(Picture):
    pe = "tape"
    title = "TAPE: positional state vs RoPE's, per position"
    x_kind = "length"
    x_label = "position + 1"
    curves = {"norm_ratio": "norm ratio r / r_0", "angle_drift": "angle drift |phi - phi_0| (rad)"}

    @classmethod
    def layer_count(cls, model: Any) -> int:
        return len(carrying(model))

    @classmethod
    def layer_names(cls, model: Any) -> list[str]:
        return [f"after layer {k}" for k in carrying(model)]

    def attach(self, model: Any) -> list[Any]:
        self.start = None
        blocks = model.model.layers

        def first(module, args):
            self.start = args[1].rotary

        handles = [blocks[0].register_forward_pre_hook(first)]
        for row, k in enumerate(carrying(model)):
            handles.append(blocks[k].register_forward_hook(
                lambda module, args, output, row=row: self.add(row, output[1].rotary)))
        return handles

    def add(self, row: int, state: Any) -> None:
        """The state [B, M, T, d] after a layer, against the one layer 0 received."""
        half = state.shape[-1] // 2
        c, s = state[..., :half].double(), state[..., half:].double()
        c0, s0 = (t.double().expand_as(c) for t in (self.start[..., :half], self.start[..., half:]))
        r, r0 = torch.hypot(c, s), torch.hypot(c0, s0)
        drift = torch.atan2(s * c0 - c * s0, c * c0 + s * s0).abs()  # the angle between the two, in [0, pi]
        T = state.shape[2]
        bins = log2_bin(torch.arange(1, T + 1)) - 1
        self.binned.add("norm_ratio", row, bins, (r / r0).mean((0, 3)))
        self.binned.add("angle_drift", row, bins, drift.mean((0, 3)))


