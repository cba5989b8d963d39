"""Continuing a checkpoint's training (`--resume`) must not change what the checkpoint means.

The data kind, the tokenizer (the ids it gives) and the model config of the recipe must be those the checkpoint
was trained with; otherwise the run is refused with one line, before anything in the run directory is written. A
run started from a model (`train.init_from`) keeps that model's tokenizer, so its `data.tokenizer` is not compared.
(Starting a *new* run from a checkpoint with other data is fine-tuning: `tape finetune` / `train.init_from`.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.recipe import Recipe
from tapecli.store.checkpoint import read_model_config
from tapecli.store.run import run_recipe

_INSTEAD = "use another --out for a new run, or start from it with tape finetune / train.init_from"


def check_continuation(recipe: Recipe, checkpoint: Path, tokenizer: Any, config: Any) -> None:
    """`tokenizer` is the checkpoint's own; `config` is the ModelConfig the recipe builds from the checkpoint."""
    from tapecli.data.tokenizer import tokenizer_fingerprint

    previous = run_recipe(checkpoint)  # None for a bare checkpoint directory
    if previous is not None and previous.data.kind != recipe.data.kind:
        raise TapeError(f"data.kind: the recipe says {recipe.data.kind!r} but {checkpoint} was trained on "
                        f"{previous.data.kind!r} data; {_INSTEAD}")
    uses_its_own = "data.tokenizer" in recipe.ignored_keys()  # train.init_from: the model's tokenizer serves
    if not uses_its_own and (previous is None or previous.data.tokenizer != recipe.data.tokenizer):
        wanted = recipe.data.open_tokenizer(recipe.model.vocab_size)
        if tokenizer_fingerprint(wanted) != tokenizer_fingerprint(tokenizer):
            raise TapeError(f"data.tokenizer: {recipe.data.tokenizer!r} is not the tokenizer {checkpoint} was "
                            f"trained with; {_INSTEAD}")
    saved, built = _as_built(read_model_config(checkpoint)), config.to_dict()
    # pe_plugin records where a plugin's code came from; a newer version of it may continue the run (the door
    # notes the change when it opens the checkpoint).
    changed = sorted(k for k in saved.keys() | built.keys() if saved.get(k) != built.get(k) and k != "pe_plugin")
    if changed:
        key = changed[0]
        raise TapeError(f"model.{key}: the recipe asks for {built.get(key)!r} but {checkpoint} has "
                        f"{saved.get(key)!r}; a continued run keeps its model ({_INSTEAD})")


def _as_built(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved model config with the keys it predates at their defaults (what they meant then), so a run of an
    earlier version continues; left as saved when it does not build (the comparison then names the key)."""
    from tapecli.model import ModelConfig

    try:
        return ModelConfig.from_dict(saved).to_dict()
    except (TypeError, ValueError):
        return saved
