"""The Hugging Face architectures tape imports and exports, and what each one's config.json says about its layers.

    arch = architecture(hf, where)            # the class config.json names (TapeError naming the key if unsupported)
    layout = read_layout(hf, arch, where)     # Layout: per layer RoPE or not and its window; q/k/v biases, QK-norm
    keys = layout.model_keys(rope_args)       # ModelConfig keys: pe, pe_args, window, schedule, qk_norm, qkv_bias

The inverse, which class runs a ModelConfig (`export_layout`), is arch_export.py, reading the same tables.

What transformers 5's modeling code does with the keys transformers itself writes, per class:

    LlamaForCausalLM    RoPE in every layer, every layer global
    MistralForCausalLM  `sliding_window` (null: global) in every layer
    Qwen2ForCausalLM    biases on q, k, v (`model.qkv_bias`); `layer_types` says which layers slide (without it:
                        layers >= `max_window_layers` when `use_sliding_window`)
    Qwen3ForCausalLM    per-head RMSNorm of q and k before RoPE (`model.qk_norm`); layers as Qwen2
    SmolLM3ForCausalLM  `no_rope_layers` (1 RoPE, 0 NoPE; without it: NoPE every `no_rope_layer_interval`-th layer)
                        and `layer_types` (without it: the NoPE layers slide when `use_sliding_window`)
    Olmo2ForCausalLM    RoPE in every layer, every layer global; RMSNorm of the attention's and the MLP's outputs
                        inside the residual, none before them (`model.block.norms: post`); RMSNorm of the whole q and
                        k projections before RoPE (`model.qk_norm` with `model.block.qk_norm: projection`)
    Olmo3ForCausalLM    OLMo 2's block; `layer_types` (sliding layers: `sliding_window`) and `rope_parameters` per
                        layer type, as Gemma 3
    Gemma3ForCausalLM   `layer_types` (sliding layers: `sliding_window`); `rope_parameters` per layer type (local
                        RoPE for sliding layers, global for full ones); per-head QK-norm; norms before and after
                        attention and the MLP (`sandwich`), stored as (1 + w); embeddings times sqrt(hidden_size);
                        logits q.k / sqrt(`query_pre_attn_scalar`); GeLU-tanh MLP (`hidden_activation`)
    Exaone4ForCausalLM  OLMo 2's post-norms with per-head QK-norm (`model.block.norms: post`); `layer_types`: with a
                        `sliding_window`, sliding layers RoPE in their window and full layers NoPE, without one RoPE
                        in every layer
    Cohere2ForCausalLM  `layer_types`: sliding layers RoPE in their window, full layers NoPE; attention and the MLP
                        in parallel on one LayerNorm without bias (`layer_norm_eps`); logits times `logit_scale`;
                        RoPE on interleaved pairs (2i, 2i+1), which tape's half layout (i, i + d/2) computes exactly
                        once the rows of q_proj and k_proj are permuted (`interleaved_rows`, on import and export)
    Phi3ForCausalLM     Llama's block with fused `qkv_proj` and `gate_up_proj` weights (split on import, joined on
                        export: tapecli.model.hf.fused); `sliding_window` (null: global) in every layer, as Mistral;
                        `partial_rotary_factor` (Phi-4-mini: 0.75) and LongRoPE (`rope_type: longrope`). A model
                        with LongRoPE or a partial rotary exports as Phi3 (a Phi-3 without either as Llama/Mistral)

A sliding layer sees `sliding_window` keys, itself included (transformers' mask: key > query - sliding_window), which
is what tape's `window` counts. Layers that are all alike become model-level keys (`window: 4096`); otherwise a
`model.schedule` with one name per layer (`layers`, as layer_types): `global` and `local` (in a window) take the
model's PE (RoPE, or TAPE once `extend-context --method tape` grows it), `nope` and `nope_local` have none.
Anything the modeling code would run differently from this table (a layer_types naming sliding layers without a
window; Mistral's layer_types, which its modeling code ignores; biases or activations other than the
above) is refused in one line naming the key, as is every other architecture.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from tapecli.errors import TapeError

MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
               "olmo2": "Olmo2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
               "cohere2": "Cohere2ForCausalLM", "olmo3": "Olmo3ForCausalLM",
               "exaone4": "Exaone4ForCausalLM", "phi3": "Phi3ForCausalLM"}  # what transformers loads them as
ARCHITECTURES = tuple(MODEL_TYPES.values())
SLIDING, FULL = "sliding_attention", "full_attention"
_QWEN = ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
# Biases the architecture's modeling code would add for a true value: refused, tape has none of these.
_BIAS_KEYS = {"LlamaForCausalLM": ("attention_bias", "mlp_bias"), "MistralForCausalLM": (),
              "Qwen2ForCausalLM": (), "Qwen3ForCausalLM": ("attention_bias",),
              "SmolLM3ForCausalLM": ("attention_bias", "mlp_bias"), "Olmo2ForCausalLM": ("attention_bias",),
              "Gemma3ForCausalLM": ("attention_bias", "use_bidirectional_attention"),
              "Cohere2ForCausalLM": ("attention_bias",), "Olmo3ForCausalLM": ("attention_bias",),
              "Exaone4ForCausalLM": (), "Phi3ForCausalLM": ()}
# Classes whose `rope_parameters` hold one entry per layer type (full_attention, sliding_attention).
PER_TYPE_ROPE = ("Gemma3ForCausalLM", "Olmo3ForCausalLM")
# Classes whose RoPE rotates interleaved pairs (2i, 2i+1) of each head instead of (i, i + d/2).
INTERLEAVED_ROPE = ("Cohere2ForCausalLM",)
# The block of each architecture (tapecli.model.block), where it is not Llama's.
BLOCKS = {"Olmo2ForCausalLM": {"norms": "post", "qk_norm": "projection"},
          "Olmo3ForCausalLM": {"norms": "post", "qk_norm": "projection"},
          "Gemma3ForCausalLM": {"norms": "sandwich", "norm_weight": "1+w", "activation": "gelu_tanh",
                                "embed_scale": True},  # and query_pre_attn_scalar, from config.json
          "Cohere2ForCausalLM": {"norms": "parallel", "norm": "layernorm"},  # and logit_scale
          "Exaone4ForCausalLM": {"norms": "post"}}
# Architectures tape does not import, and the supported one nearest to each (what their refusal names).
NEAREST = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM (the text model alone); Gemma 3's multimodal checkpoints "
                                      "are not mapped",
    "Gemma3nForCausalLM": "Gemma3ForCausalLM; Gemma 3n's per-layer embeddings and AltUp are not mapped",
    "Gemma3nForConditionalGeneration": "Gemma3ForCausalLM; Gemma 3n is not mapped",
    "OlmoForCausalLM": "Olmo2ForCausalLM; OLMo 1's non-parametric LayerNorm is not mapped",
    "PhiForCausalLM": "Phi3ForCausalLM; Phi-1/2's parallel block with LayerNorm biases and a dense MLP is not "
                      "mapped",
    "PhimoeForCausalLM": "Phi3ForCausalLM; Phi-3.5-MoE's mixture-of-experts MLP is not mapped",
    "GptOssForCausalLM": "MistralForCausalLM; GPT-OSS's mixture-of-experts MLP (a router over experts) is not "
                         "mapped: tape's block has one dense MLP (its attention sinks are model.sinks)",
    "Llama4ForCausalLM": "LlamaForCausalLM; Llama 4's mixture-of-experts MLP and chunked attention are not mapped",
    "MixtralForCausalLM": "MistralForCausalLM; Mixtral's mixture-of-experts MLP is not mapped",
    "Qwen3MoeForCausalLM": "Qwen3ForCausalLM; its mixture-of-experts MLP is not mapped",
}


def architecture(hf: dict[str, Any], where: str) -> str:
    """The one supported class config.json names; without `architectures`, the class transformers loads its
    `model_type` as (said on stderr), and a TapeError when neither names a class tape imports."""
    arch = hf.get("architectures")
    if not arch:
        model_type = hf.get("model_type")
        assumed = MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
        if assumed is None:
            raise TapeError(f"{where} names no architecture (no architectures, model_type {model_type!r}); tape "
                            f"imports {', '.join(ARCHITECTURES)}: add \"architectures\": [\"LlamaForCausalLM\"] if "
                            "it is a Llama")
        print(f"note: {where} has no architectures; read as {assumed}, as transformers does for model_type "
              f"{model_type!r}", file=sys.stderr)
        return assumed
    if isinstance(arch, list) and len(arch) == 1 and arch[0] in NEAREST:
        raise TapeError(f"{where}: architectures {arch} is not supported; the nearest supported is "
                        f"{NEAREST[arch[0]]}")
    if not isinstance(arch, list) or len(arch) != 1 or arch[0] not in ARCHITECTURES:
        raise TapeError(f"{where}: architectures {arch} is not supported; supported: {', '.join(ARCHITECTURES)}")
    return arch[0]


@dataclass(frozen=True)
class Layout:
    """What each layer of a model is, in Hugging Face's terms: RoPE or not, its window (None: global); and the
    attention's biases and norms and the block's layout (`model.block`), the same in every layer."""

    rope: tuple[bool, ...]
    windows: tuple[int | None, ...]
    qkv_bias: bool = False
    qk_norm: bool = False
    block: tuple[tuple[str, Any], ...] = ()

    def model_keys(self, rope_args: dict[str, Any], local_rope_args: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ModelConfig keys of this layout, RoPE layers taking `rope_args`, or sliding RoPE layers
        `local_rope_args` where those differ (Gemma 3's rope_parameters per layer type; module docstring)."""
        if local_rope_args is not None and local_rope_args != rope_args and any(
                w is not None for w in self.windows) and any(w is None for w in self.windows):
            return self._per_type_keys(rope_args, local_rope_args)
        if local_rope_args is not None and all(w is not None for w in self.windows):
            rope_args = local_rope_args
        keys: dict[str, Any] = {"qk_norm": self.qk_norm, "qkv_bias": self.qkv_bias, "window": None, "schedule": {},
                                "block": dict(self.block)}
        pe_args = rope_args if any(self.rope) else {}
        pairs = list(zip(self.rope, self.windows, strict=True))
        if len(set(pairs)) == 1:
            rope, window = pairs[0]
            return {**keys, "pe": "rope" if rope else "nope", "pe_args": pe_args, "window": window}
        names = [_layer_name(rope, window) for rope, window in pairs]
        window = next(w for w in self.windows if w is not None) if any(self.windows) else None
        kinds = {"global": {}, "local": {"window": window}, "nope_local": {"pe": "nope", "window": window}}
        schedule = {"layers": names, "kinds": {name: body for name, body in kinds.items() if name in names}}
        return {**keys, "pe": "rope" if any(self.rope) else "nope", "pe_args": pe_args, "schedule": schedule}

    def _per_type_keys(self, global_args: dict[str, Any], local_args: dict[str, Any]) -> dict[str, Any]:
        """Sliding RoPE layers with their own RoPE: the model's pe_args are the local ones (most layers), and the
        `global` kind's pe_args, merged over them, the global ones."""
        if not all(self.rope) or set(local_args) - set(global_args):
            raise TapeError("rope_parameters: the sliding layers' RoPE sets "
                            f"{', '.join(sorted(set(local_args) - set(global_args))) or 'NoPE layers'} where the "
                            "full layers' does not; tape maps per-layer-type RoPE only when the full layers' "
                            "parameters name every key the sliding layers' do")
        window = next(w for w in self.windows if w is not None)
        names = ["local" if w is not None else "global" for w in self.windows]
        schedule = {"layers": names, "kinds": {"local": {"window": window}, "global": {"pe_args": global_args}}}
        return {"qk_norm": self.qk_norm, "qkv_bias": self.qkv_bias, "window": None, "block": dict(self.block),
                "pe": "rope", "pe_args": local_args, "schedule": schedule}


