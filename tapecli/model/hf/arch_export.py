"""Which Hugging Face class runs a tape model, and its config.json keys: the inverse of arch.py's reading, from the
same tables (arch.py's docstring says what each class's modeling code does).

    arch, keys = export_layout(config)        # the class that runs `config` and its config.json layer keys
    block_architecture(config)                # the class whose block is `model.block` (None: Llama's)

A model no supported class runs exactly is a TapeError naming why (the key and the fix: keep the native checkpoint).
"""

from __future__ import annotations

import json
from typing import Any

from tapecli.errors import TapeError
from tapecli.model.block import BlockLayout
from tapecli.model.hf.arch import BLOCKS, FULL, PER_TYPE_ROPE, SLIDING


def export_layout(config) -> tuple[str, dict[str, Any]]:
    """(the class that runs a ModelConfig in transformers, the config.json keys for its layers and attention).

    The class: the one whose block `model.block` is (OLMo 2's block: Olmo2 without windows or per-layer-type RoPE,
    else Olmo3); Qwen3 with QK-norm, Qwen2 with q/k/v biases, SmolLM3 with NoPE layers or windows in some layers
    only, Mistral with one window in every layer, else Llama. A model no class runs exactly is a TapeError naming
    why."""
    if config.output_gate != "none":
        raise TapeError(f"model.output_gate: {config.output_gate!r} gates attention's output, which no supported "
                        "Hugging Face architecture does; keep the native checkpoint, which every `tape eval` opens")
    specs = config.layers()
    if any(spec.sinks for spec in specs):
        raise TapeError("model.sinks: the only Hugging Face architecture with attention sinks, GptOssForCausalLM, "
                        "needs a mixture-of-experts MLP, which tape's block does not have; keep the native "
                        "checkpoint, which every `tape eval` opens")
    for spec in specs:
        if spec.pe not in ("rope", "nope"):
            raise TapeError(f"pe {spec.pe!r} has no Hugging Face Llama equivalent (rope and nope layers export); "
                            "keep the native checkpoint, which every `tape eval` opens")
        if spec.temperature != 1.0 or spec.length_scale != "none":
            key = "temperature" if spec.temperature != 1.0 else "length_scale"
            raise TapeError(f"model.{key}: attention temperatures and length scales do not export to Hugging Face "
                            "(no supported architecture has them); keep the native checkpoint, which every "
                            "`tape eval` opens")
    block = block_architecture(config)
    phi = _phi3_keys(config, specs, block)
    if phi is not None:
        return "Phi3ForCausalLM", phi
    per_type = block in PER_TYPE_ROPE  # its rope_parameters hold one entry per layer type
    if len({(s.window is not None and per_type, json.dumps(s.pe_args, sort_keys=True))
            for s in specs if s.pe == "rope"}) > 1 + per_type:
        raise TapeError("model.schedule: RoPE layers with different pe_args (e.g. local and global theta) do not "
                        "export to a supported Hugging Face architecture; keep the native checkpoint")
    sizes = {s.window for s in specs if s.window is not None}
    if len(sizes) > 1:
        raise TapeError(f"model.schedule: windows of {len(sizes)} sizes ({', '.join(map(str, sorted(sizes)))}); a "
                        "Hugging Face config has one sliding_window; keep the native checkpoint")
    rope = [s.pe == "rope" for s in specs]
    window = next(iter(sizes), None)
    types = [SLIDING if s.window is not None else FULL for s in specs]
    nope, some = not all(rope), SLIDING in types and FULL in types
    if block == "Gemma3ForCausalLM":
        if not config.qk_norm or config.qkv_bias or nope:
            raise TapeError(f"model.block {config.block}: {block} runs it with QK-norm, without q/k/v biases or "
                            "NoPE layers only; keep the native checkpoint")
        return block, {"layer_types": types, "sliding_window": window, "attention_bias": False,
                       "hidden_activation": "gelu_pytorch_tanh", "use_bidirectional_attention": False,
                       "query_pre_attn_scalar": BlockLayout.of(config.block).query_pre_attn_scalar}
    if block == "Olmo3ForCausalLM":
        if not config.qk_norm or config.qkv_bias or nope:
            raise TapeError(f"model.block {config.block}: {block} runs it with QK-norm, without q/k/v biases or "
                            "NoPE layers only; keep the native checkpoint")
        return block, {"layer_types": types, "sliding_window": window, "attention_bias": False}
    if block == "Exaone4ForCausalLM":
        expected = [True] * len(specs) if window is None else [t == SLIDING for t in types]
        if not config.qk_norm or config.qkv_bias or rope != expected:
            raise TapeError(f"model.block {config.block}: {block} runs it with QK-norm and RoPE in every layer, or "
                            "with a window RoPE in the windowed layers and NoPE in the others, without q/k/v biases "
                            "only; keep the native checkpoint")
        return block, {"layer_types": types, "sliding_window": window}
    if block == "Cohere2ForCausalLM":
        if config.qk_norm or config.qkv_bias or any(r != (t == SLIDING) for r, t in zip(rope, types, strict=True)):
            raise TapeError(f"model.block {config.block}: {block} runs it with RoPE in the sliding layers and NoPE "
                            "in the full ones, without QK-norm or q/k/v biases only; keep the native checkpoint")
        return block, {"layer_types": types, "sliding_window": window, "attention_bias": False,
                       "logit_scale": BlockLayout.of(config.block).logit_scale, "layer_norm_eps": config.norm_eps}
    if block is not None:
        if not config.qk_norm or config.qkv_bias or nope or window is not None:
            raise TapeError(f"model.block {config.block}: {block} runs it with QK-norm, without q/k/v biases, NoPE "
                            "layers or windows only; keep the native checkpoint")
        return block, {"attention_bias": False}
    if (config.qk_norm or config.qkv_bias) and nope:
        raise TapeError("model.schedule: NoPE layers with qk_norm or qkv_bias export to no supported Hugging Face "
                        "architecture (Qwen2/Qwen3 have no NoPE layers); keep the native checkpoint")
    if config.qk_norm and config.qkv_bias:
        raise TapeError("model.qk_norm with model.qkv_bias exports to no supported Hugging Face architecture; keep "
                        "the native checkpoint")
    qwen = {"use_sliding_window": window is not None, "sliding_window": window, "layer_types": types,
            "max_window_layers": types.index(SLIDING) if window is not None else config.n_layers}
    if config.qk_norm:
        return "Qwen3ForCausalLM", {**qwen, "attention_bias": False}
    if config.qkv_bias:
        return "Qwen2ForCausalLM", qwen
    if nope or some:
        return "SmolLM3ForCausalLM", {"no_rope_layers": [int(r) for r in rope], "layer_types": types,
                                      "use_sliding_window": window is not None, "sliding_window": window,
                                      "attention_bias": False, "mlp_bias": False}
    if window is not None:
        return "MistralForCausalLM", {"sliding_window": window}
    return "LlamaForCausalLM", {"attention_bias": False, "mlp_bias": False}


