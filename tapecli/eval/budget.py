"""Whether a long-context evaluation's longest prompt fits, checked before any prompt is built or model opened.

    check_prompt(model, config, opening, batch_size, tokens, setting)     # TapeError when it cannot fit

Every long-context evaluation (`tape eval kv-retrieval`, `latent-list`, `babilong`, `ruler`, `passkey`) estimates
the tokens of its longest prompt from its options (and, where the length is not given in tokens, from the model's
tokenizer on a small instance), and asks this one check whether generating from it fits. The memory of a prompt of
T tokens, `batch_size` prompts at a time, at this model's width, in the dtype it is evaluated in (`estimate`):

  weights      the parameters, counted from the configuration (embeddings, attention, the SwiGLU MLP)
  kv cache     2 x n_kv_heads x head_dim values per token and layer; a windowed layer keeps only its window
  activations  the prefill runs a layer at a time over the whole prompt: about 8 x dim + 4 x ffn_dim values per
               token (the hidden state and its norm, q, k, v, the attention output, the MLP's three ffn-wide
               tensors); attention itself takes a chunk of queries at a time on every path a long prompt takes
               (the chunked CPU kernel, SDPA's and flash's fused kernels, FlexAttention), at most 32 MiB per chunk;
               a non-causal model's dense path holds n_heads x T x T scores
  prompt       the text, its token list and ids on the host: about 100 bytes per token

The sum is compared with the memory free where the model runs: the host's available memory (Linux's MemAvailable)
on the CPU, the device's free memory on CUDA. A prompt that does not fit is refused in one line naming the model,
the setting, the estimated tokens and both sizes, and what to lower.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tapecli.errors import TapeError

PROMPT_BYTES = 100  # per token on the host: the prompt text, the Python token list, the id tensor
ATTENTION_BYTES = 32 << 20  # one chunk of attention scores (tapecli.model.attention.chunked.CHUNK_ELEMENTS in fp32)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def parameters(config: Any) -> int:
    """The parameter count a configuration implies (embeddings, attention, MLP, norms; a PE's own are small)."""
    H, G, d, dim, ffn = config.n_heads, config.n_kv_heads, config.head_dim, config.dim, config.ffn_dim
    layer = dim * (H + 2 * G) * d + H * d * dim + 3 * dim * ffn + 2 * dim
    return config.vocab_size * dim * (1 if config.tie_embeddings else 2) + config.n_layers * layer + dim


def estimate(config: Any, tokens: int, batch_size: int, dtype: str) -> dict[str, int]:
    """Bytes each part needs to generate from `batch_size` prompts of `tokens` tokens (module docstring)."""
    size = DTYPE_BYTES.get(dtype, 4)
    kv = sum(2 * config.n_kv_heads * config.head_dim * min(tokens, spec.window or tokens) for spec in config.layers())
    # Causal attention takes a chunk of queries at a time on every path; a non-causal model's is the dense [T, T].
    attention = ATTENTION_BYTES if config.causal else batch_size * config.n_heads * tokens * tokens * 4
    return {"weights": parameters(config) * size, "kv cache": batch_size * kv * size,
            "activations": batch_size * tokens * (8 * config.dim + 4 * config.ffn_dim) * size + attention,
            "prompt": batch_size * tokens * PROMPT_BYTES}


def available(device: str) -> tuple[int, str]:
    """(bytes free where the model runs, how that was read)."""
    import torch

    from tapecli.runtime import resolve_device

    where = resolve_device(device)
    if where.type == "cuda":
        return torch.cuda.mem_get_info(where)[0], f"free on {where}"
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available on this machine"
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "on this machine"


def _gib(n: float) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n:.0f} B"


def check_prompt(model: str, config: Any, opening: Any, batch_size: int, tokens: int, setting: str) -> None:
    """Refuse in one line (module docstring) when `batch_size` prompts of about `tokens` tokens (the longest of
    `setting`, e.g. "--keys 100000") do not fit in the memory free where `model` is evaluated."""
    need = estimate(config, tokens, batch_size, opening.dtype_name())
    free, where = available(opening.device)
    total = sum(need.values())
    if total <= free:
        return
    parts = ", ".join(f"{name} {_gib(size)}" for name, size in need.items())
    batch = f" x {batch_size} prompts at a time" if batch_size > 1 else ""
    raise TapeError(f"--model {model}: {setting} makes prompts of about {tokens:,} tokens{batch}, which need about "
                    f"{_gib(total)} at this model's width (dim {config.dim}, {config.n_layers} layers; {parts}) and "
                    f"{_gib(free)} is {where}; lower {setting.split()[0]}" + (" or --batch-size" if batch else ""))
