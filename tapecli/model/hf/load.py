"""Hugging Face Llama-family checkpoints as tape `Transformer`s (the Llama layout, so no renaming): the pieces.

    config = hf_model_config(read_hf_config(directory))      # config.json -> ModelConfig (TapeError naming a key)
    model = build_on_meta(config)                            # parameters on the meta device
    missing = load_hf_weights(model, directory, dtype, device)   # assigned tensor by tensor from the safetensors
    tokenizer = load_hf_tokenizer(directory)

Which directory, hub id or short name to open, and in which dtype, is decided by `tapecli.store.door`, the one door
every command opens models through. A directory holds `config.json`, `model.safetensors` or shards listed in
`model.safetensors.index.json`, `tokenizer.json` and/or `tokenizer.model`.
Supported: `LlamaForCausalLM`, `MistralForCausalLM`, `Qwen2ForCausalLM`, `Qwen3ForCausalLM`, `SmolLM3ForCausalLM`
and `Olmo2ForCausalLM`, with their sliding windows, NoPE layers, q/k/v biases, QK-norm and block layouts as
`tapecli.model.hf.arch` reads them; grouped-query attention; an explicit `head_dim`; tied or untied embeddings;
RoPE given as `rope_parameters` (transformers 5) or as the older `rope_theta` / `rope_scaling` keys, of type default,
linear, dynamic, yarn, llama3 or longrope (Phi-3: its short and long factors, the original length from the top-level
`original_max_position_embeddings` as Phi3Config takes it, the attention factor as transformers computes it; the
legacy types su and yarn of a Phi-3 config are longrope, as Phi3Config reads them). Anything else (other biases,
activations or architectures) is a TapeError naming the config key.

`partial_rotary_factor` is read as the architecture's transformers class reads it (`PARTIAL_ROTARY`): where the
class rotates only the first factor x head_dim dims of a head (GPT-NeoX, Phi, ...), it becomes RoPE's
`partial_rotary_factor`; `LlamaForCausalLM`, `MistralForCausalLM` and `Olmo2ForCausalLM` compute rope_type default
over the whole head and ignore the factor (so tape does too, and says so on stderr), and fail with any other rope
type (a TapeError).

Weights are read tensor by tensor from each shard (`safetensors.safe_open`) straight into the target dtype and
assigned to a model built on the meta device, so loading never holds a second full copy of the model.

Every file is read through `tapecli.model.hf.files`, and every check of what a file says names that file, so a
damaged directory (corrupt or truncated JSON or safetensors, absent shards, unsupported architecture or tensors,
integer or mis-shaped weights, no or a corrupt tokenizer) is one line (TapeError, exit code 2) for every command that
opens one. A config.json without `architectures` is read as its `model_type` says, as transformers does (with a
note on stderr), and refused when it names no model_type tape imports.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError
from tapecli.model.hf.arch import architecture, read_layout
from tapecli.model.hf.files import read_json_object, read_weights, weight_files

if TYPE_CHECKING:
    import torch

    from tapecli.data.tokenizer import Tokenizer
    from tapecli.model import ModelConfig, Transformer

# Whether the architecture's transformers class rotates only the first partial_rotary_factor of each head (the
# module docstring): neither Llama nor Mistral does; for the other classes such a config is refused.
PARTIAL_ROTARY = {"LlamaForCausalLM": False, "MistralForCausalLM": False, "Olmo2ForCausalLM": False,
                  "Gemma3ForCausalLM": False, "Olmo3ForCausalLM": False, "Phi3ForCausalLM": True}
HF_CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# RoPE types transformers writes -> our `scaling` names; the HF defaults our RoPE also uses are not repeated.
_ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3",
               "longrope": "longrope"}
# What a class's config reads a rope type as (Phi3Config: the legacy su and yarn are longrope), and the original
# length it takes from the top level of config.json (default where absent), over rope_parameters'.
_ROPE_ALIASES = {"Phi3ForCausalLM": {"su": "longrope", "yarn": "longrope"}}
_TOP_LEVEL_ORIGINAL = {"Phi3ForCausalLM": 4096}
# Classes whose generation re-encodes its cache at LongRoPE's switch as tape does (Phi3ForCausalLM's
# prepare_inputs_for_generation); another class would decode on with short-factor keys: refused.
_LONGROPE_CLASSES = ("Phi3ForCausalLM",)
_ROPE_KEYS = {"short_factor", "long_factor", "rope_theta", "rope_type", "type", "factor",
              "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
              "mscale_all_dim", "truncate", "low_freq_factor", "high_freq_factor", "partial_rotary_factor"}


# ---------------------------------------------------------------------------------------------------------------
# Config


def _rope_parameters(hf: dict[str, Any], where: str) -> dict[str, Any]:
    """transformers 5's `rope_parameters`, or the legacy `rope_theta` + `rope_scaling` normalised the same way."""
    for key in ("rope_parameters", "rope_scaling"):
        if not isinstance(hf.get(key) or {}, dict):
            raise TapeError(f"{where}: {key} must be an object ({{...}}) or null, got {hf[key]!r}")
    params = hf.get("rope_parameters")
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    params = dict(params)
    if "rope_type" not in params:
        params["rope_type"] = params.get("type", "default")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        params["partial_rotary_factor"] = hf["partial_rotary_factor"]
    return params


