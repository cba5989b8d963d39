"""Build tiny Hugging Face Llama directories the way real ones look: transformers' `save_pretrained` (sharded) plus
a real tokenizer (a `tokenizers` BPE tokenizer.json saved through PreTrainedTokenizerFast, or a SentencePiece
model trained here)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ("the model reads a long sequence of tokens and learns where each one sits relative to the others "
         "position encoding rotary attention bias layer head train evaluate value query key").split()
VOCAB = 320  # >= the tokenizers' sizes (byte-level BPE: 256 bytes + 3 specials + merges)


def sample_text(n_sentences: int = 40, seed: int = 0) -> str:
    import random

    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) + "." for _ in range(n_sentences))


def save_bpe_tokenizer(directory: Path, vocab_size: int = 300) -> None:
    """A byte-level BPE tokenizer.json with <s>, </s> and <pad>, saved with a tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(sample_text().splitlines(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(directory)


def save_sp_tokenizer(directory: Path, vocab_size: int = 60) -> None:
    """A SentencePiece tokenizer.model (Llama 2 style: unk 0, <s> 1, </s> 2, no pad) and no tokenizer.json."""
    import sentencepiece as spm

    corpus = directory / "corpus.txt"
    corpus.write_text(sample_text())
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "tokenizer"),
                                   vocab_size=vocab_size, model_type="bpe", unk_id=0, bos_id=1, eos_id=2,
                                   pad_id=-1, minloglevel=2, num_threads=1)
    corpus.unlink()
    (directory / "tokenizer.vocab").unlink()


def make_hf_llama(directory: Path, *, n_kv_heads: int = 4, tie: bool = False, head_dim: int | None = None,
                  rope: dict | None = None, legacy: dict | None = None, tokenizer: str = "json",
                  max_position_embeddings: int = 32, shard: str = "40KB", seed: int = 0, dim: int = 64,
                  n_layers: int = 2, ffn: int = 96, vocab: int = VOCAB, extra: dict | None = None):
    """Save a random tiny Llama (4 heads) to `directory`; returns the transformers model (eval mode).

    `rope`: transformers 5 `rope_parameters`; `legacy`: rewrite config.json with the 4.x keys instead
    (`{"rope_theta": ..., "rope_scaling": {...}}`); `extra`: keys written into config.json afterwards."""
    import transformers

    kwargs = dict(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=n_layers,
                  num_attention_heads=4, num_key_value_heads=n_kv_heads,
                  max_position_embeddings=max_position_embeddings,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    if rope is not None:
        kwargs["rope_parameters"] = rope
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**kwargs)).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size=shard)
    if legacy is not None or extra:
        config = json.loads((directory / "config.json").read_text())
        if legacy is not None:
            config.pop("rope_parameters", None)
            config.update(legacy)
        config.update(extra or {})
        (directory / "config.json").write_text(json.dumps(config))
    if tokenizer == "json":
        save_bpe_tokenizer(directory)
    elif tokenizer == "sp":
        save_sp_tokenizer(directory)
    if legacy is not None:  # what transformers itself makes of the legacy keys
        model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    return model


def extended_checkpoint(base: Path, out: Path, method: str, scaling: str = "pi") -> Path:
    """A checkpoint of `tape extend-context` on `base` (built as training builds it, through the door) whose
    trained tensors (adapters, embeddings, norms, a grown PE) moved away from the base without training."""
    from tapecli.recipe import load_recipe
    from tapecli.store.checkpoint import save_model
    from tapecli.train.build import build_model

    recipe = load_recipe("context-extension-smoke", ["model.max_seq_len=64", f"extend.method={method}",
                                                     f"extend.scaling={scaling}"])
    model, tokenizer, _ = build_model(recipe, None, str(base), torch.device("cpu"), "fp32")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    return save_model(model, tokenizer, out)
