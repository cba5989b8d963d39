"""The one rule for combining a saved model's configuration with what a recipe asks for.

Used whenever training starts from existing weights (`tape finetune`, `train.init_from`, `tape extend-context`):

    config, grown = merge_model_config(saved, requested, origin)

`saved` is the checkpoint's (or imported base model's) `ModelConfig.to_dict()`; `requested` holds ONLY the model keys
the user set (recipe file or override: `Recipe.set_values("model")`), never defaults. The rule:
- keys that fix parameter shapes (SHAPE_KEYS) must equal the saved value, with one exception: the PE may grow from
  `rope` to `tape`. TAPE is RoPE plus per-layer modules whose updates start at exactly zero, so the grown model
  computes what the saved one computes; `grown` is then True and the new parameters (`new_parameter_names`) are
  the only ones the saved weights lack;
- every other set key replaces the saved value (`max_seq_len`, `norm_eps`, ...), and `pe_args` is merged key by key
  over the saved `pe_args` (so RoPE's theta and scaling carry over into TAPE unless the recipe changes them);
- `schedule` (and the per-layer keys it sets) may change what does not change a weight's shape: windows,
  temperatures, length scales, PEs without weights (rope <-> nope <-> alibi); a schedule that changes a shape is
  refused naming the first tensor. In a model with a schedule, growing `pe` grows the layers that take the model's PE
  (kinds that name no other `pe`): an imported SmolLM3's RoPE layers become TAPE layers, its NoPE layers stay NoPE,
  and every window stays (tapecli.model.hybrid: the TAPE state passes the NoPE layers unchanged, so step 0 is still
  the base).

    shapes = parameter_shapes(config)      # {tensor name: shape} of a model built with config (meta device)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError

if TYPE_CHECKING:
    from torch import nn

    from tapecli.model.config import ModelConfig

SHAPE_KEYS = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "pe",
              "tie_embeddings", "abacus", "abacus_digit_ids", "qk_norm", "qkv_bias", "output_gate", "block",
              "sinks")
GROWTH = {("rope", "tape")}  # (saved pe, requested pe) pairs whose new parameters start as the identity


def _normalised(key: str, value: Any, merged: dict[str, Any]) -> Any:
    """What ModelConfig makes of a `null` it is given (n_kv_heads = n_heads, ffn_dim = Llama's 8/3 rule)."""
    if value is not None:
        return value
    if key == "n_kv_heads":
        return merged["n_heads"]
    if key == "ffn_dim":
        return 64 * math.ceil(8 * merged["dim"] / 3 / 64)
    if key == "head_dim":
        return merged["dim"] // merged["n_heads"]
    return None


def merge_model_config(saved: dict[str, Any], requested: dict[str, Any], origin: str) -> tuple[ModelConfig, bool]:
    """(the config to build, whether the PE grew from rope to tape). Raises TapeError naming the first key that
    would change a shape."""
    from tapecli.model.config import ModelConfig

    saved = {**config_defaults(), **saved}  # a key newer than the checkpoint means what its default means
    merged = dict(saved)
    grown = False
    for key, value in requested.items():
        if key == "vocab_size" and value is None:
            continue  # "take it from the tokenizer": the saved model's vocabulary
        if key == "pe_args":
            merged["pe_args"] = {**saved.get("pe_args", {}), **(value or {})}
            continue
        value = _normalised(key, value, {**saved, **{k: v for k, v in requested.items() if v is not None}})
        if value == saved.get(key):
            continue
        if key in SHAPE_KEYS:
            if key == "pe" and (saved.get("pe"), value) in GROWTH:
                grown = True
            else:
                raise TapeError(f"model.{key}: the recipe asks for {value!r} but {origin} has {saved.get(key)!r}; "
                                "shapes cannot change (only pe may grow from rope to tape)")
        merged[key] = value
    try:
        config = ModelConfig.from_dict(merged)
    except ValueError as e:
        raise TapeError(f"{origin}: {e}") from None
    if grown and not any(spec.pe == config.pe for spec in config.layers()):
        raise TapeError(f"model.pe: {config.pe} would grow in no layer: every kind of the schedule names its own pe; "
                        "give the layers that should grow a kind without `pe` (e.g. global: {})")
    if (merged.get("schedule") or {}) != (saved.get("schedule") or {}):
        check_same_shapes(ModelConfig.from_dict(saved), config, "model.schedule", origin, ignore_pe=grown)
    return config, grown


def config_defaults() -> dict[str, Any]:
    """ModelConfig's default of every key that has one (what a saved config without the key meant)."""
    import dataclasses

    from tapecli.model.config import ModelConfig

    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(ModelConfig)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of a model built with `config` (on the meta device: no memory, no time)."""
    import torch

    from tapecli.model.transformer import Transformer

    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in Transformer(config).state_dict().items()}


def check_same_shapes(before: ModelConfig, after: ModelConfig, what: str, origin: str, ignore_pe: bool = False) -> None:
    """TapeError naming `what` and the first tensor whose shape (or presence) `after` changes; with `ignore_pe`, the
    PE's tensors may come (a grown PE's new parameters, in the layers that take it)."""
    old, new = parameter_shapes(before), parameter_shapes(after)
    changed = sorted(name for name in old.keys() | new.keys() if old.get(name) != new.get(name)
                     and not (ignore_pe and name not in old and ".pe." in f".{name}"))
    if changed:
        name = changed[0]
        raise TapeError(f"{what}: changes the shape of {origin}'s weights ({name}: {old.get(name)} -> "
                        f"{new.get(name)}); shapes cannot change")


def new_parameter_names(model: nn.Module) -> set[str]:
    """The parameters a grown model has and its saved rope model lacks: those of the positional encoding."""
    return {name for name, _ in model.named_parameters() if ".pe." in f".{name}"}