def _pe_args(hf: dict[str, Any], where: str = HF_CONFIG, architecture: str = "LlamaForCausalLM") -> dict[str, Any]:
    """Our RoPE `pe_args` for a HF rope configuration (see tapecli.model.pe.rope), as `architecture` reads it."""
    params = _rope_parameters(hf, where)
    unknown = sorted(set(params) - _ROPE_KEYS)
    if unknown:
        raise TapeError(f"{where}: rope_parameters.{unknown[0]} is not supported")
    kind = _ROPE_ALIASES.get(architecture, {}).get(params["rope_type"], params["rope_type"])
    if kind not in _ROPE_TYPES:
        raise TapeError(f"{where}: rope_parameters.rope_type {kind!r} is not supported; supported: "
                        f"{', '.join(_ROPE_TYPES)}")
    if kind == "longrope" and architecture not in _LONGROPE_CLASSES:
        raise TapeError(f"{where}: rope_parameters.rope_type 'longrope' is not supported for {architecture} (tape "
                        f"reads LongRoPE as transformers' {', '.join(_LONGROPE_CLASSES)} runs it)")
    args: dict[str, Any] = {"theta": float(params["rope_theta"])}
    partial = float(params.get("partial_rotary_factor", 1.0))
    if partial != 1.0 and architecture not in PARTIAL_ROTARY:
        raise TapeError(f"{where}: partial_rotary_factor {partial:g} is not supported for {architecture} (tape reads "
                        "it as transformers does for Llama, Mistral and OLMo 2 only)")
    if partial != 1.0 and PARTIAL_ROTARY[architecture]:
        args["partial_rotary_factor"] = partial
    elif partial != 1.0 and kind == "default":
        print(f"note: {where}: partial_rotary_factor {partial:g} is ignored, as transformers' {architecture} "
              "ignores it with rope_type default (every dim of a head rotates)", file=sys.stderr)
    elif partial != 1.0:
        raise TapeError(f"{where}: partial_rotary_factor {partial:g} with rope_type {kind!r} is not supported: "
                        f"transformers' {architecture} cannot run it (its frequencies would cover part of a head, "
                        "its rotation the whole head)")
    if kind == "default":
        return args
    args["scaling"] = _ROPE_TYPES[kind]
    max_pos = hf["max_position_embeddings"]
    # dynamic NTK compares with max_position_embeddings; yarn, llama3 and longrope with the original length.
    original = max_pos if kind == "dynamic" else params.get("original_max_position_embeddings") or max_pos
    if architecture in _TOP_LEVEL_ORIGINAL:
        original = hf.get("original_max_position_embeddings", _TOP_LEVEL_ORIGINAL[architecture])
    args["original_max_len"] = int(original)
    if kind == "longrope":
        return {**args, **_longrope_args(params)}
    factor = params.get("factor")
    if factor is None:  # transformers refuses such a config too (a KeyError when it is read)
        raise TapeError(f"{where}: rope_parameters.factor is required for rope_type {kind!r}; add the factor the "
                        "model was extended by (its context length over the original one)")
    args["factor"] = float(factor)
    if kind == "yarn":
        attention_factor = params.get("attention_factor")
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if attention_factor is None and mscale and mscale_all_dim and args["factor"] > 1:
            import math

            def get(m: float) -> float:
                return 0.1 * m * math.log(args["factor"]) + 1.0

            attention_factor = get(mscale) / get(mscale_all_dim)
        if attention_factor is not None:
            args["attention_factor"] = float(attention_factor)
        args["beta_fast"] = float(params.get("beta_fast") or 32)
        args["beta_slow"] = float(params.get("beta_slow") or 1)
        args["truncate"] = bool(params.get("truncate", True))
    if kind == "llama3":
        args["low_freq_factor"] = float(params["low_freq_factor"])
        args["high_freq_factor"] = float(params["high_freq_factor"])
    return args