def _layer_name(rope: bool, window: int | None) -> str:
    if window is None:
        return "global" if rope else "nope"
    return "local" if rope else "nope_local"


def _flag(hf: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = hf.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TapeError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _window(hf: dict[str, Any], where: str) -> int | None:
    value = hf.get("sliding_window")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise TapeError(f"{where}: sliding_window must be a positive integer or null, got {value!r}")
    return value


def _layer_types(hf: dict[str, Any], n_layers: int, where: str) -> list[str] | None:
    types = hf.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= {SLIDING, FULL}:
        raise TapeError(f"{where}: layer_types must list {FULL!r} or {SLIDING!r} for each of the {n_layers} layers, "
                        f"got {types!r}")
    return types


def _no_rope_layers(hf: dict[str, Any], n_layers: int, where: str) -> list[bool]:
    """SmolLM3's RoPE layers: no_rope_layers (1 RoPE, 0 NoPE), else NoPE every no_rope_layer_interval-th layer."""
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = hf.get("no_rope_layer_interval", 4)
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise TapeError(f"{where}: no_rope_layer_interval must be a positive integer, got {interval!r}")
        return [(i + 1) % interval != 0 for i in range(n_layers)]
    if not isinstance(flags, list) or len(flags) < n_layers or not set(flags) <= {0, 1}:
        raise TapeError(f"{where}: no_rope_layers must list 1 (RoPE) or 0 (NoPE) for each of the {n_layers} layers, "
                        f"got {flags!r}")
    return [bool(flag) for flag in flags[:n_layers]]


def read_layout(hf: dict[str, Any], arch: str, where: str) -> Layout:
    """The Layout config.json describes for `arch` (module docstring); TapeError naming the key transformers would
    run differently or not at all."""
    n = hf["num_hidden_layers"]
    for key in _BIAS_KEYS[arch]:
        if _flag(hf, key, where):
            raise TapeError(f"{where}: {key}={hf[key]!r} is not supported for {arch} (tape has no such biases)")
    types = _layer_types(hf, n, where)
    window = _window(hf, where)
    rope = [True] * n
    block = dict(BLOCKS.get(arch, {}))
    if arch == "Gemma3ForCausalLM":
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if hf.get(key) is not None:
                raise TapeError(f"{where}: {key}={hf[key]!r} is not supported for {arch} (tape has no logit "
                                "soft-capping; Gemma 3 checkpoints leave it null)")
        if hf.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise TapeError(f"{where}: hidden_activation={hf['hidden_activation']!r} is not supported for {arch} "
                            "(only gelu_pytorch_tanh)")
        scalar = hf.get("query_pre_attn_scalar", 256)
        if isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or scalar <= 0:
            raise TapeError(f"{where}: query_pre_attn_scalar must be a positive number, got {scalar!r}")
        block["query_pre_attn_scalar"] = scalar
    if arch == "Cohere2ForCausalLM":
        scale = hf.get("logit_scale", 0.0625)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise TapeError(f"{where}: logit_scale must be a positive number, got {scale!r}")
        block["logit_scale"] = scale
    if arch in (*PER_TYPE_ROPE, "Cohere2ForCausalLM", "Exaone4ForCausalLM") and types is None:
        raise TapeError(f"{where}: layer_types is missing; save the model again with transformers >= 5, which "
                        "writes it")
    if arch in ("LlamaForCausalLM", "Olmo2ForCausalLM"):
        for key in ("sliding_window", "use_sliding_window"):
            if hf.get(key):
                raise TapeError(f"{where}: {key}={hf[key]!r} is not supported for {arch} (transformers' "
                                f"{arch.removesuffix('ForCausalLM')} has no sliding window; a Mistral, Qwen2 or "
                                "SmolLM3 config has)")
        if types and SLIDING in types:
            raise TapeError(f"{where}: layer_types {types!r} is not supported for {arch} (full_attention only)")
        windows: list[int | None] = [None] * n
    elif arch in (*PER_TYPE_ROPE, "Cohere2ForCausalLM", "Exaone4ForCausalLM"):
        if arch == "Cohere2ForCausalLM" or (arch == "Exaone4ForCausalLM" and window is not None):
            rope = [kind == SLIDING for kind in types]  # its full-attention layers have no PE
        if SLIDING in types and window is None:
            raise TapeError(f"{where}: layer_types names {SLIDING} layers but sliding_window is null; transformers "
                            "cannot run such a model")
        windows = [window if kind == SLIDING else None for kind in types]
    elif arch in ("MistralForCausalLM", "Phi3ForCausalLM"):
        windows = [window] * n
        if types is not None and types != [SLIDING if window else FULL] * n:
            raise TapeError(f"{where}: layer_types disagrees with sliding_window={window!r}, and transformers' "
                            f"{arch} ignores layer_types (every layer uses sliding_window); remove it")
    else:
        use = _flag(hf, "use_sliding_window", where)
        if arch in _QWEN:
            window = window if use else None  # as Qwen2Config / Qwen3Config do
            if types is None:
                first = hf.get("max_window_layers", 28)
                if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                    raise TapeError(f"{where}: max_window_layers must be an integer >= 0, got {first!r}")
                types = [SLIDING if window is not None and i >= first else FULL for i in range(n)]
        else:  # SmolLM3
            rope = _no_rope_layers(hf, n, where)
            if types is None:
                types = [SLIDING if use and window is not None and not r else FULL for r in rope]
            if SLIDING in types and not use:
                raise TapeError(f"{where}: layer_types names {SLIDING} layers but use_sliding_window is false "
                                "(transformers' attention implementations disagree on such a model); set one of them")
        if SLIDING in types and window is None:
            raise TapeError(f"{where}: layer_types names {SLIDING} layers but sliding_window is null"
                            + (" (use_sliding_window is false)" if arch in _QWEN else "")
                            + "; transformers cannot run such a model")
        windows = [window if kind == SLIDING else None for kind in types]
    return Layout(rope=tuple(rope), windows=tuple(windows), qkv_bias=arch == "Qwen2ForCausalLM",
                  qk_norm=arch in ("Qwen3ForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "Gemma3ForCausalLM",
                                   "Exaone4ForCausalLM"),
                  block=tuple(block.items()))


def interleaved_rows(weight, head_dim: int, inverse: bool = False):
    """A q_proj / k_proj weight [heads * head_dim, dim] of an INTERLEAVED_ROPE class with each head's rows in tape's
    order (the even rows, then the odd ones), or back with `inverse`: q.k is unchanged, and tape's rotation of pairs
    (i, i + d/2) is the class's rotation of pairs (2i, 2i+1)."""
    import torch

    heads = weight.view(-1, head_dim, weight.shape[-1])
    if inverse:
        half = head_dim // 2
        return torch.stack((heads[:, :half], heads[:, half:]), dim=2).reshape(weight.shape)
    return torch.cat((heads[:, 0::2], heads[:, 1::2]), dim=1).reshape(weight.shape)


def model_type(arch: str) -> str:
    return next(name for name, cls in MODEL_TYPES.items() if cls == arch)
