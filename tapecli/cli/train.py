"""`tape pretrain`, `tape finetune`, `tape extend-context`: the training commands (tapecli.train.engine runs them)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tapecli.errors import TapeError

if TYPE_CHECKING:
    from tapecli.recipe import Recipe

_OVERRIDES_HELP = "Recipe overrides as key=value, e.g. train.max_steps=200 model.pe=rope train.lr=3e-4."
_RESUME_HELP = ("auto: continue from the newest checkpoint in --out if there is one, else start fresh; "
                "never: always start fresh; or a checkpoint / run directory to continue from.")


def pretrain(
    overrides: list[str] | None = typer.Argument(None, help=_OVERRIDES_HELP, show_default=False),
    recipe: str = typer.Option(..., "--recipe", help="A shipped recipe name (c4, c4-smoke, ...) or a YAML file."),
    out: Path = typer.Option(..., "--out", help="Run directory: recipe.yaml, run.json, metrics.jsonl, checkpoints/."),
    resume: str = typer.Option("auto", "--resume", help=_RESUME_HELP),
) -> None:
    """Train a model from scratch (or from train.init_from) as a recipe says.

    Writes recipe.yaml, run.json, metrics.jsonl and checkpoints/ into --out; a killed run continues exactly where it stopped with the same command (--resume auto).

    Data parallel: `torchrun --nproc_per_node 4 -m tapecli.cli pretrain ...` (gloo on CPU, NCCL on GPU).

    Example: `tape pretrain --recipe c4-smoke --out runs/smoke data.source=corpus/ model.pe=rope train.max_steps=50`.
    """
    from tapecli.train.engine import pretrain as run_pretrain

    command = ["tape", "pretrain", "--recipe", recipe, "--out", str(out), "--resume", resume, *(overrides or [])]
    run_pretrain(_load(recipe, overrides or []), out, resume=resume, command=command)


def finetune(
    overrides: list[str] | None = typer.Argument(None, help=_OVERRIDES_HELP, show_default=False),
    checkpoint: str | None = typer.Option(None, "--checkpoint", help="A run directory (its newest checkpoint) or "
                                          "one checkpoint directory [default: the recipe's train.init_from]."),
    recipe: str = typer.Option(..., "--recipe", help="A shipped recipe name or a YAML file; its model section may "
                               "not change the checkpoint's shapes."),
    out: Path = typer.Option(..., "--out", help="Run directory for the fine-tuned model."),
    resume: str = typer.Option("auto", "--resume", help=_RESUME_HELP),
) -> None:
    """Fine-tune a checkpoint on a recipe's data (prompt/target pairs learn the target only).

    Freeze parameters with fnmatch globs over their names; trainable and total counts are printed.

    Example: `tape finetune --checkpoint runs/c4 --recipe scrolls --out runs/ft train.freeze=['*'] train.unfreeze=['*.pe.*']`.
    """
    from tapecli.train.engine import finetune as run_finetune

    command = ["tape", "finetune", *(["--checkpoint", checkpoint] if checkpoint else []), "--recipe", recipe,
               "--out", str(out), "--resume", resume, *(overrides or [])]
    loaded = _load(recipe, overrides or [])
    what = "--checkpoint" if checkpoint else "train.init_from"
    checkpoint = checkpoint or loaded.train.init_from
    if not checkpoint:
        raise TapeError("finetune needs a model: pass --checkpoint RUN or set train.init_from=RUN")
    run_finetune(loaded, checkpoint, out, resume=resume, command=command, init_what=what)


def _load(recipe: str, overrides: list[str]) -> Recipe:
    """The recipe, its notes (an old format read, a shortened warm-up) printed once, by rank 0 under torchrun.
    Every training command is one run: once it has saved its last checkpoint, a stop request is ignored."""
    from tapecli import stops, trust
    from tapecli.recipe import load_recipe

    stops.single_run()
    trust.allow_named(overrides)  # a plugin PE named here (model.pe=kerple.py:Kerple) may be imported
    loaded = load_recipe(recipe, overrides)
    if os.environ.get("RANK", "0") == "0":
        for note in loaded.notes:
            print(f"note: {note}")
    return loaded


_BASE_HELP = ("A Hugging Face directory (config.json, *.safetensors, tokenizer) of a Llama, Mistral, Qwen2, Qwen3, "
              "SmolLM3, OLMo 2, OLMo 3, Gemma 3 (text), Cohere2, EXAONE 4 or Phi-3 / Phi-4-mini, a hub id (meta-llama/Llama-2-7b-hf: downloaded online, read from the HF cache offline), or "
              "a short name: llama2-7b, llama2-13b, llama3-8b, llama3.2-1b, mistral-7b, mistral-7b-v0.1, "
              "tinyllama, smollm2-135m, smollm2-360m, smollm2-1.7b, smollm3-3b, qwen2.5-0.5b, qwen2.5-1.5b, "
              "qwen2.5-7b, qwen3-0.6b, qwen3-1.7b, qwen3-8b.")


def extend_context(
    overrides: list[str] | None = typer.Argument(None, help=_OVERRIDES_HELP, show_default=False),
    base: str = typer.Option(..., "--base", help=_BASE_HELP + " With --method drope, also a tape run or checkpoint."),
    method: str = typer.Option("tape", "--method", help="What is trained: tape | lora | longlora | full | drope."),
    scaling: str = typer.Option(None, "--scaling", show_default=False, help="How positions reach the longer "
                                "context: pi (the default) | yarn | dynamic | theta | longrope | none (not with longlora, which "
                                "is defined with interpolation; drope takes only none, its default)."),
    compat: str = typer.Option("paper", "--compat", help="paper, or official: the official scripts' protocol (PI "
                               "under every method, theta included; TAPE's post-attention map frozen)."),
    recipe: str = typer.Option("context-extension", "--recipe", help="A shipped recipe name or a YAML file."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/extend-METHOD-SCALING)."),
    resume: str = typer.Option("auto", "--resume", help=_RESUME_HELP),
) -> None:
    """Extend a pre-trained Hugging Face model's context (Llama, Mistral, Qwen2, Qwen3, SmolLM3) from its max_position_embeddings L to model.max_seq_len N.

    Methods (all also train embeddings and norms, extend.trainable): tape adds TAPE to the base's RoPE, its new modules zero-initialised so step 0 equals the base; lora trains LoRA r=8, alpha=16 on q, k, v, o (LongLoRA's "LoRA+"); longlora adds shifted sparse attention while training (groups of N/4, half the heads shifted; evaluation uses full attention); full trains every weight.

    drope (DroPE, arXiv 2512.12167) removes the positional embedding from every layer and recalibrates every weight at the base's own length (data.seq_len at most L; recipe drope, or drope-smoke on a CPU); the model then runs at N without any scaling.

    Scalings: pi interpolates positions by N/L (the default); yarn; dynamic (NTK); theta sets the RoPE base to 1e6; longrope (LongRoPE's per-frequency factors, switched at L: model.pe_args.short_factor=[...] model.pe_args.long_factor=[...], or a Phi-3 base's own); none.

    The paper's rows: --method lora, --method longlora, --method lora --scaling theta, --method tape (all with --compat official for the official numbers).

    Checkpoints hold only the trained tensors plus a pointer to the base; `tape eval` and `tape export` open them like any other. Prints trainable and total parameter counts. A killed run continues exactly with the same command.

    Example (CPU-size, SmolLM2-135M from 8192 to 16384 tokens on short rows): tape extend-context --base smollm2-135m --recipe context-extension-smoke --method tape --out runs/ext model.max_seq_len=16384 data.source=corpus/
    """
    from tapecli.train.engine import pretrain as run_pretrain

    scaling = scaling or ("none" if method == "drope" else "pi")
    out = out or Path(f"runs/extend-{method}-{scaling}")
    command = ["tape", "extend-context", "--base", base, "--method", method, "--scaling", scaling, "--compat", compat,
               "--recipe", recipe, "--out", str(out), "--resume", resume, *(overrides or [])]
    settings = [f"extend.method={method}", f"extend.scaling={scaling}", f"extend.compat={compat}",
                f"train.init_from={base}"]
    run_pretrain(_load(recipe, [*(overrides or []), *settings]), out, resume=resume, command=command,
                 init_what="--base")

