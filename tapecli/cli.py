"""The `tape` command line. Each command imports its heavy modules lazily so `tape --help` stays fast.

Every command runs inside one error boundary (`tapecli.faults.boundary`, entered by the root group): user
mistakes and faults (unreadable or corrupt files, a full disk, out of memory) print one line and exit 2 (bad
input) or 1 (failed run); real bugs keep their traceback. `tape --debug ...` or `TAPE_DEBUG=1` shows tracebacks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import typer
from typer.core import TyperGroup

from tapecli import faults
from tapecli.errors import TapeError


class _Guarded(TyperGroup):
    """The root group: every command (and sub-command) runs inside the fault boundary."""

    def invoke(self, ctx: click.Context) -> object:
        with faults.boundary():
            return super().invoke(ctx)


app = typer.Typer(
    name="tape",
    help="Train and evaluate positional encodings (RoPE, ALiBi, FIRE, xPos, NoPE, RandPE, T5 bias, TAPE).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Guarded,
)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", envvar="TAPE_DEBUG",
                                     help="Show the full traceback of any error (also: TAPE_DEBUG=1).")) -> None:
    faults.set_debug(debug)


@contextmanager
def reported_errors() -> Iterator[None]:
    """The same boundary as every command already runs in (kept so a command can enter it explicitly)."""
    with faults.boundary():
        yield


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
    with reported_errors():
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


eval_app = typer.Typer(help="Evaluate a tape run / checkpoint or a Hugging Face model.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")

# Options every `tape eval` command shares (tapecli.eval.common opens the model); reuse them in new eval commands.
_MODEL_HELP = ("A tape run directory (its newest checkpoint), a checkpoint directory, or a Hugging Face model "
               "directory or hub id.")
_MODELS_HELP = _MODEL_HELP + " Repeat to compare models."
DTYPE_OPTION = typer.Option("auto", "--dtype", help="Weights dtype: fp32, bf16, fp16, or auto (bf16 on a GPU, fp32 "
                                                    "on the CPU).")
DEVICE_OPTION = typer.Option("auto", "--device", help="cpu, cuda[:N] or auto (the GPU if there is one).")
PE_ARG_OPTION = typer.Option(None, "--pe-arg", help="Override a positional-encoding argument at evaluation time, "
                                                    "as in a recipe's model.pe_args; repeatable, e.g. --pe-arg "
                                                    "scaling=linear --pe-arg factor=2.", show_default=False)


def _pe_args(pairs: list[str] | None) -> dict:
    from tapecli.eval.common import parse_pe_args

    return parse_pe_args(pairs)


@eval_app.command("addition")
def eval_addition(
    model: str = typer.Option(..., "--model", "--checkpoint", "-c", help=_MODEL_HELP + " --checkpoint is an alias."),
    max_len: int = typer.Option(None, help="Longest operand evaluated, in digits (default: the run's "
                                           "eval.max_len, i.e. 2 x data.max_digits)."),
    samples: int = typer.Option(None, help="Problems per (length, length) cell (default: the run's eval.samples)."),
    seed: int = typer.Option(1234, help="Seeds the problems of every cell (cell (i, j) gets its own stream)."),
    batch_size: int = typer.Option(1024, "--batch-size", help="Problems decoded together; changes speed, not results."),
    out: str = typer.Option(None, help="Output directory (default: RUN/eval-addition/<checkpoint name>)."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Addition length generalisation: exact-match accuracy for every pair of operand lengths up to --max-len.

    Each cell (i, j) holds --samples fixed, seeded problems with exactly i and j digits (numbers reversed).

    The model answers by greedy decoding with the KV cache; a problem counts only if the whole sum, then EOS, comes out.

    Output (--out): results.json, samples.jsonl (every problem and answer) and heatmap.png (training box outlined).

    results.json holds the grid, its mean over all cells (the paper's number) and the means in/out of the training box.

    Interrupted? Run the same command again: finished cells are kept.

    Example: tape eval addition --model runs/add-tape --max-len 80 --samples 100
    """
    from tapecli.eval.addition import run_addition_eval

    with reported_errors():
        results, out_dir = run_addition_eval(model, max_len=max_len, samples=samples, seed=seed,
                                             batch_size=batch_size, out=out, device=device, dtype=dtype,
                                             pe_args=_pe_args(pe_arg))
    parts = [f"{name} {results[key]:.1%}" for name, key in [("mean accuracy", "mean_accuracy"),
             ("inside the training box", "in_box_accuracy"), ("outside it", "out_of_box_accuracy")]
             if results[key] is not None]
    typer.echo(f"{', '.join(parts)}; wrote results.json, samples.jsonl and heatmap.png to {out_dir}")


