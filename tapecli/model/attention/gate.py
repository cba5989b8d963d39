"""Gated attention output (`model.output_gate`): a head-specific sigmoid gate on each head's attention output.

    gate = output_gate(config)          # None for "none", else an OutputGate (parameters: self_attn.output_gate.*)
    y = gate(y, x)                      # y [B, H, T, d] attention's output, x [B, T, dim] the layer's normed input

Qiu et al., NeurIPS 2025, "Gated Attention for Large Language Models: Non-linearity, Sparsity, and
Attention-Sink-Free" (arXiv 2505.06708; official code github.com/qiuzh20/gated_attention, the Qwen3 attention with
`headwise_attn_output_gate` / `elementwise_attn_output_gate`). The paper's best variant (G1): after scaled
dot-product attention and before the output projection, each head's output is multiplied by a gate computed from
the same normalised hidden state that the queries come from,

    Y'_h = Y_h * sigmoid(X W_h)      elementwise: W_h is [dim, d] (one gate per head and channel)
                                     headwise:    W_h is [dim, 1] (one gate per head)

The official code widens q_proj by the gate's columns; here the gate is its own projection `proj` (dim -> H * d or
H, no bias, as the official Qwen3 with attention_bias false), the same map under its own name, initialised like
every linear (N(0, init_std), so every gate starts near 1/2). It acts on attention's output only, so it combines
with every PE and every attention path unchanged (PEs that compute attention themselves included). Without it
(`none`, the default) there is no parameter: the names and shapes of every earlier model's weights stay as they
were.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

GATES = ("none", "elementwise", "headwise")


def check_output_gate(value: object) -> None:
    """One line naming model.output_gate for a value that is none of GATES."""
    if value not in GATES:
        raise ValueError(f"model.output_gate: unknown gate {value!r}; allowed: {', '.join(GATES)}")


class OutputGate(nn.Module):
    def __init__(self, dim: int, n_heads: int, head_dim: int, kind: str) -> None:
        super().__init__()
        self.n_heads, self.width = n_heads, head_dim if kind == "elementwise" else 1
        self.proj = nn.Linear(dim, n_heads * self.width, bias=False)

    def forward(self, y: Tensor, x: Tensor) -> Tensor:
        """y [B, H, T, d] times sigmoid(x W) [B, H, T, d or 1], in y's dtype."""
        B, T, _ = x.shape
        gate = self.proj(x).view(B, T, self.n_heads, self.width).transpose(1, 2)
        return y * torch.sigmoid(gate).to(y.dtype)


def output_gate(config) -> OutputGate | None:
    """The gate of one attention layer for `config.output_gate`, None without one."""
    if config.output_gate == "none":
        return None
    return OutputGate(config.dim, config.n_heads, config.head_dim, config.output_gate)
