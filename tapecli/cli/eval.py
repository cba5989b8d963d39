"""`tape eval ...`: the evaluation commands. Each imports its protocol module lazily (`tape --help` stays fast) and
hands it to the one runner, `tapecli.eval.protocol.run` (`run_and_report` below), with the options every evaluation
shares (defined once here); errors are reported by the root group's boundary (`tapecli.cli`). The long-context
evaluations are in tapecli/cli/eval_long.py (ruler, babilong, kv-retrieval, latent-list) and
tapecli/cli/eval_benchmarks.py (mrcr, longbench-v2, nolima, helmet)."""

from __future__ import annotations

from typing import Any

import typer

from tapecli import commas
from tapecli.cli.app import Group
from tapecli.cli.options import integer, number, numbers
from tapecli.errors import TapeError

eval_app = typer.Typer(help="Evaluate a tape run / checkpoint or a Hugging Face model (aliases: `tape eval-addition`, "
                            "`tape eval-scrolls`, `tape passkey`, `tape perplexity`).", no_args_is_help=True, cls=Group)

# Options every `tape eval` command shares (tapecli.eval.common opens the model); reuse them in new eval commands.
_MODEL_HELP = ("A tape run directory (its newest checkpoint), a checkpoint directory, or a Hugging Face model "
               "directory or hub id.")
_MODELS_HELP = _MODEL_HELP + " Repeat to compare models."
MODEL_OPTION = typer.Option(..., "--model", "-m", help=_MODEL_HELP)
MODELS_OPTION = typer.Option(..., "--model", "-m", help=_MODELS_HELP)
DTYPE_OPTION = typer.Option("auto", "--dtype", help="Weights dtype: fp32, bf16, fp16, or auto (bf16 on a GPU, fp32 "
                                                    "on the CPU).")
DEVICE_OPTION = typer.Option("auto", "--device", help="cpu, cuda[:N] or auto (the GPU if there is one).")
PE_ARG_OPTION = typer.Option(None, "--pe-arg", help="Override a positional-encoding argument at evaluation time, "
                                                    "as in a recipe's model.pe_args; repeatable, e.g. --pe-arg "
                                                    "scaling=linear --pe-arg factor=2.", show_default=False)


def out_option(default: str) -> Any:
    """--out, whose help names the folder written when it is not given."""
    return typer.Option(None, "--out", help=f"Output folder (default: {default}).", show_default=False)


def batch_size_option(default: int, what: str) -> Any:
    """--batch-size: how many `what` (e.g. "Windows per forward pass") go together; never changes a result."""
    return integer(default, "--batch-size", min=1, help=f"{what}; changes speed, not results.")


def _pe_args(pairs: list[str] | None) -> dict:
    from tapecli.eval.common import parse_pe_args

    return parse_pe_args(pairs)


def _startup(device: str) -> None:
    """The first line an evaluation prints: the device, the threads, torch (`tapecli.runtime.startup_line`)."""
    from tapecli.runtime import resolve_device, startup_line

    typer.echo(startup_line(resolve_device(device)))


def run_and_report(evaluation: Any, models: list[str], out: str | None, dtype: str, device: str,
                   pe_arg: list[str] | None, batch_size: int) -> None:
    """Run an evaluation (`tapecli.eval.protocol.run`) and print its summary and the files it wrote."""
    from tapecli.eval.protocol import run

    _startup(device)
    report = run(evaluation, models, out, dtype=dtype, device=device, pe_args=_pe_args(pe_arg), batch_size=batch_size)
    summary = evaluation.summary(report.results)
    if not isinstance(summary, str):
        from rich.console import Console

        Console().print(summary)
    elif summary:
        typer.echo(summary)
    typer.echo(report.wrote(evaluation))