def _longrope_args(params: dict[str, Any]) -> dict[str, Any]:
    """LongRoPE's factor lists, and its growth factor and attention factor where config.json gives them (else tape's
    RoPE computes the attention factor as transformers does, from max_position_embeddings / the original length, so
    a longer context recomputes it; the RoPE checks the lists' lengths). A factor <= 1 means attention factor 1."""
    args = {"short_factor": params["short_factor"], "long_factor": params["long_factor"]}
    factor, attention_factor = params.get("factor"), params.get("attention_factor")
    if factor is not None and float(factor) > 1:
        args["factor"] = float(factor)
    elif factor is not None and attention_factor is None:
        attention_factor = 1.0
    return args if attention_factor is None else {**args, "attention_factor": float(attention_factor)}


def _layer_type_pe_args(hf: dict[str, Any], where: str, arch: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the RoPE pe_args of full-attention layers, those of sliding layers or None where they are the same): Gemma
    3's and OLMo 3's `rope_parameters` hold one entry per layer type, every other class's one for all layers."""
    from tapecli.model.hf.arch import PER_TYPE_ROPE

    if arch not in PER_TYPE_ROPE:
        return _pe_args(hf, where, arch), None
    params = hf.get("rope_parameters")
    if not isinstance(params, dict) or not all(isinstance(params.get(t), dict)
                                               for t in ("full_attention", "sliding_attention")):
        raise TapeError(f"{where}: rope_parameters must hold full_attention and sliding_attention entries for "
                        f"{arch}, got {params!r}; save the model again with transformers >= 5, which writes them")
    return tuple(_pe_args({**hf, "rope_parameters": params[t]}, f"{where} ({t})", arch)
                 for t in ("full_attention", "sliding_attention"))


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json as a dict; a corrupt, truncated or non-object file is one line naming it."""
    return read_json_object(directory / HF_CONFIG)


_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "max_position_embeddings")


def hf_model_config(hf: dict[str, Any], where: str = HF_CONFIG) -> ModelConfig:
    """tape's ModelConfig for a Llama-family config.json (a dict; `where` names it in messages); an unsupported
    architecture or key, a missing key or a value of the wrong type raises TapeError naming the key. Which layers
    slide or have no RoPE, and the attention's biases and norms, are `tapecli.model.hf.arch`'s reading."""
    from tapecli.model import ModelConfig

    arch = architecture(hf, where)
    if hf.get("hidden_act", "silu") != "silu":
        raise TapeError(f"{where}: hidden_act={hf['hidden_act']!r} is not supported (only silu)")
    for key in (*_SIZES, "num_key_value_heads", "head_dim"):
        value = hf.get(key)
        if key in _SIZES and value is None:
            raise TapeError(f"{where}: missing key {key}")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise TapeError(f"{where}: {key} must be a positive integer, got {value!r}")
    try:
        pe_args, local_pe_args = _layer_type_pe_args(hf, where, arch)
        eps_key = "layer_norm_eps" if arch == "Cohere2ForCausalLM" else "rms_norm_eps"
        norm_eps, init_std = float(hf.get(eps_key, 1e-6)), float(hf.get("initializer_range", 0.02))
    except KeyError as e:
        raise TapeError(f"{where}: missing key {e.args[0]}") from None
    except (TypeError, ValueError) as e:  # a number written as text, a list or null
        raise TapeError(f"{where}: a RoPE or norm setting is not a number ({e})") from None
    layers = read_layout(hf, arch, where).model_keys(pe_args, local_pe_args)
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads"),
            head_dim=hf.get("head_dim"), ffn_dim=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"], norm_eps=norm_eps,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)), init_std=init_std, **layers)
    except ValueError as e:
        raise TapeError(f"{where}: {hf_key_names(str(e))}") from None


# tape's RoPE pe_args as config.json names them (`_pe_args` reads each from the rope parameters)
_HF_NAMES = {"theta": "rope_theta", "factor": "factor", "original_max_len": "original_max_position_embeddings",
             "beta_fast": "beta_fast", "beta_slow": "beta_slow", "attention_factor": "attention_factor",
             "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
             "partial_rotary_factor": "partial_rotary_factor", "short_factor": "short_factor",
             "long_factor": "long_factor"}


def hf_key_names(message: str) -> str:
    """A message about `model.pe_args.KEY` naming the config.json key it came from (`rope_parameters.rope_theta`)."""
    def name(match: re.Match) -> str:
        key = match.group(1)
        return f"rope_parameters.{_HF_NAMES[key]}" if key in _HF_NAMES else match.group(0)

    return re.sub(r"model\.(?:schedule\.kinds\.\w+\.)?pe_args\.(\w+)", name, message)  # a hybrid's kinds too


# ---------------------------------------------------------------------------------------------------------------
# Weights


def build_on_meta(config: ModelConfig) -> Transformer:
    """A Transformer whose parameters live on the meta device (no memory); its PE's plain tensors (RoPE
    frequencies) are real. Fill it with `assign_weights`."""
    import torch

    from tapecli.model import Transformer
    from tapecli.model.hybrid import model_pe

    with torch.device("meta"):
        model = Transformer(config)
    model.model.pe = model_pe(config, config.layers())
    return model


def assign_weights(model: Transformer, tensors, origin: str) -> set[str]:
    """Assign (name, tensor, file) triples to a meta-built model; returns the names of parameters still on meta.

    A tensor the model has no parameter for, or of another shape than `origin` (the config.json the model was built
    from) implies, is a TapeError naming its file. A tied head stays tied to the embedding."""
    expected = dict(model.named_parameters())
    state = {}
    for name, tensor, file in tensors:
        if model.config.tie_embeddings and name == "lm_head.weight":
            continue  # some tied checkpoints store the head too; it is the embedding
        if name not in expected:
            raise TapeError(f"{file}: unexpected tensor {name} (not a Llama weight tape supports)")
        if tensor.shape != expected[name].shape:
            raise TapeError(f"{file}: {name} has shape {tuple(tensor.shape)}, {origin} implies "
                            f"{tuple(expected[name].shape)}")
        state[name] = tensor
    model.load_state_dict(state, strict=False, assign=True)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return {name for name, p in model.named_parameters() if p.is_meta}


def load_hf_weights(model: Transformer, directory: Path, dtype: torch.dtype, device: torch.device | str) -> set[str]:
    """Fill a meta-built model from a HF directory's safetensors; returns the parameters the files did not hold."""
    from tapecli.model.hf.arch import INTERLEAVED_ROPE, interleaved_rows
    from tapecli.model.hf.fused import split_fused

    arch = architecture(read_hf_config(directory), str(directory / HF_CONFIG))
    tensors = split_fused(read_weights(weight_files(directory), dtype, device), arch, model.config)
    if arch in INTERLEAVED_ROPE:
        d = model.config.head_dim
        tensors = ((name, interleaved_rows(t, d) if name.endswith(("q_proj.weight", "k_proj.weight")) else t, file)
                   for name, t, file in tensors)
    return assign_weights(model, tensors, str(directory / HF_CONFIG))


