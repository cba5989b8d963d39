"""A model made of a frozen Hugging Face base plus what is trained on top of it (`tape extend-context`).

    model = build_from_base(config, base_dir, dtype=torch.bfloat16, device="cuda", lora=LoraSpec())

`config` is the base's configuration after `tapecli.model.merge` (same shapes; the PE may have grown from rope to
tape, and max_seq_len / RoPE scaling may differ). The base's weights are assigned from its safetensors (meta device,
one copy, `tapecli.model.hf.load`); the parameters the base lacks (the grown PE's) are created and initialised as in a
fresh model, so TAPE's updates start at exactly zero; LoRA adapters (B = 0) are added last. So the model starts
computing exactly what the base computes under the same RoPE scaling.

Checkpoints of such a model hold only its own tensors (new or trainable ones) plus `base_model` (where the base was
imported from); `tapecli.store.checkpoint` writes them and `tapecli.store.door` opens them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tapecli.errors import TapeError

if TYPE_CHECKING:
    import torch

    from tapecli.model.config import ModelConfig
    from tapecli.model.extend.lora import LoraSpec
    from tapecli.model.transformer import Transformer


def init_new_parameters(model: Transformer, device: torch.device | str, base_dir: Path) -> set[str]:
    """Allocate and initialise the parameters still on the meta device, which must all belong to the positional
    encoding (any other is one line: the base `base_dir` lacks it); same initialisation as a fresh `Transformer`
    (N(0, init_std), then the PE's own `init_weights`)."""
    from torch import nn

    from tapecli.model.hf.load import require_weights
    from tapecli.model.pe import LayerPE

    pending = {name for name, p in model.named_parameters() if p.is_meta}
    for module in model.modules():
        if isinstance(module, LayerPE) and any(p.is_meta for p in module.parameters()):
            module.to_empty(device=device)
            for sub in module.modules():
                if isinstance(sub, nn.Linear):
                    nn.init.normal_(sub.weight, mean=0.0, std=model.config.init_std)
            module.init_weights()
    require_weights(base_dir, {name for name, p in model.named_parameters() if p.is_meta})
    return pending


def build_from_base(config: ModelConfig, base_dir: Path, *, dtype: torch.dtype, device: torch.device | str,
                    lora: LoraSpec | None = None) -> Transformer:
    """The base's weights in `dtype` under `config`, new PE parameters initialised (fp32), LoRA applied."""
    from tapecli.model.extend.lora import apply_lora
    from tapecli.model.hf.load import build_on_meta, load_hf_weights

    model = build_on_meta(config)
    load_hf_weights(model, base_dir, dtype, device)
    new = init_new_parameters(model, device, base_dir)
    if lora is not None:
        try:
            new |= set(apply_lora(model, lora))
        except ValueError as e:
            raise TapeError(f"extend.lora_targets: {e}") from None
    model.new_parameters = new
    return model
