"""The model (and tokenizer) a run trains, and which of its parameters train; called by `tapecli.train.setup.setup`.

    model, tokenizer, note = build_model(recipe, resume_from, init_from, device, precision)

A run starts from scratch (the recipe's model and tokenizer), or from weights opened through the one door
(`tapecli.store.door`, which decides where they come from):
- a tape checkpoint (`tape finetune`, `train.init_from`, or resuming): its config merged with the keys the recipe
  set (`tapecli.model.merge`), its weights, its tokenizer; an extended checkpoint opens as a whole, LoRA merged;
- a Hugging Face base (`train.init_from` a HF directory / hub id / short name, as `tape extend-context --base`
  sets it), or a run on one being resumed: with `extend.method` set, the plan of `tapecli.train.extend` (grown PE,
  LoRA, S²-Attn, the method's trainable set); otherwise a plain fine-tune of the base;
- a tape checkpoint under `extend.method: drope` (DroPE needs no Hugging Face base): its layers made NoPE.
Parameters then train as `train.freeze` / `train.unfreeze` say, or as the extension plan says. The weights' dtype
follows `tapecli.runtime.training_dtype`; over a frozen bf16 base the trainable parameters are cast to fp32 (the
optimizer's master copy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from tapecli.errors import TapeError
from tapecli.recipe import Recipe
from tapecli.runtime import training_dtype
from tapecli.store.door import (
    HF_KINDS,
    MODEL_KINDS,
    Source,
    base_config,
    find_source,
    open_model,
)
from tapecli.train.freeze import apply_freeze, apply_plan


def build_model(recipe: Recipe, resume_from: Path | None, init_from: str | None, device: torch.device,
                precision: str, init_what: str = "train.init_from") -> tuple[nn.Module, Any, str | None]:
    """(model on `device`, tokenizer, a line saying where the weights came from or None). `precision` is the
    resolved train.precision; `init_what` the option or recipe key that gave `init_from` (--checkpoint, --base,
    train.init_from), named by its errors."""
    spec = resume_from or init_from
    if spec is None:
        model, tokenizer = _fresh_model(recipe)
        apply_freeze(model, recipe.train.freeze, recipe.train.unfreeze)
        return model.to(device), tokenizer, None
    what = "--resume" if resume_from is not None else init_what
    drope = recipe.extends and recipe.extend.method == "drope"  # also on tape's own checkpoints
    source = find_source(str(spec), what, HF_KINDS if recipe.extends and resume_from is None and not drope
                         else MODEL_KINDS)
    if source.kind == "hf" or (resume_from is not None and source.base is not None):
        return _on_base(recipe, source, device, precision)
    if drope:
        return _drope_on_checkpoint(recipe, source, resume_from is not None, device, precision)
    if recipe.extends:
        raise TapeError("extend.method: a context extension starts from a Hugging Face base "
                        "(tape extend-context --base DIR_OR_ID); only --method drope also starts from a tape run")
    opened = open_model(source, device=device, dtype=training_dtype(precision, on_base=False),
                        model_keys=recipe.set_values("model"))
    apply_freeze(opened.model, recipe.train.freeze, recipe.train.unfreeze)
    return opened.model, opened.tokenizer, None if resume_from is not None else f"initialised from {source.checkpoint}"


def _fresh_model(recipe: Recipe) -> tuple[nn.Module, Any]:
    from tapecli.model import ModelConfig, Transformer

    tokenizer = recipe.data.open_tokenizer(recipe.model.vocab_size)
    kwargs = recipe.model_config_kwargs(tokenizer.vocab_size)
    if kwargs["abacus"]:
        digits = getattr(tokenizer, "digit_ids", None)
        if digits is None:
            raise TapeError("model.abacus: needs a tokenizer with digit ids (data.tokenizer: addition)")
        kwargs["abacus_digit_ids"] = list(digits)
    try:
        return Transformer(ModelConfig.from_dict(kwargs)), tokenizer
    except ValueError as e:
        raise TapeError(f"recipe: {e}") from None


def _drope_on_checkpoint(recipe: Recipe, source: Source, resuming: bool, device: torch.device,
                         precision: str) -> tuple[nn.Module, Any, str | None]:
    """DroPE on a tape checkpoint: its every layer made NoPE (the plan of `tapecli.train.extend`), every weight
    trained; a run being resumed already holds the DroPE model."""
    from tapecli.store.checkpoint import read_model_config
    from tapecli.train.extend import plan_extension

    dtype = training_dtype(precision, on_base=False)
    if resuming:
        opened = open_model(source, device=device, dtype=dtype)
        apply_freeze(opened.model, [], [])
        return opened.model, opened.tokenizer, None
    plan = plan_extension(recipe, read_model_config(source.checkpoint), str(source.checkpoint))
    opened = open_model(source, device=device, dtype=dtype, config=plan.config)
    apply_freeze(opened.model, [], [])
    return opened.model, opened.tokenizer, f"{plan.summary}\ninitialised from {source.checkpoint}"


def _on_base(recipe: Recipe, source: Source, device: torch.device, precision: str) -> tuple[nn.Module, Any, str]:
    """A model on a frozen Hugging Face base: a fresh start from the base, or a run on one being resumed."""
    from tapecli.train.extend import plan_extension

    plan = None
    if recipe.extends:
        base, origin = base_config(source)
        plan = plan_extension(recipe, base, origin)
    change: dict[str, Any] = ({"config": plan.config, "lora": plan.lora} if plan is not None else
                              {"model_keys": recipe.set_values("model")})
    opened = open_model(source, device=device, dtype=training_dtype(precision, on_base=True), keep_base=True,
                        **change)
    model = opened.model
    if plan is not None:
        apply_plan(model, plan)
    else:
        apply_freeze(model, recipe.train.freeze, recipe.train.unfreeze)
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    new = sum(p.numel() for name, p in model.named_parameters() if name in model.new_parameters)
    note = f"base model {model.base_model['source']} ({model.base_model['directory']}); {new:,} new parameters"
    if plan is not None:
        note = f"{plan.summary}\n{note}"
    return model, opened.tokenizer, note
