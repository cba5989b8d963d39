"""Export a tape model as a Hugging Face directory (`tape export`), the inverse of `tapecli.model.hf.load`.

    export_hf(model, tokenizer, out, dtype=torch.bfloat16) -> out

Writes config.json (the class that runs the model, tapecli.model.hf.arch_export: Llama, Mistral with a window in every
layer, SmolLM3 with NoPE layers or windows in some layers, Qwen2 with q/k/v biases, Qwen3 with QK-norm, Phi3
(fused weights) with LongRoPE or a partial rotary, the classes of OLMo 2/3, Gemma 3, Cohere2 and EXAONE 4 for their
blocks; with `rope_parameters` for RoPE's scaling), model.safetensors (or 5 GB shards with
model.safetensors.index.json), generation_config.json and the tokenizer (tokenizer.json or tokenizer.model, with
tokenizer_config.json naming its special tokens), so `AutoModelForCausalLM.from_pretrained(out)` computes the same
logits as tape. Only layers transformers can run are exported: RoPE (any of its scalings, the same in every RoPE
layer) or NoPE, with one window size, and a plugin PE whose class defines `hf_export` (tapecli.pe; as a Llama,
every layer alike). LoRA must be merged first (`tapecli.store.door.open_model` does). Everything is written to a
temporary directory renamed into place at the end.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError

if TYPE_CHECKING:
    import torch

    from tapecli.data.tokenizer import Tokenizer
    from tapecli.model import Transformer

SHARD_BYTES = 5 * 2**30


def pe_entries(model: Transformer) -> dict[str, Any] | None:
    """The config.json entries of the model's PE (`rope_parameters`, `max_position_embeddings`): for layers of RoPE
    and NoPE, the first RoPE layer's `RoPE.hf_export` (transformers' defaults when every layer is NoPE: its NoPE
    layers ignore them); for a plugin PE whose class defines `hf_export` (tapecli.pe), its own; None when the
    model's PE has no export (a subclass of RoPE is not RoPE)."""
    from tapecli.model.hf.arch import PER_TYPE_ROPE
    from tapecli.model.hf.arch_export import block_architecture
    from tapecli.model.hybrid import layer_groups

    specs = model.config.layers()
    if all(spec.pe == "rope" for spec in specs) and block_architecture(model.config) in PER_TYPE_ROPE:
        return _per_layer_type_entries(model)
    if all(spec.pe in ("rope", "nope") for spec in specs):
        first = next((i for i, spec in enumerate(specs) if spec.pe == "rope"), None)
        if first is None:
            return {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                    "max_position_embeddings": model.config.max_seq_len}
        return layer_groups(model.model.pe, len(specs))[first][1].hf_export()
    pe = model.model.pe
    export = type(pe).__dict__.get("hf_export")
    return None if export is None else export(pe)


def _per_layer_type_entries(model: Transformer) -> dict[str, Any]:
    """Gemma 3's and OLMo 3's `rope_parameters`, one entry per layer type: the RoPE of the first full-attention
    layer and of the first sliding layer (transformers' default local RoPE, theta 1e4, where there is none)."""
    from tapecli.model.hf.arch import FULL, SLIDING
    from tapecli.model.hybrid import layer_groups

    specs = model.config.layers()
    groups = layer_groups(model.model.pe, len(specs))
    entries: dict[str, Any] = {}
    for spec, (_, pe) in zip(specs, groups, strict=True):
        entries.setdefault(SLIDING if spec.window is not None else FULL, pe.hf_export())
    entries.setdefault(SLIDING, {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}})
    lengths = {entry["max_position_embeddings"] for entry in entries.values() if "max_position_embeddings" in entry}
    if len(lengths) > 1:
        raise ValueError(f"the local and global RoPE imply max_position_embeddings {sorted(lengths)} (dynamic NTK "
                         "in one of them); a Hugging Face config has one")
    full = entries.get(FULL, entries.get(SLIDING))
    return {"rope_parameters": {kind: entries.get(kind, full)["rope_parameters"] for kind in (FULL, SLIDING)},
            "max_position_embeddings": lengths.pop() if lengths else model.config.max_seq_len}


def check_exportable(model: Transformer) -> tuple[str, dict[str, Any]]:
    """(the Hugging Face class, its layer keys) the model exports as (tapecli.model.hf.arch_export.export_layout), or a
    TapeError naming why it cannot."""
    from tapecli.model.hf.arch_export import export_layout
    from tapecli.model.hybrid import layer_groups

    c = model.config
    if c.abacus or not c.causal:
        raise TapeError("abacus embeddings / non-causal models have no Hugging Face Llama equivalent; keep the "
                        "native checkpoint")
    if any("lora_" in name for name, _ in model.named_parameters()):
        raise TapeError("merge LoRA adapters before exporting (tapecli.model.extend.lora.merge_lora)")
    try:  # a PE's export hook refuses what it cannot express (RoPE's frequency options) with a ValueError
        entries = pe_entries(model)
        for spec, (_, pe) in zip(c.layers(), layer_groups(model.model.pe, c.n_layers), strict=True):
            if spec.pe == "rope":  # every RoPE layer, not only the first, whose entries are exported
                pe.hf_export()
    except ValueError as e:
        raise TapeError(f"{e}; keep the native checkpoint, which every `tape eval` opens") from None
    if entries is None:
        pe = next((s.pe for s in c.layers() if s.pe not in ("rope", "nope")), c.pe)
        raise TapeError(f"pe {pe!r} has no Hugging Face Llama equivalent (rope and nope layers export, and plugins "
                        "whose class defines hf_export); keep the native checkpoint, which every `tape eval` opens")
    if c.pe not in ("rope", "nope"):  # a plugin with an export of its own: a Llama, every layer alike
        if c.attention_keys():
            raise TapeError(f"model {', '.join(c.attention_keys())}: a plugin PE exports as a Llama with every layer "
                            "alike; keep the native checkpoint, which every `tape eval` opens")
        return "LlamaForCausalLM", {"attention_bias": False, "mlp_bias": False}
    return export_layout(c)


