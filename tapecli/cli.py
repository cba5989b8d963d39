"""The `tape` command line. Each command imports its heavy modules lazily so `tape --help` stays fast."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from tapecli.errors import TapeError

app = typer.Typer(
    name="tape",
    help="Train and evaluate positional encodings (RoPE, ALiBi, FIRE, xPos, NoPE, RandPE, T5 bias, TAPE).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn a TapeError into one red line and its exit code (2: bad input, 1: a failed run), no traceback."""
    try:
        yield
    except TapeError as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(e.exit_code) from None


@app.command()
def bench(
    pes: str = typer.Option("nope,rope,randpe,alibi,fire,xpos,t5,tape", "--pe", help="Comma-separated PEs to time."),
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
) -> None:
    """Time a training step (forward + backward) for each PE on the same model, as a ratio to RoPE.

    All PEs run in one process, interleaved round by round, so the ratios compare like with like.

    Example: `tape bench --pe rope,tape --seq-len 1024 --out bench.json`.
    """
    from tapecli.bench import run_bench

    with reported_errors():
        run_bench(pes=[p.strip() for p in pes.split(",") if p.strip()], n_layers=n_layers, dim=dim, n_heads=n_heads,
                  seq_len=seq_len, batch_size=batch_size, steps=steps, warmup=warmup, rounds=rounds,
                  tape_paths=tape_paths, device=device, out=out)


eval_app = typer.Typer(help="Evaluate a trained checkpoint.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")


@eval_app.command("addition")
def eval_addition(
    checkpoint: str = typer.Option(..., "--checkpoint", "-c", help="Run directory (newest checkpoint) or checkpoint."),
    max_len: int = typer.Option(None, help="Longest operand evaluated, in digits (default: the run's "
                                           "eval.max_len, i.e. 2 x data.max_digits)."),
    samples: int = typer.Option(None, help="Problems per (length, length) cell (default: the run's eval.samples)."),
    seed: int = typer.Option(1234, help="Seeds the problems of every cell (cell (i, j) gets its own stream)."),
    batch_size: int = typer.Option(1024, help="Problems decoded together; changes speed, not results."),
    out: str = typer.Option(None, help="Output directory (default: RUN/eval-addition/<checkpoint name>)."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
) -> None:
    """Addition length generalisation: exact-match accuracy for every pair of operand lengths up to --max-len.

    Each cell (i, j) holds --samples fixed, seeded problems with exactly i and j digits (numbers reversed).

    The model answers by greedy decoding with the KV cache; a problem counts only if the whole sum, then EOS, comes out.

    Output (--out): results.json, samples.jsonl (every problem and answer) and heatmap.png (training box outlined).

    results.json holds the grid, its mean over all cells (the paper's number) and the means in/out of the training box.

    Interrupted? Run the same command again: finished cells are kept.

    Example: tape eval addition --checkpoint runs/add-tape --max-len 80 --samples 100
    """
    from tapecli.eval.addition import run_addition_eval

    with reported_errors():
        results, out_dir = run_addition_eval(checkpoint, max_len=max_len, samples=samples, seed=seed,
                                             batch_size=batch_size, out=out, device=device)
    parts = [f"{name} {results[key]:.1%}" for name, key in [("mean accuracy", "mean_accuracy"),
             ("inside the training box", "in_box_accuracy"), ("outside it", "out_of_box_accuracy")]
             if results[key] is not None]
    typer.echo(f"{', '.join(parts)}; wrote results.json, samples.jsonl and heatmap.png to {out_dir}")


@eval_app.command("synthetic")
def eval_synthetic(
    models: list[str] = typer.Option(..., "--model", "-m", help="Run directory (newest checkpoint) or checkpoint "
                                     "trained on a synthetic task; repeat --model to compare several."),
    splits: str = typer.Option("iid,ood-dense,ood-sparse", help="Comma-separated splits to evaluate."),
    samples: int = typer.Option(None, help="Sequences per split (default: the run's eval.samples)."),
    seed: int = typer.Option(1234, help="Seeds the evaluation sequences (each split has its own stream)."),
    batch_size: int = typer.Option(64, help="Sequences scored together; changes speed, not results."),
    out: str = typer.Option(None, help="Output directory (default: RUN/eval-synthetic/<checkpoint name>; with "
                                       "several models, the comparison's folder, default eval-synthetic-comparison)."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
) -> None:
    """Selective copy or grid navigation (MapFormer): accuracy on the IID, OOD-dense and OOD-sparse splits.

    The task and each split's parameters come from the run's recipe (data.kind, data.*, eval.*).

    Scored: the copied symbols (selective copy) or observations of revisited cells (grid), teacher-forced argmax.

    Per split: accuracy (whole sequence right) and token_accuracy; results.json, samples.jsonl, accuracy.png.

    Interrupted? Run the same command again: finished sequences are kept.

    Example: tape eval synthetic --model runs/copy-rope --model runs/copy-tape --out runs/copy-compare
    """
    from rich.console import Console

    from tapecli.eval.synthetic import comparison_table, run_synthetic_eval

    with reported_errors():
        results, chart = run_synthetic_eval(models, [s.strip() for s in splits.split(",") if s.strip()],
                                            samples=samples, seed=seed, batch_size=batch_size, out=out, device=device)
    Console().print(comparison_table(results))
    comparison = f"; comparison chart {chart}" if chart else ""
    typer.echo(f"wrote results.json, samples.jsonl and accuracy.png per model{comparison}")


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
    with reported_errors():
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
    with reported_errors():
        loaded = load_recipe(recipe, overrides or [])
        checkpoint = checkpoint or loaded.train.init_from
        if not checkpoint:
            raise TapeError("finetune needs a model: pass --checkpoint or set train.init_from")
        run_finetune(loaded, checkpoint, out, resume=resume, command=command)


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

    with reported_errors():
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
        with reported_errors():
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
    task: str = typer.Option("addition", "--task", help="addition, or selective-copy (MapFormer's synthetic task; "
                                                        "runs rope, tape and alibi)."),
) -> None:
    """Train small RoPE and TAPE models on addition under one budget and compare them beyond the training length.

    Every PE gets the same recipe: the shipped `arithmetic` recipe shrunk to a CPU budget (model, data, steps, lr).

    Each model is then tested on every pair of operand lengths up to twice the training length (greedy, exact match).

    Prints a table (grid accuracy, inside/outside the training box, train time, loss); heat-maps: OUT/heatmaps.png.

    The default takes about 10 minutes on a 2-core CPU (9.5 measured), --quick about 2. Re-running reuses finished work.

    --task selective-copy: MapFormer's selective copy instead (16 symbols among 16 blanks, tested with 14 and 18
    blanks), RoPE, TAPE and ALiBi, about 4 minutes; prints whole-sequence / per-token accuracy per split and writes
    OUT/accuracy.png.

    Example: tape demo --pe nope
    """
    from tapecli.demo import DEFAULT_PES, FULL, QUICK, run_demo

    extra = [p.strip() for p in pe.split(",") if p.strip()]
    if task != "addition":
        with reported_errors():
            _synthetic_demo(task, extra, quick, abacus, out, seed)
        return
    pes = list(dict.fromkeys([*DEFAULT_PES, *extra]))  # keep order, drop repeats
    with reported_errors():
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
