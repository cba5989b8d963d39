"""`tape analyze ...`: where and why a PE fails beyond its training length (tapecli.experiments.analyze). Each
command builds its protocol lazily (`tape --help` stays fast) and hands it to the one evaluation runner,
`tapecli.eval.protocol.run`, with the options every `tape eval` command shares (tapecli.cli.eval)."""

from __future__ import annotations

from typing import Any

import typer

from tapecli.cli.app import Group
from tapecli.cli.eval import DEVICE_OPTION, DTYPE_OPTION, MODELS_OPTION, PE_ARG_OPTION, batch_size_option, out_option
from tapecli.cli.options import integer

analyze_app = typer.Typer(cls=Group, help="Analyse models position by position and head by head, beyond their training length.",
                          no_args_is_help=True)

DATA_OPTION = typer.Option(..., "--data", help="A synthetic task (selective-copy, grid-1d, grid-2d: the run's "
                                               "training distribution stretched to --seq-len), a text source (file, "
                                               "directory, glob, jsonl/parquet, hub id; each model's tokenizer) or a "
                                               ".bin token file.")
SEQ_LEN_OPTION = integer(..., "--seq-len", min=1, help="Tokens per sequence, e.g. 4-16x the training length.")
SEED_OPTION = integer(1234, "--seed", min=0, help="Seeds the synthetic sequences (sequence i has its own stream).")
TEXT_FIELD_OPTION = typer.Option("text", "--text-field", help="Field holding the text in json/jsonl/parquet rows.")


def _analyze(evaluation: Any, models: list[str], out: str | None, dtype: str, device: str, pe_arg: list[str] | None,
             batch_size: int) -> None:
    """Run the protocol, print its table and the files in its folder."""
    from rich.console import Console

    from tapecli.eval.common import parse_pe_args
    from tapecli.eval.protocol import run

    report = run(evaluation, models, out, dtype=dtype, device=device, pe_args=parse_pe_args(pe_arg),
                 batch_size=batch_size)
    Console().print(evaluation.summary(report.results))
    folder = report.folders[evaluation.name]
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    typer.echo(f"wrote {', '.join(files)} to {folder}")


@analyze_app.command("position-loss")
def position_loss(
    model: list[str] = MODELS_OPTION,
    data: str = DATA_OPTION,
    seq_len: int = SEQ_LEN_OPTION,
    samples: int = integer(8, "--samples", min=1, help="Sequences per model (text: the first N windows of "
                                                     "--seq-len + 1 tokens)."),
    seed: int = SEED_OPTION,
    bins_per_octave: int = integer(4, "--bins-per-octave", min=1, help="Position bins per doubling of the position."),
    text_field: str = TEXT_FIELD_OPTION,
    batch_size: int = batch_size_option(1, "Sequences per forward pass"),
    out: str | None = out_option("RUN/eval-position-loss/<checkpoint name>; several models: "
                                 "./eval-position-loss-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Mean token loss (and accuracy, for a synthetic task) at every position up to --seq-len, for one or more models on the same sequences.

    Positions are binned on a log axis; each bin gets the mean over sequences and its 95% band; each model's training length L is marked.

    One forward pass per sequence through the model's own linear-memory attention, so the CPU runs 16K tokens.

    Output (--out): results.json (per model: the bins, and the ranges <= L, L-2L, 2L-4L, ...), samples.jsonl, position-loss.png; the table prints the ranges.

    Interrupted? Run the same command again: finished sequences are kept.

    Example: tape analyze position-loss --model runs/demo/rope-seed0 --model runs/demo/alibi-seed0 --data selective-copy --seq-len 784 --out analysis/loss
    """
    from tapecli.experiments.analyze.position_loss import PositionLoss
    from tapecli.experiments.analyze.sequences import DataSource

    evaluation = PositionLoss(DataSource(data, seq_len, samples, seed, text_field), bins_per_octave)
    _analyze(evaluation, model, out, dtype, device, pe_arg, batch_size)


@analyze_app.command("attention")
def attention(
    model: list[str] = MODELS_OPTION,
    data: str = DATA_OPTION,
    seq_len: int = SEQ_LEN_OPTION,
    samples: int = integer(2, "--samples", min=1, help="Sequences per model (text: the first N windows)."),
    seed: int = SEED_OPTION,
    sink: int = integer(1, "--sink", min=1, help="Report the attention mass on the first N tokens (attention sinks)."),
    window: int = integer(16, "--window", min=1, help="Report the attention mass within the last N tokens."),
    maps_max: int = integer(64, "--maps-max", min=0, help="Draw the attention maps of the first sequence when "
                                                        "--seq-len is at most this (0: never)."),
    text_field: str = TEXT_FIELD_OPTION,
    out: str | None = out_option("RUN/eval-attention/<checkpoint name>; several models: "
                                 "./eval-attention-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Where every head of every layer looks, for every PE (CoPE, PaTH and TAPE included), at any length.

    Per layer and head, from the exact attention weights streamed one chunk of queries at a time (never a [T, T] map): the attention-distance histogram and mean distance, the entropy and its growth with the context (slope against ln n), the mass on the first --sink tokens and within the last --window tokens.

    For a contextual PE, a picture of what it computes instead of positions: CoPE's contextual positions, TAPE's positional state, PaTH's accumulated maps.

    Output (--out): results.json, samples.jsonl, heatmaps.png (layer x head per statistic, a row per model), distance.png, entropy.png, pe-<model>.png, and for --seq-len <= --maps-max the maps themselves, maps-<model>.png.

    Interrupted? Run the same command again: finished sequences are kept.

    Example: tape analyze attention --model runs/demo/rope-seed0 --model runs/demo/tape-seed0 --data selective-copy --seq-len 196 --out analysis/attention
    """
    from tapecli.experiments.analyze.attention import AttentionAnalysis
    from tapecli.experiments.analyze.sequences import DataSource

    evaluation = AttentionAnalysis(DataSource(data, seq_len, samples, seed, text_field), sink, window, maps_max)
    _analyze(evaluation, model, out, dtype, device, pe_arg, 1)
