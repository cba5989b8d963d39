"""One `tape extend-context` step with LoRA and activation checkpointing on a randomly initialised Llama: its peak
memory and step time, and what they predict for a 7B base.

    row = extend_step(device, sizes, work_dir)

The base is a transformers `LlamaForCausalLM` of `sizes["llama"]` (~1.1B parameters on a GPU: TinyLlama's shape,
max_position_embeddings 4096), randomly initialised, saved with `save_pretrained` in bf16 (fp32 on the CPU) beside
a byte-level BPE tokenizer trained on generated words; the run is the `context-extension` recipe with
`--method lora --scaling pi` to `sizes["target"]` tokens (8192), one row per step, two steps (the first warms up),
through the same engine as the command (`tapecli.train.engine.pretrain`). Peak memory:
`torch.cuda.max_memory_allocated` over the run (CUDA) or the growth of the process's peak resident set (CPU); step
time: the second step's, from metrics.jsonl.

The 7B prediction is a linear extrapolation, not a measurement: the base's weights at the measured bytes per
parameter for Llama-2-7B's 6.74B parameters, plus everything else the run held at its peak (activations kept at
layer boundaries, one layer recomputed, the trained embeddings and LoRA with their AdamW states, the logits)
scaled by layers x width (32 x 4096 against the measured base's).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

LLAMA2_7B = {"params": 6_738_415_616, "n_layers": 32, "dim": 4096}
WORDS = ("the model reads a long sequence of tokens and learns where each one sits relative to the others position "
         "encoding rotary attention bias layer head train evaluate value query key context window").split()


def save_base(directory: Path, llama: dict, device: torch.device) -> dict:
    """A random Llama of shape `llama` and a BPE tokenizer in `directory`: {"params", "weight_bytes"}."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    config = transformers.LlamaConfig(**llama, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                                      eos_token_id=2)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(directory)
    counts = {"params": sum(p.numel() for p in model.parameters()),
              "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
    del model
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(sentences(200), trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>").save_pretrained(directory)
    return counts


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 12))) + "." for _ in range(n)]


def extend_step(device: torch.device, sizes: dict, work_dir: Path) -> dict:
    from tapecli.recipe import load_recipe
    from tapecli.train.engine import pretrain

    base, corpus, run = work_dir / "base", work_dir / "corpus.txt", work_dir / "run"
    counts = save_base(base, sizes["llama"], device)
    target = sizes["target"]
    corpus.write_text("\n".join(sentences(target // 2)) + "\n")  # ~5 tokens per sentence: rows for a few steps
    overrides = [f"model.max_seq_len={target}", f"data.source={corpus}", f"data.seq_len={target}",
                 "data.val_fraction=0.1", "train.max_steps=2", "train.batch_size=1", "train.micro_batch_size=1",
                 "train.warmup=0", "train.eval_every=0", "train.save_every=1000", "train.log_every=1",
                 "train.activation_checkpointing=true", "train.loggers=[jsonl]",
                 "extend.method=lora", "extend.scaling=pi", "extend.compat=paper", f"train.init_from={base}"]
    recipe = load_recipe("context-extension", overrides)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        from tapecli.experiments.bench_step import status_kib

        Path("/proc/self/clear_refs").write_text("5")  # the peak resident set restarts from the current one
        before = status_kib("VmRSS") * 1024
    start = time.perf_counter()
    pretrain(recipe, run, resume="never", command=["tape", "extend-context", "--base", str(base), "--method", "lora",
                                                  "--scaling", "pi", "--out", str(run), *overrides[:12]],
             init_what="--base")
    total = time.perf_counter() - start
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = status_kib("VmHWM") * 1024 - before
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    elapsed = [r["elapsed"] for r in rows if "elapsed" in r]
    step_s = elapsed[1] - elapsed[0] if len(elapsed) >= 2 else None
    c = sizes["llama"]
    rest = max(peak - counts["weight_bytes"], 0)
    scale = LLAMA2_7B["n_layers"] * LLAMA2_7B["dim"] / (c["num_hidden_layers"] * c["hidden_size"])
    predicted = LLAMA2_7B["params"] * counts["weight_bytes"] / counts["params"] + rest * scale
    return {"params": counts["params"], "weight_bytes": counts["weight_bytes"], "peak_bytes": peak,
            "step_s": step_s, "run_s": total, "tokens": target, "predicted_7b_bytes": predicted,
            "fits_80gb": predicted < 80e9}
