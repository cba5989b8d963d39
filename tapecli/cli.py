"""The `tape` command line. Each command imports its heavy modules lazily so `tape --help` stays fast.

Every command runs inside one error boundary (`tapecli.faults.boundary`, entered by the root group): user
mistakes and faults (unreadable or corrupt files, a full disk, out of memory) print one line and exit 2 (bad
input) or 1 (failed run); real bugs keep their traceback. `tape --debug ...` or `TAPE_DEBUG=1` shows tracebacks.
"""

from __future__ import annotations

from pathlib import Path

import click
import typer
from typer.core import TyperGroup

from tapecli import faults
from tapecli.cli_eval import eval_app
from tapecli.errors import TapeError


class _Guarded(TyperGroup):
    """The root group: every command (and sub-command) runs inside the fault boundary."""

    def invoke(self, ctx: click.Context) -> object:
        with faults.boundary():
            return super().invoke(ctx)


app = typer.Typer(
    name="tape",
    help="Train and evaluate positional encodings (RoPE, ALiBi, FIRE, xPos, NoPE, RandPE, T5 bias, TAPE, CoPE, PaTH).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Guarded,
)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="TAPE_DEBUG",
                                     help="Show the full traceback of any error (also: TAPE_DEBUG=1).")) -> None:
    faults.set_debug(debug)