@eval_app.command("scrolls")
def eval_scrolls(
    model: list[str] | None = typer.Option(None, "--model", help=_MODELS_HELP + " `{task}` in it is replaced by "
                                           "each task's name (one fine-tuned model per task).", show_default=False),
    task: list[str] | None = typer.Option(None, "--task", help="SCROLLS task (repeatable): gov_report, "
                                          "summ_screen_fd, qmsum, narrative_qa, qasper, quality, contract_nli.",
                                          show_default=False),
    all_tasks: bool = typer.Option(False, "--all-tasks", help="All seven tasks; prints the paper's table."),
    split: str = typer.Option("validation", "--split", help="train, validation or test (test has no references)."),
    data: str | None = typer.Option(None, "--data", help="A downloaded tau/scrolls {task}.zip or the folder holding "
                                    "the zips [default: the hub, online]."),
    predictions: str | None = typer.Option(None, "--predictions", help="Score this predictions.json ({id: text}) "
                                           "instead of running a model."),
    compat: str | None = typer.Option(None, "--compat", help="Prompt construction: clean or official [default: "
                                      "the fine-tuning run's data.compat, else clean]."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Prompt + answer tokens [default: the run's "
                                       "data.seq_len, else the model's max_seq_len]; budgets scale from 8192."),
    sample: bool = typer.Option(False, "--sample", help="Summaries: sample (temperature 1, top-k 3) as the official "
                                "run did, seeded per example, instead of greedy decoding."),
    seed: int = typer.Option(0, "--seed", help="Seeds --sample."),
    limit: int | None = typer.Option(None, "--limit", help="Only the first N examples (a quick look, not the "
                                     "official score)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Examples decoded together; changes speed, not results."),
    out: str | None = typer.Option(None, "--out", help="Output folder [default: RUN/eval-scrolls/TASK-SPLIT]."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """SCROLLS: generate answers for every example of a split and score them with the official metric.

    F1 (qasper, narrative_qa), exact match (quality, contract_nli), or the geometric mean of ROUGE-1/2/L (summaries).

    Writes predictions.json (official format), results.json and samples.jsonl per model and task; rerun to resume.

    Examples: tape eval scrolls --model runs/ft-qasper --task qasper --data scrolls/ ;
    tape eval scrolls --all-tasks --model runs/rope-{task} --model runs/tape-{task} --data scrolls/ ;
    tape eval scrolls --task qasper --predictions predictions.json --data scrolls/
    """
    import json

    from tapecli.eval import scrolls

    with reported_errors():
        tasks = list(scrolls.data.TASKS) if all_tasks else list(task or [])
        if not tasks:
            raise TapeError("pass --task TASK (repeatable) or --all-tasks")
        if compat not in (None, "clean", "official"):
            raise TapeError(f"--compat: expected clean or official, got {compat!r}")
        if predictions is not None:
            if len(tasks) != 1 or model:
                raise TapeError("--predictions scores one --task and takes no --model")
            result = scrolls.score_predictions_file(tasks[0], predictions, split, data)
            typer.echo(json.dumps(result, indent=1))
            return
        if not model:
            raise TapeError("pass --model (or --predictions to score a predictions file)")
        run = scrolls.ScrollsRun(split=split, data=data, compat=compat, seq_len=seq_len, sample=sample, seed=seed,
                                 batch_size=batch_size, dtype=dtype, device=device, pe_args=_pe_args(pe_arg),
                                 limit=limit)
        results = scrolls.run_scrolls_eval(model, tasks, run, out)
    header, rows = scrolls.table(model, results, tasks)
    for cells in [header, ["---"] * len(header), *rows]:  # a Markdown table, ready to paste
        typer.echo("| " + " | ".join(cells) + " |")
    typer.echo(f"wrote predictions.json, results.json and samples.jsonl to {results[0][0]['out_dir']}"
               + (" and the other (model, task) folders" if len(model) * len(tasks) > 1 else ""))


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


def _numbers(text: str, option: str, kind: type = int) -> list:
    """`"1024,2048"` -> [1024, 2048] for a comma-separated option; one line naming the option when malformed."""
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise TapeError(f"{option}: expected comma-separated {kind.__name__}s, got {text!r}") from None


@eval_app.command("perplexity")
def eval_perplexity(
    model: list[str] = typer.Option(..., "--model", "-m", help=_MODELS_HELP),
    data: str = typer.Option(..., "--data", help="LongLoRA .bin token file (uint16; .u32.bin for uint32) or a text "
                                                 "source (file, directory, glob, jsonl/parquet, hub id) tokenized "
                                                 "with each model's tokenizer."),
    seq_len: str = typer.Option("1024,2048,4096,8192", "--seq-len", help="Comma-separated context lengths."),
    protocol: str = typer.Option("longlora", "--protocol", help="longlora (the paper's table: windows every --stride "
                                                                "tokens, every prediction scored), disjoint, or "
                                                                "sliding (Hugging Face's strided protocol)."),
    stride: int = typer.Option(256, "--stride", help="Tokens between window starts (longlora, sliding)."),
    max_windows: int = typer.Option(None, "--max-windows", help="Evaluate a seeded choice of this many windows per "
                                                                "length (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seeds the --max-windows choice."),
    max_tokens: int = typer.Option(None, "--max-tokens", help="Use only the first N tokens of the data."),
    text_field: str = typer.Option("text", "--text-field", help="Field holding the text in json/jsonl/parquet rows."),
    batch_size: int = typer.Option(1, "--batch-size", help="Windows per forward pass; changes speed, not results."),
    out: str = typer.Option(..., "--out", help="Output directory: results.json, samples.jsonl, perplexity.png."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Perplexity of one or more models at several context lengths, under a named windowing protocol.

    results.json: for each model and length, perplexity, nll (mean), token_accuracy and tokens scored, with the protocol and settings; perplexity.png: one line per model.

    Interrupted? Run the same command again: finished windows are kept.

    Example (the paper's table): tape eval perplexity --model runs/ext-tape --data pg19/test.bin --seq-len 1024,2048,4096,8192 --out eval/pg19
    """
    from tapecli.eval.perplexity import evaluate_perplexity

    with reported_errors():
        results = evaluate_perplexity(model, data, _numbers(seq_len, "--seq-len"), out, protocol=protocol,
                                      stride=stride, max_windows=max_windows, seed=seed, max_tokens=max_tokens,
                                      text_field=text_field, dtype=dtype, device=device, pe_args=_pe_args(pe_arg),
                                      batch_size=batch_size)
    for entry in results["models"]:
        cells = ", ".join(f"{n}: {r['perplexity']:.3f}" for n, r in entry["lengths"].items())
        typer.echo(f"{entry['name']}: perplexity {cells}")
    typer.echo(f"wrote results.json, samples.jsonl and perplexity.png to {out}")


@eval_app.command("passkey")
def eval_passkey(
    model: str = typer.Option(..., "--model", "-m", help=_MODEL_HELP),
    max_tokens: int = typer.Option(8192, "--max-tokens", help="Evaluate the protocol's budgets whose prompts fit in "
                                                              "this many tokens (8192: the paper's 8 lengths)."),
    trials: int = typer.Option(20, "--trials", help="Trials per budget (trial t is seeded with t)."),
    depths: str = typer.Option(None, "--depths", help="Depth x length sweep: comma-separated key depths as "
                                                      "fractions of the filler, e.g. 0,0.25,0.5,0.75,1 (default: "
                                                      "the protocol's random depth)."),
    budgets: str = typer.Option(None, "--budgets", help="Comma-separated filler budgets in characters instead of "
                                                        "the protocol's 3072, 7168, ... (e.g. 256,512 for a small "
                                                        "model)."),
    batch_size: int = typer.Option(1, "--batch-size", help="Prompts decoded together; changes speed, not results."),
    out: str = typer.Option(..., "--out", help="Output directory: results.json, samples.jsonl, passkey.png."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Passkey retrieval as LongLoRA and the official TAPE code run it: find a 1-5 digit key hidden in filler text.

    Budget i hides the key in int(3.75 (i+1) 1000 // 1024 * 1024) filler characters (3072, 7168, ...); trial t draws depth and key from numpy.random.seed(t), so every model sees the same prompts.

    The model decodes greedily exactly as many tokens as the answer " KEY" has; correct iff all match.

    results.json: accuracy and mean prompt length per budget (and per depth with --depths); samples.jsonl: every trial; passkey.png: accuracy vs length, or the depth x length heat-map.

    Interrupted? Run the same command again: finished trials are kept.

    Example (the paper's setting): tape eval passkey --model runs/ext-tape --max-tokens 8192 --out eval/passkey
    """
    from tapecli.eval.passkey import evaluate_passkey

    with reported_errors():
        results = evaluate_passkey(model, out, budgets=_numbers(budgets, "--budgets") if budgets else None,
                                   max_tokens=max_tokens, trials=trials,
                                   depths=_numbers(depths, "--depths", float) if depths else None, dtype=dtype,
                                   device=device, pe_args=_pe_args(pe_arg), batch_size=batch_size)
    for entry in results["budgets"]:
        typer.echo(f"{entry['budget']} filler characters (~{entry['mean_prompt_tokens']:.0f} tokens): "
                   f"accuracy {entry['accuracy']:.0%}")
    typer.echo(f"wrote results.json, samples.jsonl and passkey.png to {out}")


@eval_app.command("harness")
def eval_harness(
    model: str = typer.Option(..., "--model", "-m", help=_MODEL_HELP),
    tasks: str = typer.Option(..., "--tasks", "-t", help="Comma-separated lm-eval task names (globs allowed) or "
                              "task YAML paths."),
    include_path: list[str] | None = typer.Option(None, "--include-path", help="A folder of task YAMLs "
                                                  "(repeatable).", show_default=False),
    num_fewshot: int | None = typer.Option(None, "--num-fewshot", help="Few-shot examples per prompt (default: "
                                           "each task's own)."),
    limit: float | None = typer.Option(None, "--limit", help="Only the first N documents per task (N < 1: a "
                                       "fraction); for quick checks, not for reporting."),
    out: Path | None = typer.Option(None, "--out", help="Output directory for results.json (default: "
                                    "RUN/eval-harness/<checkpoint name>, or eval-harness/<model name>)."),
    log_samples: bool = typer.Option(False, "--log-samples", help="Also write samples_<task>.jsonl: every prompt, "
                                     "response and score."),
    batch_size: int = typer.Option(1, "--batch-size", help="Requests per forward pass (speed only)."),
    max_length: int | None = typer.Option(None, "--max-length", help="Context window in tokens (default: the "
                                          "model's max_seq_len); longer inputs are cut from the left, long "
                                          "documents scored in windows."),
    max_gen_toks: int = typer.Option(256, "--max-gen-toks", help="Generation cap when a task sets none."),
    add_bos: bool = typer.Option(True, "--add-bos/--no-add-bos", help="Start every prompt with BOS, as tape "
                                 "pre-training and Llama tokenizers do."),
    seed: int = typer.Option(1234, "--seed", help="Seeds lm-eval (few-shot sampling) and sampled generation."),
    bootstrap_iters: int = typer.Option(100000, "--bootstrap-iters", help="Bootstrap resamples for standard "
                                        "errors (0: skip them)."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Run any lm-evaluation-harness task on a tape model (every PE, TAPE, FIRE and T5 included).

    Calls lm-eval's own simple_evaluate with the native `tape` model, prints lm-eval's results table and writes lm-eval's results JSON (results.json) to --out.

    Offline: write task YAMLs over local files (dataset_path: json, data_files with absolute paths) and pass their folder with --include-path.

    Interrupted? Run the same command again: answers already computed come from lm-eval's request cache in --out.

    lm-eval's own CLI with the tape model: `python -m tapecli.harness --model tape --model_args pretrained=RUN --tasks ...`.

    Example: tape eval harness --model runs/c4-tape --tasks lambada_openai --limit 100
    """
    from tapecli.eval.harness import results_table, run_harness

    names = [t.strip() for t in tasks.split(",") if t.strip()]
    with reported_errors():
        results, out_dir = run_harness(
            model, names, include_path=include_path, num_fewshot=num_fewshot,
            limit=int(limit) if limit is not None and limit >= 1 else limit, out=out, log_samples=log_samples,
            bootstrap_iters=bootstrap_iters, seed=seed, dtype=dtype, device=device, pe_args=_pe_args(pe_arg),
            batch_size=batch_size, max_length=max_length, max_gen_toks=max_gen_toks, add_bos_token=add_bos)
    typer.echo(results_table(results))
    typer.echo(f"wrote {out_dir / 'results.json'}" + (" and samples_<task>.jsonl" if log_samples else ""))


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
                                "dynamic | theta | none."),
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
    with reported_errors():
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

    with reported_errors():
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
