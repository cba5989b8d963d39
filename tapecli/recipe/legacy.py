"""Recipes written by tape 0.1: every compatibility rule of the recipe format lives here.

tape 0.1 wrote a run's `recipe.yaml` with every key of every section spelled out -- the data keys of all seven
kinds, every `eval` key, and an `extend` section whose `method: null` meant "no context extension" -- and stored in
each checkpoint's `train_state.pt` the first 16 hex digits of the SHA-256 of that YAML (`recipe_hash`).

- `upgrade(data)`: a parsed recipe in exactly that form (all five sections, each spelling exactly 0.1's keys) loses
  the keys its kind does not use (0.1 ignored them), its `eval` keys likewise, and `extend` when `method` is null;
  any other recipe comes back unchanged. The loader (tapecli.recipe.schema) calls it before anything else.
- `legacy_hash(recipe, previous)`: what 0.1 would have stored as `recipe_hash` for `recipe`, so a run resumed with
  its original command is recognised as unchanged. Keys the recipe no longer holds take their values from the run's
  own 0.1 recipe.yaml (`previous`), else 0.1's defaults. (`recipe` is a `tapecli.recipe.Recipe`, left untyped here
  because the schema imports this module.)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import yaml

VERSION = "0.1"
# 0.1's schema: every section's keys, in the order its to_yaml wrote them, with their defaults.
SCHEMA: dict[str, dict[str, Any]] = {
    "model": {"pe": "tape", "pe_args": {}, "n_layers": 12, "dim": 768, "n_heads": 12, "n_kv_heads": None,
              "ffn_dim": None, "vocab_size": None, "max_seq_len": 1024, "tie_embeddings": False, "norm_eps": 1e-5,
              "init_std": 0.02, "abacus": False},
    "data": {"kind": "text", "source": None, "tokenizer": "byte", "seq_len": 1024, "val_fraction": 0.01,
             "text_field": "text", "prompt_field": "prompt", "target_field": "target", "max_digits": 40,
             "min_digits": 1, "task": None, "compat": "clean", "copy_tokens": 128, "blanks": 128, "grid_width": 64,
             "p_empty": 0.5},
    "train": {"batch_size": 512, "micro_batch_size": 8, "max_steps": 10_000, "lr": 1e-4, "min_lr": 0.0,
              "weight_decay": 0.01, "betas": [0.9, 0.999], "warmup": 0.02, "schedule": "linear", "grad_clip": 1.0,
              "precision": "auto", "seed": 0, "save_every": 1000, "keep_last": 2, "eval_every": 500,
              "eval_batches": 50, "log_every": 10, "activation_checkpointing": False, "compile": False,
              "freeze": [], "unfreeze": [], "init_from": None, "parallel": "ddp", "loggers": ["jsonl"]},
    "eval": {"max_len": None, "samples": 100, "dense_blanks": 64, "sparse_blanks": 256, "dense_grid": [64, 32, 0.2],
             "sparse_grid": [256, 128, 0.8]},
    "extend": {"method": None, "scaling": "pi", "compat": "paper", "theta": 1e6, "lora_rank": 8, "lora_alpha": 16.0,
               "lora_dropout": 0.0, "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
               "trainable": ["*embed_tokens*", "*norm*"], "group_fraction": 0.25},
}


def is_legacy(data: Any) -> bool:
    """True for a parsed recipe in 0.1's written form: the five sections, each spelling exactly 0.1's keys."""
    return (isinstance(data, dict) and set(data) == set(SCHEMA)
            and all(isinstance(data[s], dict) and set(data[s]) == set(keys) for s, keys in SCHEMA.items()))


def upgrade(data: Any) -> tuple[Any, str | None]:
    """(the recipe in today's form, a one-line note) for a 0.1 recipe; (data, None) for anything else."""
    if not is_legacy(data):
        return data, None
    from tapecli.data.build import KINDS

    kind = data["data"]["kind"]
    if kind not in KINDS:
        return data, None  # the loader names the bad kind
    schema = KINDS[kind]
    data = copy.deepcopy(data)
    data["data"] = {key: value for key, value in data["data"].items() if key in _keys(schema)}
    if schema.Eval is None:
        del data["eval"]
    else:
        data["eval"] = {key: value for key, value in data["eval"].items() if key in _keys(schema.Eval)}
    if data["extend"]["method"] is None:
        del data["extend"]
    return data, f"read in tape {VERSION}'s recipe format; the keys kind {kind} does not use are left out"


def legacy_yaml(recipe: Any, previous: Any = None) -> str:
    """The YAML 0.1's `Recipe.to_yaml()` wrote for `recipe`; keys it no longer holds, or holds but its run ignores
    (`Recipe.ignored_keys`: shipped recipes no longer spell them), come from `previous` (a parsed 0.1 recipe of the
    same run), else from 0.1's defaults."""
    held = previous if is_legacy(previous) else {}
    ignored = recipe.ignored_keys()
    out: dict[str, dict[str, Any]] = {}
    for section, defaults in SCHEMA.items():
        body = getattr(recipe, section)
        out[section] = {}
        for key, default in defaults.items():
            if f"{section}.{key}" in ignored and key in held.get(section, {}):
                value = held[section][key]
            elif body is not None and hasattr(body, key):
                value = getattr(body, key)
            else:
                value = held.get(section, {}).get(key, default)
            out[section][key] = copy.deepcopy(value)
    return yaml.safe_dump(out, sort_keys=False)


def legacy_hash(recipe: Any, previous: Path | None = None) -> str:
    """The `recipe_hash` 0.1 stored for `recipe` (see `legacy_yaml`); `previous` is the run's recipe.yaml, if any."""
    parsed = None
    if previous is not None and previous.is_file():
        try:
            parsed = yaml.safe_load(previous.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            parsed = None  # an unreadable file: 0.1's defaults stand in
    return hashlib.sha256(legacy_yaml(recipe, parsed).encode()).hexdigest()[:16]


def _keys(schema: type) -> set[str]:
    return {f.name for f in dataclasses.fields(schema)}
