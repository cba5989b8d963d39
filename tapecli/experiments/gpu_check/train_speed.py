"""Training throughput of the `c4` recipe's model (12 layers x 768, ~162M parameters, 8 x 1024 tokens per step)
per PE, eager and compiled, beside transformers' `LlamaForCausalLM` of the same shape, in one process.

    rows = train_speed(device, sizes, pes=("rope", "tape", "alibi", "fire"), deadline=...)
    jobs = warm_jobs(pes, sizes, "cuda")    # the same variants' first steps, for gpu_check/warm.py's workers

A step is what training does: forward under bf16 autocast (CUDA; fp32 on the CPU), cross-entropy, backward, AdamW.
Each variant is built, warmed up (compiled during its warm-up when compiled, with sizes["compile_backend"]; None:
inductor), timed over `steps` steps and freed before the next: RoPE and the Llama eager then compiled first, then
the other PEs eager, then compiled (unless sizes["compile_others"] is false); none is started after `deadline`
(time.monotonic()). On a GPU, gpu-check first runs each variant's first step in parallel worker processes
(`warm_job`), so that the compilations here are mostly lookups in inductor's on-disk caches; both compile in a fresh
dynamo for static shapes, so that a variant's graphs do not depend on the variants compiled before it.
Tokens/s counts the input tokens of the timed steps; MFU = tokens/s x FLOPs per token / the GPU's peak dense bf16
FLOP/s, FLOPs per token = 6 N (N: the parameters of every matrix multiply, the LM head included, the embedding
table not) + 6 L d T (causal attention's q.k and p.v, forward and backward: 12 L d T halved by causality).
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch

# Peak dense bf16 tensor-core FLOP/s by device name (vendor data sheets); a GPU not listed gets no MFU.
PEAK_BF16 = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def flops_per_token(n_matmul: int, n_layers: int, dim: int, seq_len: int) -> float:
    return 6 * n_matmul + 6 * n_layers * dim * seq_len


@functools.cache
def c4_model_keys(overrides: tuple[str, ...]) -> dict:
    from tapecli.recipe import load_recipe

    return load_recipe("c4", list(overrides)).model_config_kwargs()


def c4_config(sizes: dict, pe: str):
    """The `c4` recipe's model with `pe`, sizes["overrides"] applied to the recipe (the --cpu mode's toy sizes)."""
    from tapecli.model import ModelConfig

    return ModelConfig(**{**c4_model_keys(tuple(sizes["overrides"])), "pe": pe, "pe_args": {}})


def tape_model(pe: str, sizes: dict, device: torch.device) -> torch.nn.Module:
    from tapecli.model import Transformer

    torch.manual_seed(0)
    model = Transformer(c4_config(sizes, pe)).to(device).train()
    return model


def hf_llama(sizes: dict, device: torch.device) -> torch.nn.Module:
    """transformers' Llama of the c4 model's shape (SDPA attention; FlashAttention-2 when flash-attn is installed)."""
    import transformers

    from tapecli.model.attention.dense import flash_attn_applies

    c = c4_config(sizes, "rope")
    config = transformers.LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim,
                                      num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                                      num_key_value_heads=c.n_kv_heads or c.n_heads,
                                      max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
                                      tie_word_embeddings=c.tie_embeddings)
    attn = "flash_attention_2" if flash_attn_applies(device.type, torch.bfloat16) else "sdpa"
    torch.manual_seed(0)
    config._attn_implementation = attn  # what from_pretrained(attn_implementation=...) sets
    model = transformers.LlamaForCausalLM(config).to(device).train()
    model.hf_attention = attn
    return model


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, device: torch.device,
         hf: bool) -> None:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = model(batch[:, :-1])
        logits = out.logits if hf else out
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def prepare(pe: str | None, device: torch.device, sizes: dict, compiled: bool):
    """A variant ready to step: (model, what to call: the model or its torch.compile, AdamW, one batch)."""
    model = tape_model(pe, sizes, device) if pe else hf_llama(sizes, device)
    c = c4_config(sizes, "rope")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model, backend=sizes["compile_backend"] or "inductor") if compiled else model
    batch = torch.randint(0, c.vocab_size, (sizes["batch"], c.max_seq_len + 1),
                          generator=torch.Generator().manual_seed(0)).to(device)
    return model, run, optimizer, batch


def time_variant(pe: str | None, device: torch.device, sizes: dict, compiled: bool) -> dict:
    """One variant's row (module docstring); pe None: transformers' Llama."""
    model, run, optimizer, batch = prepare(pe, device, sizes, compiled)
    n_params = sum(p.numel() for p in model.parameters())
    embedding = model.model.embed_tokens.weight.numel()
    c = c4_config(sizes, "rope")
    start = time.perf_counter()
    for _ in range(sizes["warmup"]):
        step(run, optimizer, batch, device, pe is None)
    sync(device)
    warm = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(sizes["steps"]):
        step(run, optimizer, batch, device, pe is None)
    sync(device)
    seconds = (time.perf_counter() - start) / sizes["steps"]
    tokens_per_s = sizes["batch"] * c.max_seq_len / seconds
    peak = peak_flops(device)
    fpt = flops_per_token(n_params - embedding, c.n_layers, c.dim, c.max_seq_len)
    return {"step_s": seconds, "tokens_per_s": tokens_per_s, "params": n_params, "warmup_s": warm,
            "mfu": tokens_per_s * fpt / peak if peak else None, "attention": getattr(model, "hf_attention", None)}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def variants(pes: tuple[str, ...], sizes: dict) -> list[tuple[str, str | None, bool]]:
    """(label, PE or None for transformers' Llama, compiled) in the order they run: the pairs to compare first (RoPE
    and the Llama, eager then compiled), then each other PE eager, then compiled, as long as the budget lasts: a PE
    whose kernels take long to compile cannot crowd out the comparison."""
    chosen = [(pes[0], pes[0], False), ("transformers Llama", None, False),
              (f"{pes[0]}, compiled", pes[0], True), ("transformers Llama, compiled", None, True)]
    chosen += [(pe, pe, False) for pe in pes[1:]]
    if sizes["compile_others"]:  # (--cpu: a second each through dynamo, and nothing more to show at toy sizes)
        chosen += [(f"{pe}, compiled", pe, True) for pe in pes[1:]]
    return chosen


def recorded(compiled: bool):
    """The context a variant steps in: the attention paths its eager steps take are recorded (a list); a compiled
    graph records nothing (a recording list it appended to would change between calls and recompile it each step)."""
    from tapecli.model import attention

    return attention.recording() if not compiled else contextlib.nullcontext([])


def warm_jobs(pes: tuple[str, ...], sizes: dict, device: str) -> dict[str, dict]:
    """The compile-ahead jobs (gpu_check/warm.py) of the variants, each run by `warm_job` in a worker process: the
    compiled ones first (the longest), then the eager ones (FlexAttention compiles its kernels for some)."""
    ordered = sorted(variants(pes, sizes), key=lambda variant: not variant[2])
    return {label: {"module": __name__, "variant": [label, pe, compiled], "sizes": sizes, "device": device}
            for label, pe, compiled in ordered}


def warm_job(job: dict) -> None:
    """A compile-ahead worker: the first step of one variant, as `train_speed` takes it (statically shaped, in a
    fresh dynamo), which compiles what that step compiles into inductor's on-disk caches."""
    from tapecli.experiments.gpu_check import warm

    label, pe, compiled = job["variant"]
    device = torch.device(job["device"])

    def first_step() -> None:
        _, run, optimizer, batch = prepare(pe, device, job["sizes"], compiled)
        with recorded(compiled):
            step(run, optimizer, batch, device, pe is None)
        sync(device)

    with warm.static_shapes():
        warm.step_line(label, first_step)