def _config(model: Transformer, tokenizer: Tokenizer | None, dtype: torch.dtype) -> dict[str, Any]:
    from tapecli.model.hf.arch import model_type

    c = model.config
    arch, layers = check_exportable(model)
    entries = pe_entries(model)
    config = {
        "architectures": [arch], "model_type": model_type(arch), "vocab_size": c.vocab_size,
        "hidden_size": c.dim, "intermediate_size": c.ffn_dim, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads, "head_dim": c.head_dim,
        "max_position_embeddings": c.max_seq_len, "rms_norm_eps": c.norm_eps, "tie_word_embeddings": c.tie_embeddings,
        **({} if arch == "Gemma3ForCausalLM" else {"hidden_act": "silu"}), "initializer_range": c.init_std,
        "dtype": str(dtype).removeprefix("torch."), **entries, **layers,
    }
    if tokenizer is not None:
        config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id)
    return config


def _write_weights(model: Transformer, directory: Path, dtype: torch.dtype) -> None:
    from safetensors.torch import save_file

    from tapecli.model.hf.arch import INTERLEAVED_ROPE, interleaved_rows
    from tapecli.model.hf.fused import join_fused

    state = {name: t.detach().to("cpu", dtype) for name, t in model.state_dict().items()}
    arch = check_exportable(model)[0]
    if arch in INTERLEAVED_ROPE:  # the class's row order of q_proj and k_proj
        state = {name: interleaved_rows(t, model.config.head_dim, inverse=True)
                 if name.endswith(("q_proj.weight", "k_proj.weight")) else t for name, t in state.items()}
    state = join_fused(state, arch)  # Phi-3's qkv_proj and gate_up_proj
    if model.config.tie_embeddings:
        state.pop("lm_head.weight")
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")


def _write_tokenizer(tokenizer: Tokenizer, directory: Path) -> bool:
    """The tokenizer in Hugging Face form; False for tokenizers that have none (byte-level, arithmetic). transformers'
    AutoTokenizer adds the same special tokens by default as the tokenizer does in tape (docs/special-tokens.md):
    tokenizer.json's post-processor is rewritten when it says otherwise; a SentencePiece model gets
    add_bos_token / add_eos_token."""
    from tapecli.data.tokenizer import HFTokenizer, SentencePieceTokenizer

    before, after = tokenizer.default_specials
    if isinstance(tokenizer, HFTokenizer):
        backend = tokenizer.tk
        if tokenizer.post_processor_specials() != (before, after):
            from tokenizers import Tokenizer as HFBackend
            from tokenizers import processors

            backend = HFBackend.from_str(tokenizer.tk.to_str())  # a copy: the tokenizer in use stays as it is
            names = [tokenizer.tk.id_to_token(i) for i in [*before, *after]]
            single = " ".join([*names[:len(before)], "$A", *names[len(before):]])
            backend.post_processor = processors.TemplateProcessing(
                single=single, special_tokens=sorted(set(zip(names, [*before, *after], strict=True))))
        backend.save(str(directory / "tokenizer.json"))
        names = {"tokenizer_class": "PreTrainedTokenizerFast"}
        to_token = tokenizer.tk.id_to_token
    elif isinstance(tokenizer, SentencePieceTokenizer):
        (directory / "tokenizer.model").write_bytes(tokenizer.sp.serialized_model_proto())
        names = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": before == [tokenizer.bos_id],
                 "add_eos_token": after == [tokenizer.eos_id]}
        to_token = tokenizer.sp.id_to_piece
    else:
        return False
    tok_config = {**names, "bos_token": to_token(tokenizer.bos_id) if tokenizer.has_bos else None,
                  "eos_token": to_token(tokenizer.eos_id), "pad_token": to_token(tokenizer.pad_id)}
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    return True


def export_hf(model: Transformer, tokenizer: Tokenizer, out: str | Path, dtype: torch.dtype | None = None) -> bool:
    """Write the Hugging Face directory `out` (must not exist, or be empty); returns whether a tokenizer was
    written. `dtype` None keeps the model's parameter dtype."""
    check_exportable(model)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TapeError(f"--out {out} already exists and is not empty; choose a new directory")
    dtype = dtype or model.model.embed_tokens.weight.dtype
    temp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir(parents=True)
    try:
        _write_weights(model, temp, dtype)
        (temp / "config.json").write_text(json.dumps(_config(model, tokenizer, dtype), indent=2) + "\n")
        wrote_tokenizer = _write_tokenizer(tokenizer, temp)
        if wrote_tokenizer:
            ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
                   "pad_token_id": tokenizer.pad_id}
            (temp / "generation_config.json").write_text(json.dumps(ids, indent=2) + "\n")
    except BaseException:  # a failed write, Ctrl-C: nothing half-written stays behind (after SIGKILL: the next run)
        shutil.rmtree(temp, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()
    temp.rename(out)
    return wrote_tokenizer