@app.command()
def bench(
    pes: str = typer.Option("nope,rope,randpe,alibi,fire,xpos,t5,tape,cope,path", "--pe",
                            help="Comma-separated PEs to time."),
    n_layers: int = typer.Option(4, help="Decoder layers."),
    dim: int = typer.Option(256, help="Hidden width."),
    n_heads: int = typer.Option(4, help="Attention heads."),
    seq_len: int = typer.Option(512, help="Tokens per sequence."),
    batch_size: int = typer.Option(4, help="Sequences per step."),
    steps: int = typer.Option(5, help="Timed steps per PE (after warm-up)."),
    warmup: int = typer.Option(2, help="Untimed warm-up steps per PE."),
    rounds: int = typer.Option(3, help="Interleaved rounds; each PE's time is the median over all timed steps."),
    tape_paths: bool = typer.Option(True, help="Also time both TAPE aggregation paths (separate vs concatenated)."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    out: Path | None = typer.Option(None, help="Also write the timings and ratios as JSON to this file."),
    decode: bool = typer.Option(False, "--decode", help="Time greedy decoding after a long prompt instead: ms per "
                                                         "new token and prefill time."),
    prompt_len: int = typer.Option(4096, help="--decode: prompt tokens."),
    new_tokens: int = typer.Option(32, help="--decode: greedy tokens decoded with the KV cache."),
    uncached_tokens: int = typer.Option(4, help="--decode: tokens TAPE decodes without cache (0: skip)."),
    prefill_chunk: int | None = typer.Option(512, help="--decode: prefill the prompt this many tokens at a time."),
) -> None:
    """Time a training step (forward + backward) for each PE on the same model, as a ratio to RoPE.

    All PEs run in one process, interleaved round by round, so the ratios compare like with like.

    With --decode: greedy decoding after a --prompt-len prompt instead, per PE: ms per new token (KV cache) and
    prefill time, as ratios to RoPE; TAPE also without cache.

    Example: `tape bench --pe rope,tape --seq-len 1024 --out bench.json`; `tape bench --decode --out decode.json`.
    """
    if decode:
        from tapecli.bench_decode import run_decode_bench

        run_decode_bench(pes=[p.strip() for p in pes.split(",") if p.strip()], n_layers=n_layers, dim=dim,
                         n_heads=n_heads, prompt_len=prompt_len, new_tokens=new_tokens,
                         uncached_tokens=uncached_tokens, prefill_chunk=prefill_chunk, rounds=rounds,
                         tape_paths=tape_paths, device=device, out=out)
        return
    from tapecli.bench import run_bench

    run_bench(pes=[p.strip() for p in pes.split(",") if p.strip()], n_layers=n_layers, dim=dim, n_heads=n_heads,
              seq_len=seq_len, batch_size=batch_size, steps=steps, warmup=warmup, rounds=rounds,
              tape_paths=tape_paths, device=device, out=out)


app.add_typer(eval_app, name="eval")  # the `tape eval ...` commands live in tapecli/cli_eval.py


_OVERRIDES_HELP = "Recipe overrides as key=value, e.g. train.max_steps=200 model.pe=rope train.lr=3e-4."
_RESUME_HELP = ("auto: continue from the newest checkpoint in --out if there is one, else start fresh; "
                "never: always start fresh; or a checkpoint / run directory to continue from.")


@app.command()
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
    from tapecli.recipe import load_recipe
    from tapecli.train.engine import pretrain as run_pretrain

    command = ["tape", "pretrain", "--recipe", recipe, "--out", str(out), "--resume", resume, *(overrides or [])]
    run_pretrain(load_recipe(recipe, overrides or []), out, resume=resume, command=command)


@app.command()
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
    from tapecli.recipe import load_recipe
    from tapecli.train.engine import finetune as run_finetune

    command = ["tape", "finetune", *(["--checkpoint", checkpoint] if checkpoint else []), "--recipe", recipe,
               "--out", str(out), "--resume", resume, *(overrides or [])]
    loaded = load_recipe(recipe, overrides or [])
    checkpoint = checkpoint or loaded.train.init_from
    if not checkpoint:
        raise TapeError("finetune needs a model: pass --checkpoint or set train.init_from")
    run_finetune(loaded, checkpoint, out, resume=resume, command=command)


_BASE_HELP = ("A Hugging Face Llama directory (config.json, *.safetensors, tokenizer), a hub id "
              "(meta-llama/Llama-2-7b-hf: downloaded online, read from the HF cache offline), or a short name: "
              "llama2-7b, llama2-13b, llama3-8b, llama3.2-1b, mistral-7b, tinyllama, smollm2-135m, smollm2-360m, "
              "smollm2-1.7b.")


@app.command("extend-context")
def extend_context(
    overrides: list[str] | None = typer.Argument(None, help=_OVERRIDES_HELP, show_default=False),
    base: str = typer.Option(..., "--base", help=_BASE_HELP),
    method: str = typer.Option("tape", "--method", help="What is trained: tape | lora | longlora | full."),
    scaling: str = typer.Option("pi", "--scaling", help="How positions reach the longer context: pi | yarn | "
                                "dynamic | theta | none (not with longlora, which is defined with interpolation)."),
    compat: str = typer.Option("paper", "--compat", help="paper, or official: the official scripts' protocol (PI "
                               "under every method, theta included; TAPE's post-attention map frozen)."),
    recipe: str = typer.Option("context-extension", "--recipe", help="A shipped recipe name or a YAML file."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/extend-METHOD-SCALING)."),
    resume: str = typer.Option("auto", "--resume", help=_RESUME_HELP),
) -> None:
    """Extend a pre-trained Llama's context from its max_position_embeddings L to model.max_seq_len N.

    Methods (all also train embeddings and norms, extend.trainable): tape adds TAPE to the base's RoPE, its new modules zero-initialised so step 0 equals the base; lora trains LoRA r=8, alpha=16 on q, k, v, o (LongLoRA's "LoRA+"); longlora adds shifted sparse attention while training (groups of N/4, half the heads shifted; evaluation uses full attention); full trains every weight.

    Scalings: pi interpolates positions by N/L (the default); yarn; dynamic (NTK); theta sets the RoPE base to 1e6; none.

    The paper's rows: --method lora, --method longlora, --method lora --scaling theta, --method tape (all with --compat official for the official numbers).

    Checkpoints hold only the trained tensors plus a pointer to the base; `tape eval` and `tape export` open them like any other. Prints trainable and total parameter counts. A killed run continues exactly with the same command.

    Example (CPU-size, SmolLM2-135M from 8192 to 16384 tokens on short rows): tape extend-context --base smollm2-135m --recipe context-extension-smoke --method tape --out runs/ext model.max_seq_len=16384 data.source=corpus/
    """
    from tapecli.recipe import load_recipe
    from tapecli.train.engine import pretrain as run_pretrain

    out = out or Path(f"runs/extend-{method}-{scaling}")
    command = ["tape", "extend-context", "--base", base, "--method", method, "--scaling", scaling, "--compat", compat,
               "--recipe", recipe, "--out", str(out), "--resume", resume, *(overrides or [])]
    settings = [f"extend.method={method}", f"extend.scaling={scaling}", f"extend.compat={compat}",
                f"train.init_from={base}"]
    run_pretrain(load_recipe(recipe, [*(overrides or []), *settings]), out, resume=resume, command=command)


@app.command("export")
def export(
    checkpoint: str = typer.Option(..., "--checkpoint", "-c", help="Run directory (newest checkpoint) or checkpoint."),
    out: Path = typer.Option(..., "--out", help="The Hugging Face directory to write (new or empty)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16 weights."),
) -> None:
    """Write a checkpoint as a Hugging Face Llama directory that `AutoModelForCausalLM.from_pretrained` opens.

    config.json (with rope_parameters for RoPE's scaling), safetensors, the tokenizer. LoRA adapters are merged into the weights.

    Only RoPE models (any scaling) export: TAPE, FIRE, T5, ALiBi and xPos have no Llama equivalent in transformers; keep their native checkpoints, which every `tape eval` opens.

    Example: tape export --checkpoint runs/extend-lora-pi --out exported/llama2-7b-8k --dtype bfloat16
    """
    import torch

    from tapecli.checkpoint import load_model
    from tapecli.model.hf_export import export_hf

    if dtype not in ("float32", "bfloat16"):
        raise TapeError(f"--dtype: expected float32 or bfloat16, got {dtype!r}")
    model, tokenizer = load_model(checkpoint)
    wrote_tokenizer = export_hf(model, tokenizer, out, dtype=getattr(torch, dtype))
    note = "" if wrote_tokenizer else f" (no tokenizer: the {tokenizer.kind} tokenizer has no Hugging Face form)"
    typer.echo(f"wrote a Hugging Face Llama to {out}{note}")


tokenizer_app = typer.Typer(help="Train tokenizers.", no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")


@tokenizer_app.command("train")
def tokenizer_train(
    data: str = typer.Option(..., "--data", help="Text source: a file, directory, glob or hub id (dataset:config)."),
    vocab_size: int = typer.Option(..., "--vocab-size", help="Number of pieces, e.g. 32000."),
    out: Path = typer.Option(..., "--out", help="The SentencePiece model file to write (must end in .model)."),
    text_field: str = typer.Option("text", "--text-field", help="Field holding the text in json/jsonl/parquet rows."),
) -> None:
    """Train a SentencePiece BPE tokenizer whose encode/decode round trip is lossless.

    Use it with `data.tokenizer=PATH.model`.

    Example: `tape tokenizer train --data corpus/ --vocab-size 8000 --out tok.model`.
    """
    from tapecli.data.tokenizer import train_tokenizer

    path = train_tokenizer(data, vocab_size, str(out), text_field=text_field)
    typer.echo(f"wrote {path}")


@app.command()
def recipes(name: str = typer.Argument(None, help="Show this recipe's YAML (with its comments) instead of the list.")
            ) -> None:
    """List the shipped recipes, or print one.

    Use a name with `--recipe` from any directory, e.g. `tape pretrain --recipe arithmetic-smoke --out runs/x`.

    Copy one to edit it: `tape recipes c4 > my.yaml`.
    """
    from rich.console import Console
    from rich.table import Table

    from tapecli.recipe import list_recipes, recipe_text

    if name:
        typer.echo(recipe_text(name), nl=False)
        return
    table = Table(show_header=True, header_style="bold")
    table.add_column("recipe")
    table.add_column("what it is")
    for recipe_name, description in list_recipes():
        table.add_row(recipe_name, description)
    Console().print(table)


@app.command()
def demo(
    pe: str = typer.Option("", "--pe", help="More PEs to compare, comma-separated (e.g. nope,fire); rope and tape "
                                            "always run."),
    quick: bool = typer.Option(False, "--quick", help="A ~2-minute version for a first look (smaller everything)."),
    out: str = typer.Option(None, help="Output directory (default: runs/demo, plus -quick, -abacus, -seedN)."),
    seed: int = typer.Option(0, help="Seeds model init and the training problems (the same for every PE)."),
    abacus: bool = typer.Option(False, "--abacus", help="Give every PE the Abacus digit embedding (McLeish et al.)."),
    task: str = typer.Option("selective-copy", "--task", help="selective-copy (MapFormer's synthetic task: rope, "
                                                              "tape and alibi) or addition (rope and tape)."),
) -> None:
    """Train small models with different PEs under one budget and compare them beyond their training distribution.

    Every PE gets the same recipe (a shipped recipe shrunk to a CPU budget), steps, batch, learning rate and seed.

    --task selective-copy (default, about 3 minutes on a 2-core CPU): MapFormer's selective copy, 16 symbols among 16 blanks, tested with 14 and 18 blanks; RoPE, TAPE and ALiBi; prints whole-sequence / per-token accuracy per split and writes OUT/accuracy.png.

    --task addition (about 10 minutes, --quick about 2): reversed-digit addition, tested on every pair of operand lengths up to twice the training length (greedy, exact match); RoPE and TAPE; prints grid accuracy and inside/outside the training box; heat-maps: OUT/heatmaps.png.

    Re-running reuses finished work; --seed N repeats with another seed.

    Example: tape demo --pe nope ; tape demo --task addition --quick
    """
    from tapecli.demo import DEFAULT_PES, FULL, QUICK, run_demo

    extra = [p.strip() for p in pe.split(",") if p.strip()]
    if task != "addition":
        _synthetic_demo(task, extra, quick, abacus, out, seed)
        return
    pes = list(dict.fromkeys([*DEFAULT_PES, *extra]))  # keep order, drop repeats
    # One directory per setting, so a re-run reuses finished work and never mixes settings.
    default_out = "runs/demo" + "-quick" * quick + "-abacus" * abacus + (f"-seed{seed}" if seed else "")
    run_demo(pes, QUICK if quick else FULL, out or default_out, seed=seed, abacus=abacus)


def _synthetic_demo(task: str, extra: list[str], quick: bool, abacus: bool, out: str | None, seed: int) -> None:
    """`tape demo --task <synthetic task>` (see tapecli.demo_synthetic)."""
    from tapecli.demo_synthetic import BUDGETS, DEFAULT_PES, run_synthetic_demo

    if task not in BUDGETS:
        raise TapeError(f"--task: unknown demo task '{task}'; allowed: addition, {', '.join(BUDGETS)}")
    if abacus or quick:
        raise TapeError(f"--{'abacus' if abacus else 'quick'} applies to the addition demo only, not --task {task}")
    default_out = f"runs/demo-{task}" + (f"-seed{seed}" if seed else "")
    run_synthetic_demo(list(dict.fromkeys([*DEFAULT_PES, *extra])), BUDGETS[task], out or default_out, seed=seed)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