def _phi3_keys(config, specs, block: str | None) -> dict[str, Any] | None:
    """Phi3's config.json keys when the model's RoPE needs Phi3 (LongRoPE or a partial rotary: no other supported
    class runs them), None when it does not; a TapeError when it does but the rest of the model is no Phi-3."""
    args = [s.pe_args for s in specs if s.pe == "rope"]
    longrope = any(a.get("scaling") == "longrope" for a in args)
    if not longrope and all(a.get("partial_rotary_factor", 1.0) == 1.0 for a in args):
        return None
    what = "scaling longrope" if longrope else "partial_rotary_factor"
    windows = {s.window for s in specs}
    if (block is not None or config.qk_norm or config.qkv_bias or len(windows) > 1
            or any(s.pe != "rope" for s in specs) or len({json.dumps(a, sort_keys=True) for a in args}) > 1):
        raise TapeError(f"model.pe_args: {what} exports only as a Phi3 (Llama's block, every layer alike with RoPE, "
                        "one window or none, no QK-norm or q/k/v biases); keep the native checkpoint")
    if args[0].get("scaling", "none") not in ("none", "longrope"):
        raise TapeError(f"model.pe_args.scaling: {args[0]['scaling']!r} with partial_rotary_factor exports to no "
                        "supported class (transformers' Phi3 runs default or longrope RoPE); keep the native "
                        "checkpoint")
    original = args[0].get("original_max_len") or config.max_seq_len
    return {"sliding_window": windows.pop(), "original_max_position_embeddings": original}


def block_architecture(config) -> str | None:
    """The class whose block is `model.block` (None for Llama's block; OLMo 2's block is Olmo3 with windows or a
    RoPE per layer type), or a TapeError when no class has it."""
    arch = _block_class(config)
    specs = config.layers()
    if arch == "Olmo2ForCausalLM" and (any(s.window is not None for s in specs) or len(
            {json.dumps(s.pe_args, sort_keys=True) for s in specs if s.pe == "rope"}) > 1):
        return "Olmo3ForCausalLM"
    return arch


def _block_class(config) -> str | None:
    layout = BlockLayout.of(config.block)
    if layout == BlockLayout():
        return None
    for arch, block in BLOCKS.items():
        own = {"query_pre_attn_scalar": layout.query_pre_attn_scalar} if arch == "Gemma3ForCausalLM" else {}
        own = {"logit_scale": layout.logit_scale} if arch == "Cohere2ForCausalLM" else own
        if layout == BlockLayout.of({**block, **own}):
            return arch
    raise TapeError(f"model.block {config.block} is the block of no supported Hugging Face architecture; keep the "
                    "native checkpoint, which every `tape eval` opens")
