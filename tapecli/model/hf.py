"""Import Hugging Face Llama-family checkpoints into tape's `Transformer` (the Llama layout, so no renaming).

    model, tokenizer = load_hf_model("meta-llama/Llama-2-7b-hf" | "llama2-7b" | "path/to/hf_dir",
                                     dtype=torch.bfloat16, device="cuda")
    is_hf_source(source) -> bool

A source is a local directory (`config.json`, `model.safetensors` or shards listed in
`model.safetensors.index.json`, `tokenizer.json` and/or `tokenizer.model`), a hub id (downloaded with
`huggingface_hub` when online, read from the local Hugging Face cache otherwise), or a short name from `SHORT_NAMES`.
Supported: `LlamaForCausalLM` and `MistralForCausalLM` without sliding window; grouped-query attention; an explicit
`head_dim`; tied or untied embeddings; RoPE given as `rope_parameters` (transformers 5) or as the older
`rope_theta` / `rope_scaling` keys, of type default, linear, dynamic, yarn or llama3. Anything else (biases, sliding
window, other activations or architectures) is a TapeError naming the config key.

Weights are read tensor by tensor from each shard (`safetensors.safe_open`) straight into the target dtype and
assigned to a model built on the meta device, so loading never holds a second full copy of the model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError

if TYPE_CHECKING:
    import torch

    from tapecli.data.tokenizer import Tokenizer
    from tapecli.model import ModelConfig, Transformer

# `--base` short names for common Llama-family bases (hub ids; the meta-llama ones are gated: `hf auth login`).
SHORT_NAMES: dict[str, str] = {
    "llama2-7b": "meta-llama/Llama-2-7b-hf",
    "llama2-13b": "meta-llama/Llama-2-13b-hf",
    "llama3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama3.2-1b": "meta-llama/Llama-3.2-1B",
    "mistral-7b": "mistralai/Mistral-7B-v0.3",
    "tinyllama": "TinyLlama/TinyLlama_v1.1",
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
}
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
HF_CONFIG = "config.json"
TAPE_CONFIG = "model_config.json"  # tapecli.store.checkpoint.MODEL_CONFIG (not imported: checkpoint sits above model)
INDEX = "model.safetensors.index.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# RoPE types transformers writes -> our `scaling` names; the HF defaults our RoPE also uses are not repeated.
_ROPE_TYPES = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
_ROPE_KEYS = {"rope_theta", "rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast",
              "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate", "low_freq_factor",
              "high_freq_factor", "partial_rotary_factor"}


def is_hf_source(source: str) -> bool:
    """True for a Hugging Face directory (config.json, no tape model_config.json), a known short name, or a string
    that is no local path and looks like a hub id (`owner/name`)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return (path / HF_CONFIG).is_file() and not (path / TAPE_CONFIG).is_file()
    if path.exists():
        return False
    return source.lower() in SHORT_NAMES or bool(_HUB_ID.match(source))


def resolve_hf_source(source: str) -> Path:
    """The local directory of `source`: as given, or the hub snapshot (downloaded, or found in the cache offline)."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / HF_CONFIG).is_file():
            raise TapeError(f"{path} has no {HF_CONFIG}; expected a Hugging Face model directory")
        return path
    repo = SHORT_NAMES.get(source.lower(), source)
    if not _HUB_ID.match(repo):
        names = ", ".join(SHORT_NAMES)
        raise TapeError(f"base {source!r} is neither a directory nor a hub id (owner/name) nor a short name ({names})")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo, allow_patterns=["*.json", "*.safetensors", "tokenizer.model"]))
    except GatedRepoError:
        raise TapeError(f"{repo} is gated: accept its licence on huggingface.co and log in (`hf auth login`), "
                        "or pass a local directory") from None
    except RepositoryNotFoundError:
        raise TapeError(f"{repo} does not exist on the Hugging Face hub (or needs a login)") from None
    except LocalEntryNotFoundError:
        raise TapeError(f"{repo} is not in the local Hugging Face cache and the hub cannot be reached; pass a local "
                        "directory with config.json, *.safetensors and the tokenizer instead") from None
    except Exception as e:  # network failures surface as several library-specific types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TapeError(f"{repo} could not be downloaded ({reason}); pass a local directory with config.json, "
                        "*.safetensors and the tokenizer instead") from None


# ---------------------------------------------------------------------------------------------------------------
# Config


def _rope_parameters(hf: dict[str, Any]) -> dict[str, Any]:
    """transformers 5's `rope_parameters`, or the legacy `rope_theta` + `rope_scaling` normalised the same way."""
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


