"""The model (and tokenizer) a run trains, and which of its parameters train; called by `engine.setup`.

    model, tokenizer, note = build_model(recipe, resume_from, init_from, device)

Four starts:
- from scratch: the recipe's model and tokenizer;
- from a tape checkpoint (`tape finetune`, `train.init_from`, or resuming): its config merged with the keys the
  recipe set (`tapecli.model.merge`), its weights, its tokenizer;
- from a Hugging Face base (`train.init_from` a HF directory / hub id / short name, as `tape extend-context --base`
  sets it): the base's weights and tokenizer; with `extend.method` set, the plan of `tapecli.train.extend` (grown PE,
  LoRA, S²-Attn, the method's trainable set); otherwise a plain fine-tune of the base;
- resuming a run on a HF base: the base again (from the checkpoint's base_model.json) plus the checkpoint's tensors.
Parameters then train as `train.freeze` / `train.unfreeze` say, or as the extension plan says. Over a frozen bf16
base, the trainable parameters are kept in fp32 (the optimizer's master copy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tapecli import faults
from tapecli.errors import TapeError
from tapecli.recipe import Recipe
from tapecli.store.checkpoint import (
    BASE_MODEL,
    load_checkpoint_tokenizer,
    load_merged_on_base,
    load_weights,
    read_model_config,
    resolve_checkpoint,
)
from tapecli.train.freeze import apply_freeze, apply_plan


def build_model(recipe: Recipe, resume_from: Path | None, init_from: str | None,
                device: torch.device) -> tuple[nn.Module, Any, str | None]:
    """(model on `device`, tokenizer, a line saying where the weights came from or None)."""
    from tapecli.model.hf import is_hf_source

    if resume_from is not None and (resume_from / BASE_MODEL).is_file():
        record = json.loads((resume_from / BASE_MODEL).read_text())
        return _on_base(recipe, record["source"], record, resume_from, device)
    if resume_from is None and init_from and is_hf_source(init_from):
        return _on_base(recipe, init_from, None, None, device)
    if recipe.extend is not None:
        raise TapeError("extend.method: a context extension starts from a Hugging Face base "
                        "(tape extend-context --base DIR_OR_ID)")
    init = resolve_checkpoint(init_from) if init_from and resume_from is None else None
    weights_from = resume_from or init
    model, tokenizer = _tape_model(recipe, weights_from)
    apply_freeze(model, recipe.train.freeze, recipe.train.unfreeze)
    return model.to(device), tokenizer, None if init is None else f"initialised from {init}"


def _tape_model(recipe: Recipe, checkpoint: Path | None) -> tuple[nn.Module, Any]:
    from tapecli.data.tokenizer import load_tokenizer
    from tapecli.model import ModelConfig, Transformer
    from tapecli.model.merge import merge_model_config, new_parameter_names

    if checkpoint is not None:
        config, grown = merge_model_config(read_model_config(checkpoint), recipe.set_values("model"), str(checkpoint))
        if (checkpoint / BASE_MODEL).is_file():  # an extended run's checkpoint: opened as a whole, LoRA merged
            if grown:
                raise TapeError(f"model.pe: {checkpoint} sits on a frozen base; grow its PE with extend-context")
            model = load_merged_on_base(checkpoint, config, dtype=torch.float32, device="cpu")
        else:
            model = Transformer(config)
            load_weights(model, checkpoint, missing_ok=new_parameter_names(model) if grown else set())
        return model, load_checkpoint_tokenizer(checkpoint)
    with faults.reading(recipe.data.tokenizer):
        tokenizer = load_tokenizer(recipe.data.tokenizer)
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


def _on_base(recipe: Recipe, source: str, record: dict | None, resume_from: Path | None,
             device: torch.device) -> tuple[nn.Module, Any, str]:
    from tapecli.model.extended import base_record, build_from_base, find_base
    from tapecli.model.hf import hf_model_config, load_hf_tokenizer, read_hf_config, resolve_hf_source
    from tapecli.model.merge import merge_model_config
    from tapecli.train.extend import plan_extension

    directory = find_base(record) if record is not None else resolve_hf_source(source)
    hf = read_hf_config(directory)
    base = hf_model_config(hf).to_dict()
    plan = plan_extension(recipe, base, source) if recipe.extend is not None else None
    if plan is not None:
        config, lora = plan.config, plan.lora
    else:
        config, lora = merge_model_config(base, recipe.set_values("model"), source)[0], None
    dtype = torch.bfloat16 if recipe.train.precision == "bf16" else torch.float32
    model = build_from_base(config, directory, dtype=dtype, device=device, lora=lora)
    model.base_model = base_record(source, directory, lora)
    if plan is not None:
        apply_plan(model, plan)
    else:
        apply_freeze(model, recipe.train.freeze, recipe.train.unfreeze)
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    if resume_from is not None:
        load_weights(model, resume_from, missing_ok=set(model.state_dict()))
        tokenizer = load_checkpoint_tokenizer(resume_from)
    else:
        tokenizer = load_hf_tokenizer(directory, hf)
    new = sum(p.numel() for name, p in model.named_parameters() if name in model.new_parameters)
    note = f"base model {source} ({directory}); {new:,} new parameters"
    if plan is not None:
        note = f"{plan.summary}\n{note}"
    return model, tokenizer, note
