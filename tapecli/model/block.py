"""The block around attention and the MLP as data (`model.block`): where its norms sit, and what the q/k norm spans.

    layout = BlockLayout.of(config.block)    # ValueError naming the key for an unknown key or value
    layout.norm_names                         # {slot: module name}: the norms this layout has, by Hugging Face name

Keys (each default is the Llama block, what every model was before the key existed, so `block: {}` is Llama's):

    norms     pre       x += attn(norm(x)); x += mlp(norm(x))                  (Llama, Mistral, Qwen, SmolLM3)
              post      x += norm(attn(x)); x += norm(mlp(x)); no norm before  (OLMo 2)
    qk_norm   head      model.qk_norm: one RMSNorm over each head's head_dim, shared by the heads (Qwen3)
              projection  model.qk_norm: one RMSNorm over the whole q (and k) projection, all heads at once (OLMo 2)

The slots are `attn_in`, `attn_out`, `mlp_in`, `mlp_out`; each layout names its norms as transformers' classes do
(Llama's `post_attention_layernorm` is the norm before the MLP, OLMo 2's the norm of the attention's output), so
checkpoints load and export without renaming.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NORMS = {
    "pre": {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"},
    "post": {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"},
}
QK_NORMS = ("head", "projection")


@dataclass(frozen=True)
class BlockLayout:
    norms: str = "pre"
    qk_norm: str = "head"

    @classmethod
    def of(cls, block: dict[str, Any]) -> BlockLayout:
        """The layout `model.block` describes; ValueError naming the first unknown key or value."""
        if not isinstance(block, dict):
            raise ValueError(f"model.block: expected a mapping of {', '.join(('norms', 'qk_norm'))}, got {block!r}")
        for key in block:
            if key not in ("norms", "qk_norm"):
                raise ValueError(f"model.block.{key}: unknown key; allowed: norms, qk_norm")
        layout = cls(**block)
        if layout.norms not in NORMS:
            raise ValueError(f"model.block.norms: {layout.norms!r} is not one of {', '.join(NORMS)}")
        if layout.qk_norm not in QK_NORMS:
            raise ValueError(f"model.block.qk_norm: {layout.qk_norm!r} is not one of {', '.join(QK_NORMS)}")
        return layout

    @property
    def norm_names(self) -> dict[str, str]:
        return NORMS[self.norms]
