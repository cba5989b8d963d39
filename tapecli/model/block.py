"""The block around attention and the MLP as data (`model.block`): where its norms sit, what they and the MLP compute,
and the scales around the stack.

    layout = BlockLayout.of(config.block)    # ValueError naming the key for an unknown key or value
    layout.norm_names                         # {slot: module name}: the norms this layout has, by Hugging Face name

Keys (each default is the Llama block, what every model was before the key existed, so `block: {}` is Llama's):

    norms                  pre       x += attn(norm(x)); x += mlp(norm(x))     (Llama, Mistral, Qwen, SmolLM3)
                           post      x += norm(attn(x)); x += norm(mlp(x))     (OLMo 2: no norm before either)
                           sandwich  x += norm(attn(norm(x))); x += norm(mlp(norm(x)))                   (Gemma 3)
                           parallel  h = norm(x); x += attn(h) + mlp(h): one norm, both branches on it  (Cohere2)
    norm                   rms       RMSNorm: x / rms(x) * weight
                           layernorm LayerNorm without a bias: (x - mean) / std * weight (Cohere)
    qk_norm                head      model.qk_norm: one RMSNorm over each head's head_dim, shared by the heads (Qwen3)
                           projection  model.qk_norm: one RMSNorm over the whole q (and k) projection (OLMo 2)
    norm_weight            w         every RMSNorm (block, final, q/k) multiplies by its weight, initialised to 1
                           1+w       ... by (1 + weight), the weight initialised to 0 (Gemma's stored form)
    activation             silu      the gated MLP: down(act(gate(x)) * up(x)) with SiLU (SwiGLU)
                           gelu_tanh ... with the tanh approximation of GeLU (GeGLU; Gemma's gelu_pytorch_tanh)
    embed_scale            false     true: the embeddings are multiplied by sqrt(model.dim) (Gemma)
    query_pre_attn_scalar  null      a number s: attention logits are q.k / sqrt(s) instead of q.k / sqrt(head_dim)
                                     (Gemma 3; done as a temperature sqrt(s / head_dim) on top of the layer's own)
    logit_scale            1.0       the output logits are multiplied by it (Cohere's logit_scale)

The norm slots are `attn_in`, `attn_out`, `mlp_in`, `mlp_out`; each layout names its norms as transformers' classes
do (Llama's `post_attention_layernorm` is the norm before the MLP, OLMo 2's and Gemma 3's the norm of the attention's
output), so checkpoints load and export without renaming.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

NORMS = {
    "pre": {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"},
    "post": {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"},
    "sandwich": {"attn_in": "input_layernorm", "attn_out": "post_attention_layernorm",
                 "mlp_in": "pre_feedforward_layernorm", "mlp_out": "post_feedforward_layernorm"},
    "parallel": {"attn_in": "input_layernorm"},  # the MLP reads the same normed input
}
CHOICES = {"norms": tuple(NORMS), "qk_norm": ("head", "projection"), "norm": ("rms", "layernorm"),
           "norm_weight": ("w", "1+w"),
           "activation": ("silu", "gelu_tanh")}


@dataclass(frozen=True)
class BlockLayout:
    norms: str = "pre"
    qk_norm: str = "head"
    norm: str = "rms"
    norm_weight: str = "w"
    activation: str = "silu"
    embed_scale: bool = False
    query_pre_attn_scalar: float | None = None
    logit_scale: float = 1.0

    @classmethod
    def of(cls, block: dict[str, Any]) -> BlockLayout:
        """The layout `model.block` describes; ValueError naming the first unknown key or value."""
        keys = [f.name for f in fields(cls)]
        if not isinstance(block, dict):
            raise ValueError(f"model.block: expected a mapping of {', '.join(keys)}, got {block!r}")
        for key, value in block.items():
            if key not in keys:
                raise ValueError(f"model.block.{key}: unknown key; allowed: {', '.join(keys)}")
            if key in CHOICES and value not in CHOICES[key]:
                raise ValueError(f"model.block.{key}: {value!r} is not one of {', '.join(CHOICES[key])}")
        if not isinstance(block.get("embed_scale", False), bool):
            raise ValueError(f"model.block.embed_scale: expected true or false, got {block['embed_scale']!r}")
        scalar = block.get("query_pre_attn_scalar")
        if scalar is not None and (isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0):
            raise ValueError(f"model.block.query_pre_attn_scalar: expected a positive number or null, got {scalar!r}")
        scale = block.get("logit_scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ValueError(f"model.block.logit_scale: expected a positive number, got {scale!r}")
        return cls(**block)

    @property
    def norm_names(self) -> dict[str, str]:
        return NORMS[self.norms]

    def temperature(self, head_dim: int) -> float:
        """The factor on each layer's attention temperature that makes its logits q.k / sqrt(query_pre_attn_scalar)."""
        return 1.0 if self.query_pre_attn_scalar is None else math.sqrt(self.query_pre_attn_scalar / head_dim)