def _pe_args(hf: dict[str, Any]) -> dict[str, Any]:
    """Our RoPE `pe_args` for a HF rope configuration (see tapecli.model.pe.rope)."""
    params = _rope_parameters(hf)
    unknown = sorted(set(params) - _ROPE_KEYS)
    if unknown:
        raise TapeError(f"config.json: rope_parameters.{unknown[0]} is not supported")
    kind = params["rope_type"]
    if kind not in _ROPE_TYPES:
        raise TapeError(f"config.json: rope_parameters.rope_type {kind!r} is not supported; supported: "
                        f"{', '.join(_ROPE_TYPES)}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise TapeError("config.json: partial_rotary_factor != 1 is not supported")
    args: dict[str, Any] = {"theta": float(params["rope_theta"])}
    if kind == "default":
        return args
    args["scaling"] = _ROPE_TYPES[kind]
    max_pos = hf["max_position_embeddings"]
    # dynamic NTK compares with max_position_embeddings; yarn and llama3 with the original length.
    original = max_pos if kind == "dynamic" else params.get("original_max_position_embeddings") or max_pos
    args["original_max_len"] = int(original)
    factor = params.get("factor")
    if factor is None and kind == "yarn":
        factor = max_pos / original
    if factor is None:
        raise TapeError(f"config.json: rope_parameters.factor is required for rope_type {kind!r}")
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


def read_hf_config(directory: Path) -> dict[str, Any]:
    try:
        return json.loads((directory / HF_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TapeError(f"{directory / HF_CONFIG}: cannot read it ({e})") from None


def hf_model_config(hf: dict[str, Any]) -> ModelConfig:
    """tape's ModelConfig for a Llama-family config.json (a dict); unsupported keys raise TapeError naming them."""
    from tapecli.model import ModelConfig

    arch = hf.get("architectures") or ["LlamaForCausalLM"]
    if len(arch) != 1 or arch[0] not in ARCHITECTURES:
        raise TapeError(f"config.json: architectures {arch} is not supported; supported: {', '.join(ARCHITECTURES)}")
    for key in ("attention_bias", "mlp_bias", "sliding_window", "use_sliding_window"):
        if hf.get(key):
            raise TapeError(f"config.json: {key}={hf[key]!r} is not supported (Llama without it only)")
    if hf.get("hidden_act", "silu") != "silu":
        raise TapeError(f"config.json: hidden_act={hf['hidden_act']!r} is not supported (only silu)")
    if hf.get("layer_types") and set(hf["layer_types"]) != {"full_attention"}:
        raise TapeError(f"config.json: layer_types {sorted(set(hf['layer_types']))} is not supported")
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"], dim=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads"),
            head_dim=hf.get("head_dim"), ffn_dim=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"], pe="rope", pe_args=_pe_args(hf),
            norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            init_std=float(hf.get("initializer_range", 0.02)))
    except KeyError as e:
        raise TapeError(f"config.json: missing key {e.args[0]}") from None
    except ValueError as e:
        raise TapeError(f"config.json: {e}") from None


# ---------------------------------------------------------------------------------------------------------------
# Weights


def build_on_meta(config: ModelConfig) -> Transformer:
    """A Transformer whose parameters live on the meta device (no memory); its PE's plain tensors (RoPE
    frequencies) are real. Fill it with `assign_weights`."""
    import torch

    from tapecli.model import Transformer
    from tapecli.model.pe import build_pe

    with torch.device("meta"):
        model = Transformer(config)
    model.model.pe = build_pe(config)
    return model


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a HF directory: the shards its index lists, or model.safetensors."""
    index = directory / INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [directory / s for s in shards]
    else:
        files = sorted(directory.glob("*.safetensors"))
    missing = [f for f in files if not f.is_file()]
    if not files or missing:
        raise TapeError(f"{directory}: no safetensors weights found ({missing[0] if missing else '*.safetensors'})")
    return files


def read_weights(files: list[Path], dtype: torch.dtype, device: torch.device | str, skip: set[str] = frozenset()):
    """Yield (name, tensor) one tensor at a time, cast to `dtype` on `device` (floating tensors only)."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                if name in skip or name.endswith("rotary_emb.inv_freq"):
                    continue
                tensor = f.get_tensor(name)
                yield name, tensor.to(device=device, dtype=dtype if tensor.is_floating_point() else None)


def assign_weights(model: Transformer, tensors, origin: str) -> set[str]:
    """Assign (name, tensor) pairs to a meta-built model; returns the names of parameters still on meta.

    Unknown or mis-shaped tensors are a TapeError naming them. A tied head stays tied to the embedding."""
    expected = dict(model.named_parameters())
    state = {}
    for name, tensor in tensors:
        if model.config.tie_embeddings and name == "lm_head.weight":
            continue  # some tied checkpoints store the head too; it is the embedding
        if name not in expected:
            raise TapeError(f"{origin}: unexpected tensor {name} (not a Llama weight tape supports)")
        if tensor.shape != expected[name].shape:
            raise TapeError(f"{origin}: {name} has shape {tuple(tensor.shape)}, config.json implies "
                            f"{tuple(expected[name].shape)}")
        state[name] = tensor
    model.load_state_dict(state, strict=False, assign=True)
    if model.config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return {name for name, p in model.named_parameters() if p.is_meta}


def load_hf_weights(model: Transformer, directory: Path, dtype: torch.dtype, device: torch.device | str) -> set[str]:
    """Fill a meta-built model from a HF directory's safetensors; returns the parameters the files did not hold."""
    return assign_weights(model, read_weights(weight_files(directory), dtype, device), str(directory))


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
    from tapecli.faults import reading

    hf = hf if hf is not None else read_hf_config(directory)
    tok_config: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins, as in transformers
        if (directory / name).is_file():
            with reading(directory / name):
                tok_config.update(json.loads((directory / name).read_text()))
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
        raise TapeError(f"{directory} has no tokenizer.json or tokenizer.model")
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


def load_hf_model(source: str, *, dtype: torch.dtype | None = None,
                  device: str | torch.device = "cpu") -> tuple[Transformer, Tokenizer]:
    """(model in eval mode, its own tokenizer) from a HF directory, hub id or short name.

    `dtype` None means float32 on CPU and bfloat16 on CUDA. The model's parameter names equal the checkpoint's."""
    import torch

    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    directory = resolve_hf_source(source)
    hf = read_hf_config(directory)
    model = build_on_meta(hf_model_config(hf))
    missing = load_hf_weights(model, directory, dtype, device)
    if missing:
        raise TapeError(f"{directory}: the checkpoint lacks {sorted(missing)[0]} (and {len(missing) - 1} more)")
    return model.eval(), load_hf_tokenizer(directory, hf)
