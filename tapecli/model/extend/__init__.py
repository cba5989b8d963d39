"""Extending a base model: what `tape extend-context` and fine-tuning on a Hugging Face base add to the core.

    extended.py   a frozen Hugging Face base plus the tensors trained on top of it (build_from_base)
    lora.py       LoRA adapters on chosen linear layers (apply_lora, merge_lora)
    s2attn.py     LongLoRA's shifted sparse attention (S²-Attn), while training only
    drope.py      DroPE: the layer schedule that removes every layer's positional embedding (drope_schedule)

The transformer core (tapecli.model.transformer) knows nothing of these: each wraps or replaces its modules. A new
extension method goes here, as its own module; its plan (which keys a recipe sets) lives in `tapecli.train.extend`.
"""
