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


# The tokenizer behaviours real Hugging Face models have, as `save_styled_tokenizer` builds them:
#   llama2   a SentencePiece model converted by transformers' LlamaTokenizer (add_bos_token: true): adds <s>
#   smollm2  byte-level BPE, ByteLevel post-processor (GPT2Tokenizer; BOS <|im_start|>): adds nothing
#   llama3   byte-level BPE, specials at the end of the vocabulary, a template adding <|begin_of_text|>
#   qwen     byte-level BPE, `bos_token: null` (no BOS at all; lm-eval starts an empty context with EOS)
TOKENIZER_STYLES = ("llama2", "smollm2", "llama3", "qwen")


def _byte_level_bpe(texts: list[str], vocab_size: int, specials: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    return tk


def save_styled_tokenizer(directory: Path, style: str, texts: list[str]):
    """Save a tokenizer of `style` (see TOKENIZER_STYLES) trained on `texts` with transformers' save_pretrained, as
    AutoTokenizer loads it offline; returns the transformers tokenizer."""
    import sentencepiece as spm
    from tokenizers import processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    if style == "llama2":
        spm_dir = directory / "spm"
        spm_dir.mkdir()
        (spm_dir / "corpus.txt").write_text("\n".join(texts))
        spm.SentencePieceTrainer.train(input=str(spm_dir / "corpus.txt"), model_prefix=str(spm_dir / "tokenizer"),
                                       vocab_size=120, model_type="bpe", unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                                       byte_fallback=False, minloglevel=2, num_threads=1)
        (spm_dir / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
        tokenizer = AutoTokenizer.from_pretrained(spm_dir)
        tokenizer.save_pretrained(directory)
        import shutil

        shutil.rmtree(spm_dir)
    elif style == "smollm2":
        tk = _byte_level_bpe(texts, 300, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                            pad_token="<|im_end|>", unk_token="<|endoftext|>")
        tokenizer.save_pretrained(directory)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    elif style == "llama3":
        tk = _byte_level_bpe(texts, 300, [])
        tk.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"])
        begin = tk.token_to_id("<|begin_of_text|>")
        tk.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                          special_tokens=[("<|begin_of_text|>", begin)])
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|begin_of_text|>",
                                            eos_token="<|end_of_text|>", pad_token="<|finetune_right_pad_id|>")
        tokenizer.save_pretrained(directory)
    elif style == "qwen":
        tk = _byte_level_bpe(texts, 300, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
        tokenizer.save_pretrained(directory)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        (directory / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": None}))
    else:
        raise ValueError(style)
    return AutoTokenizer.from_pretrained(directory)


def make_trained_llama(directory: Path, style: str, text: str, steps: int = 40, max_position_embeddings: int = 256):
    """A 2-layer Llama (GQA, untied head) with a `style` tokenizer, trained `steps` steps on `text` so that its
    greedy choices are not all alike, saved with save_pretrained; returns the directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = save_styled_tokenizer(directory, style, [text] * 4)
    eos = tokenizer.eos_token_id
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=eos,
                         pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    ids = torch.tensor([tokenizer(text).input_ids[:max_position_embeddings]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    model.save_pretrained(directory)
    return directory


def make_hf_model(directory: Path, arch: str, *, seed: int = 0, perturb: float = 0.1, drop: tuple[str, ...] = (),
                  **config) -> torch.nn.Module:
    """Save a random tiny model of transformers class `arch` (e.g. "Qwen2ForCausalLM"; 4 layers, 4 heads, 2 KV
    heads, hidden 64, BPE tokenizer) built with `config` over those sizes; returns it (eval mode). Every parameter
    (norms, biases, q/k norms included) moves by N(0, perturb) so none is at its neutral initial value. `drop`:
    keys removed from config.json afterwards (as older transformers versions wrote it)."""
    import transformers

    kwargs = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    kwargs.update(config)
    cls = getattr(transformers, arch)
    torch.manual_seed(seed)
    model = cls(cls.config_class(**kwargs)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * perturb)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if drop:
        saved = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k not in drop}))
    save_bpe_tokenizer(directory)
    return model