def require_weights(directory: Path, lacking: set[str]) -> None:
    """One line naming the first parameter the weights of `directory` lack, if they lack any."""
    if lacking:
        first, more = sorted(lacking)[0], len(lacking) - 1
        raise TapeError(f"{directory}: the weights lack {first}" + (f" (and {more} more)" if more else ""))


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer


def _token_string(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", "lstrip": false, ...}
        return value.get("content")
    return value if isinstance(value, str) else None


def load_hf_tokenizer(directory: Path, hf: dict[str, Any] | None = None) -> Tokenizer:
    """The model's own tokenizer (tokenizer.json through `tokenizers`, else tokenizer.model through SentencePiece),
    with the BOS/EOS/pad tokens of tokenizer_config.json (else special_tokens_map.json), else the ids of
    config.json; pad falls back to EOS. Its default special tokens are transformers' (`hf_default_specials`)."""
    from tapecli.data.tokenizer import HFTokenizer, SentencePieceTokenizer

    hf = hf if hf is not None else read_hf_config(directory)
    tok_config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins, as in transformers
        if (directory / name).is_file():
            tok_config.update(read_json_object(directory / name))
    specials: dict[str, int | str] = {}
    for kind in ("bos", "eos", "pad"):
        value = _token_string(tok_config.get(f"{kind}_token")) or hf.get(f"{kind}_token_id")
        if isinstance(value, list):  # several EOS ids (chat models): the first is the plain one
            value = value[0] if value else None
        if value is not None:
            specials[kind] = value
    if (directory / "tokenizer.json").is_file():
        tok: Tokenizer = HFTokenizer(directory / "tokenizer.json", specials)
    elif (directory / "tokenizer.model").is_file():
        tok = SentencePieceTokenizer(directory / "tokenizer.model", specials)
    else:
        raise TapeError(f"{directory} has no tokenizer (tokenizer.json or tokenizer.model); copy the model's "
                        "tokenizer files into it")
    if tok.vocab_size > hf.get("vocab_size", tok.vocab_size):
        raise TapeError(f"{directory}: the tokenizer has {tok.vocab_size} tokens, more than config.json's "
                        f"vocab_size {hf['vocab_size']}")
    tok.set_default_specials(*hf_default_specials(tok, tok_config))
    return tok


def hf_default_specials(tok: Tokenizer, tok_config: dict[str, Any]) -> tuple[list[int], list[int], bool]:
    """(ids before, ids after, has_bos): what transformers' (>= 5) AutoTokenizer adds around a text by default
    (`tokenizer(text)`, `tokenizer.encode(text)`, and so lm-eval's HFLM), and whether it knows a BOS token.

    - With a tokenizer.json, its post-processor decides (nothing when it has none); transformers 5 ignores
      tokenizer_config.json's add_bos_token / add_eos_token then (4.x applied them to Llama-class tokenizers; the
      two agree for Llama 2/3, Mistral, SmolLM2, Qwen and GPT-2, whose config and post-processor say the same).
    - With only a SentencePiece tokenizer.model: BOS if tokenizer_config.json says `add_bos_token: true`, EOS if it
      says `add_eos_token: true` (transformers 5's defaults are false).
    - has_bos: tokenizer_config.json (or special_tokens_map.json) names a BOS token; a SentencePiece model's own
      BOS piece counts unless the config sets `bos_token: null`.
    """
    from tapecli.data.tokenizer import HFTokenizer

    if isinstance(tok, HFTokenizer):
        has_bos = _token_string(tok_config.get("bos_token")) is not None
        before, after = tok.post_processor_specials()
        return before, after, has_bos
    has_bos = tok_config.get("bos_token", "named") is not None
    before = [tok.bos_id] if tok_config.get("add_bos_token") is True and has_bos else []
    after = [tok.eos_id] if tok_config.get("add_eos_token") is True else []
    return before, after, has_bos

