"""tape's model core: one Llama-style transformer with every positional encoding behind one switch.

    from tapecli.model import ModelConfig, Transformer, PE_NAMES
    model = Transformer(ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, pe="tape"))
    logits = model(input_ids, start_pos=0, attention_mask=None)
    out = model.generate(input_ids, max_new_tokens=8, attention_mask=None, prefill_chunk=None)  # left-padded batches

The full API (padding, positions, caches, memory) is in `transformer.py` and `generation.py`.
"""

from tapecli.model import attention
from tapecli.model.cache import KVCache
from tapecli.model.config import ModelConfig
from tapecli.model.pe import PE_NAMES, PE_REGISTRY
from tapecli.model.transformer import Transformer, count_parameters

__all__ = ["PE_NAMES", "PE_REGISTRY", "KVCache", "ModelConfig", "Transformer", "attention", "count_parameters"]