@eval_app.command("addition")
def eval_addition(
    model: list[str] = typer.Option(..., "--model", "--checkpoint", "-m", "-c", help=_MODELS_HELP + " --checkpoint "
                                    "is an alias."),
    max_len: int = integer(None, "--max-len", min=1, help="Longest operand evaluated, in digits (default: the run's "
                                                           "eval.max_len, i.e. 2 x data.max_digits)."),
    samples: int = integer(None, "--samples", min=1, help="Problems per (length, length) cell (default: the run's "
                                                          "eval.samples)."),
    seed: int = integer(1234, "--seed", min=0, help="Seeds the problems of every cell (cell (i, j) gets its own "
                                                    "stream)."),
    batch_size: int = batch_size_option(1024, "Problems decoded together"),
    out: str | None = out_option("RUN/eval-addition/<checkpoint name>; several models: OUT/<name>/ and the "
                                 "comparison in OUT (./eval-addition-comparison)"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Addition length generalisation: exact-match accuracy for every pair of operand lengths up to --max-len.

    Each cell (i, j) holds --samples fixed, seeded problems with exactly i and j digits (numbers reversed).

    The model answers by greedy decoding with the KV cache; a problem counts only if the whole sum, then EOS, comes out.

    Output (--out): results.json, samples.jsonl (every problem and answer) and heatmap.png (training box outlined); several models: their heat-maps side by side.

    results.json holds the grid, its mean over all cells (the paper's number) and the means in/out of the training box.

    Interrupted? Run the same command again: finished cells are kept.

    Example: tape eval addition --model runs/add-tape --max-len 80 --samples 100
    """
    from tapecli.eval.addition import Addition

    run_and_report(Addition(max_len, samples, seed), model, out, dtype, device, pe_arg, batch_size)


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
                                    "the zips (default: the hub, online)."),
    predictions: str | None = typer.Option(None, "--predictions", help="Score this predictions.json ({id: text}) "
                                           "instead of running a model."),
    compat: str | None = typer.Option(None, "--compat", help="Prompt construction: clean or official (default: "
                                      "the fine-tuning run's data.compat, else clean)."),
    seq_len: int | None = integer(None, "--seq-len", min=1, help="Prompt + answer tokens (default: the run's "
                                  "data.seq_len, else the model's max_seq_len); budgets scale from 8192."),
    sample: bool = typer.Option(False, "--sample", help="Summaries: sample (temperature 1, top-k 3) as the official "
                                "run did, seeded per example, instead of greedy decoding."),
    seed: int = integer(0, "--seed", min=0, help="Seeds --sample."),
    limit: int | None = integer(None, "--limit", min=1, help="Only the first N examples (a quick look, not the "
                                "official score)."),
    batch_size: int = batch_size_option(8, "Examples decoded together"),
    out: str | None = out_option("RUN/eval-scrolls/TASK-SPLIT; with --predictions, results.json goes there"),
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

    tasks = list(scrolls.data.TASKS) if all_tasks else list(task or [])
    if not tasks:
        raise TapeError("pass --task TASK (repeatable) or --all-tasks")
    if compat not in (None, "clean", "official"):
        raise TapeError(f"--compat: expected clean or official, got {compat!r}")
    if predictions is not None:
        if len(tasks) != 1 or model:
            raise TapeError("--predictions scores one --task and takes no --model")
        result = scrolls.score_predictions_file(tasks[0], predictions, split, data, out=out)
        typer.echo(json.dumps(result, indent=1))
        if out is not None:
            typer.echo(f"wrote results.json to {out}", err=True)  # stdout stays one JSON document
        return
    if not model:
        raise TapeError("pass --model (or --predictions to score a predictions file)")
    _startup(device)
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
    samples: int = integer(None, "--samples", min=1, help="Sequences per split (default: the run's eval.samples)."),
    seed: int = integer(1234, "--seed", min=0, help="Seeds the evaluation sequences (each split has its own stream)."),
    batch_size: int = batch_size_option(64, "Sequences scored together"),
    out: str | None = out_option("RUN/eval-synthetic/<checkpoint name>; several models: OUT/<label>/ and the "
                                 "comparison in OUT (./eval-synthetic-comparison)"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """The generated tasks (MapFormer's selective copy and grid navigation, flip-flop, CoPE's counting): accuracy on the IID, OOD-dense and OOD-sparse splits.

    The task and each split's parameters come from the run's recipe (data.kind, data.*, eval.*).

    Scored, teacher-forced argmax: the copied symbols (selective copy), observations of revisited cells (grid), the read bits (flip-flop), the answer (counting).

    Per split: accuracy (whole sequence right) and token_accuracy; results.json, samples.jsonl, accuracy.png.

    Interrupted? Run the same command again: finished sequences are kept.

    Example: tape eval synthetic --model runs/copy-rope --model runs/copy-tape --out runs/copy-compare
    """
    from tapecli.eval.synthetic import Synthetic

    evaluation = Synthetic(commas.split(splits, "--splits"), samples, seed)
    run_and_report(evaluation, models, out, dtype, device, pe_arg, batch_size)


@eval_app.command("perplexity")
def eval_perplexity(
    model: list[str] = MODELS_OPTION,
    data: str = typer.Option(..., "--data", help="LongLoRA .bin token file (uint16; .u32.bin for uint32) or a text "
                                                 "source (file, directory, glob, jsonl/parquet, hub id) tokenized "
                                                 "with each model's tokenizer."),
    seq_len: str = typer.Option("1024,2048,4096,8192", "--seq-len", help="Comma-separated context lengths."),
    protocol: str = typer.Option("longlora", "--protocol", help="longlora (the paper's table: windows every --stride "
                                                                "tokens, every prediction scored), disjoint, or "
                                                                "sliding (Hugging Face's strided protocol)."),
    stride: int = integer(256, "--stride", min=1, help="Tokens between window starts (longlora, sliding)."),
    max_windows: int = integer(None, "--max-windows", min=1, help="Evaluate a seeded choice of this many windows "
                                                                  "per length (default: all)."),
    seed: int = integer(0, "--seed", min=0, help="Seeds the --max-windows choice."),
    max_tokens: int = integer(None, "--max-tokens", min=1, help="Use only the first N tokens of the data."),
    text_field: str = typer.Option("text", "--text-field", help="Field holding the text in json/jsonl/parquet rows."),
    batch_size: int = batch_size_option(1, "Windows per forward pass"),
    out: str | None = out_option("RUN/eval-perplexity/<checkpoint name>; several models share one folder, "
                                 "./eval-perplexity-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Perplexity of one or more models at several context lengths, under a named windowing protocol.

    results.json: for each model and length, perplexity, nll (mean), token_accuracy and tokens scored, with the protocol and settings; perplexity.png: one line per model.

    Interrupted? Run the same command again: finished windows are kept.

    Example (the paper's table): tape eval perplexity --model runs/ext-tape --data pg19/test.bin --seq-len 1024,2048,4096,8192 --out eval/pg19
    """
    from tapecli.eval.perplexity import Perplexity

    evaluation = Perplexity(data, numbers(seq_len, "--seq-len", min=1), protocol, stride, max_windows, seed, max_tokens,
                            text_field)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("passkey")
def eval_passkey(
    model: list[str] = MODELS_OPTION,
    max_tokens: int = integer(8192, "--max-tokens", min=1, help="Evaluate the protocol's budgets whose prompts fit "
                                                                "in this many tokens (8192: the paper's 8 lengths)."),
    trials: int = integer(20, "--trials", min=1, help="Trials per budget (trial t is seeded with t)."),
    depths: str = typer.Option(None, "--depths", help="Depth x length sweep: comma-separated key depths as "
                                                      "fractions of the filler, e.g. 0,0.25,0.5,0.75,1 (default: "
                                                      "the protocol's random depth)."),
    budgets: str = typer.Option(None, "--budgets", help="Comma-separated filler budgets in characters instead of "
                                                        "the protocol's 3072, 7168, ... (e.g. 256,512 for a small "
                                                        "model)."),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-passkey/<checkpoint name>; several models: OUT/<name>/ and the "
                                 "comparison in OUT (./eval-passkey-comparison)"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Passkey retrieval as LongLoRA and the official TAPE code run it: find a 1-5 digit key hidden in filler text.

    Budget i hides the key in int(3.75 (i+1) 1000 // 1024 * 1024) filler characters (3072, 7168, ...); trial t draws depth and key from numpy.random.seed(t), so every model sees the same prompts.

    The model decodes greedily exactly as many tokens as the answer " KEY" has; correct iff all match.

    results.json: accuracy and mean prompt length per budget (and per depth with --depths); samples.jsonl: every trial; passkey.png: accuracy vs length, or the depth x length heat-map. Several --model: one folder each, and their accuracy-vs-length lines in one passkey.png.

    Interrupted? Run the same command again: finished trials are kept.

    Example (the paper's setting): tape eval passkey --model runs/ext-tape --max-tokens 8192 --out eval/passkey
    """
    from tapecli.eval.passkey import Passkey

    evaluation = Passkey(numbers(budgets, "--budgets") if budgets else None, max_tokens, trials,
                         numbers(depths, "--depths", float, min=0, max=1) if depths else None)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("harness")
def eval_harness(
    model: str = MODEL_OPTION,
    tasks: str = typer.Option(..., "--tasks", "-t", help="Comma-separated lm-eval task names (globs allowed) or "
                              "task YAML paths."),
    include_path: list[str] | None = typer.Option(None, "--include-path", help="A folder of task YAMLs "
                                                  "(repeatable).", show_default=False),
    num_fewshot: int | None = integer(None, "--num-fewshot", min=0, help="Few-shot examples per prompt (default: "
                                      "each task's own)."),
    limit: float | None = number(None, "--limit", min=0, help="Only the first N documents per task (N < 1: a "
                                 "fraction); for quick checks, not for reporting."),
    out: str | None = out_option("RUN/eval-harness/<checkpoint name>, or ./eval-harness/<model name>"),
    log_samples: bool = typer.Option(False, "--log-samples", help="Also write samples_<task>.jsonl: every prompt, "
                                     "response and score."),
    batch_size: int = batch_size_option(1, "Requests per forward pass"),
    max_length: int | None = integer(None, "--max-length", min=1, help="Context window in tokens (default: the "
                                     "model's max_seq_len); longer inputs are cut from the left, long documents "
                                     "scored in windows."),
    max_gen_toks: int = integer(256, "--max-gen-toks", min=1, help="Generation cap when a task sets none."),
    add_bos: bool | None = typer.Option(None, "--add-bos/--no-add-bos", help="Special tokens around every "
                                        "prompt: unset, the tokenizer's default (what lm-eval's hf model adds: "
                                        "BOS for Llama 2/3 and tape's own tokenizers, nothing for GPT-2, SmolLM2, "
                                        "Qwen); --add-bos: BOS only; --no-add-bos: none (docs/special-tokens.md).",
                                        show_default=False),
    seed: int = integer(1234, "--seed", min=0, help="Seeds lm-eval (few-shot sampling) and sampled generation."),
    bootstrap_iters: int = integer(100000, "--bootstrap-iters", min=0, help="Bootstrap resamples for standard "
                                   "errors (0: skip them)."),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Run any lm-evaluation-harness task on a tape model (every PE, TAPE, FIRE and T5 included).

    Calls lm-eval's own simple_evaluate with the native `tape` model, prints lm-eval's results table and writes lm-eval's results JSON (results.json) to --out.

    Offline: write task YAMLs over local files (dataset_path: json, data_files with absolute paths) and pass their folder with --include-path.

    Interrupted? Run the same command again: answers already computed come from lm-eval's request cache in --out.

    lm-eval's own CLI with the tape model: `python -m tapecli.lm_eval_cli --model tape --model_args pretrained=RUN --tasks ...`.

    Example: tape eval harness --model runs/c4-tape --tasks lambada_openai --limit 100
    """
    from tapecli.eval.harness import results_table, run_harness

    names = commas.split(tasks, "--tasks")
    if limit == 0:
        raise TapeError("--limit must be positive: a number of documents, or a fraction of them below 1")
    _startup(device)
    results, out_dir = run_harness(
        model, names, include_path=include_path, num_fewshot=num_fewshot,
        limit=int(limit) if limit is not None and limit >= 1 else limit, out=out, log_samples=log_samples,
        bootstrap_iters=bootstrap_iters, seed=seed, dtype=dtype, device=device, pe_args=_pe_args(pe_arg),
        batch_size=batch_size, max_length=max_length, max_gen_toks=max_gen_toks, add_bos_token=add_bos)
    typer.echo(results_table(results))
    typer.echo(f"wrote {out_dir / 'results.json'}" + (" and samples_<task>.jsonl" if log_samples else ""))