def train_speed(device: torch.device, sizes: dict, pes: tuple[str, ...], deadline: float, result: dict,
                log=print) -> dict:
    """Fills `result` as it goes (module docstring): {"variants": [label, ...] (all, in order), "rows": {label:
    {...}}, "failed": {label: error}}; a variant in neither was left out. Returns `result`. Each variant starts in a
    fresh dynamo and compiles for static shapes, as the compile-ahead workers did (`warm_job`)."""
    import torch._dynamo

    from tapecli.experiments.gpu_check import warm
    from tapecli.faults import failure_line

    chosen = variants(pes, sizes)
    c = c4_config(sizes, "rope")
    shape = (f"{c.n_layers} layers x {c.dim} wide, {c.n_heads} heads, FFN {c.ffn_dim}, vocabulary {c.vocab_size}; "
             f"{sizes['batch']} x {c.max_seq_len} tokens per step, "
             + ("bf16 autocast" if device.type == "cuda" else "fp32")
             + f", AdamW; {sizes['warmup']} warm-up steps, then the mean of {sizes['steps']}")
    result |= {"variants": [label for label, _, _ in chosen], "rows": {}, "failed": {}, "shape": shape}
    for label, pe, compiled in chosen:
        if time.monotonic() > deadline:
            break
        torch._dynamo.reset()
        try:
            with warm.static_shapes(), recorded(compiled) as taken:
                row = time_variant(pe, device, sizes, compiled)
        except Exception as e:  # noqa: BLE001 - one variant's failure is its row; the others still run
            result["failed"][label] = failure_line(e)
            log(f"  {label}: failed: {result['failed'][label]}")
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        eager = result["rows"].get(label.removesuffix(", compiled"), {}).get("attention", "-")
        row["attention"] = row["attention"] or (eager if compiled else ", ".join(sorted(set(taken))) or "-")
        result["rows"][label] = row
        mfu = f"{100 * row['mfu']:.1f} %" if row["mfu"] is not None else "-"
        log(f"  {label:<30} {row['attention']:<20} {1000 * row['step_s']:9.1f} ms/step {row['tokens_per_s']:11,.0f} "
            f"tokens/s  MFU {mfu}  ({row['params'] / 1e6:.1f}M parameters, warm-up {row['warmup_s']:.1f} s)")
    return result
