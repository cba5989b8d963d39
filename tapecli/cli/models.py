"""`tape export` and `tape tokenizer train`: turning checkpoints and text into files other tools read."""

from __future__ import annotations

from pathlib import Path

import typer

from tapecli.cli.app import Group
from tapecli.cli.options import integer
from tapecli.errors import TapeError


def export(
    checkpoint: str = typer.Option(..., "--checkpoint", "-c", help="Run directory (newest checkpoint) or checkpoint."),
    out: Path = typer.Option(..., "--out", help="The Hugging Face directory to write (new or empty)."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 or bfloat16 weights."),
) -> None:
    """Write a checkpoint as a Hugging Face directory (Llama, Mistral, Qwen2, Qwen3, SmolLM3, Phi3, or the family of an imported block) that `AutoModelForCausalLM.from_pretrained` opens.

    config.json names the family whose layers compute the model (Mistral for a window in every layer, SmolLM3 for NoPE layers or windows in some layers, Qwen2 with q/k/v biases, Qwen3 with QK-norm, Phi3 with LongRoPE or a partial rotary; rope_parameters for RoPE's scaling), then safetensors and the tokenizer. LoRA adapters are merged into the weights.

    Only layers transformers can run export: RoPE (any scaling) or NoPE, with one window size, and a plugin PE whose class defines hf_export. Other PEs have no equivalent in transformers; keep their native checkpoints, which every `tape eval` opens.

    Example: tape export --checkpoint runs/extend-lora-pi --out exported/llama2-7b-8k --dtype bfloat16
    """
    import torch

    from tapecli.model.hf.export import check_exportable, export_hf
    from tapecli.store.claim import claim
    from tapecli.store.door import open_model
    from tapecli.store.run import check_output

    check_output(out)
    if dtype not in ("float32", "bfloat16"):
        raise TapeError(f"--dtype: expected float32 or bfloat16, got {dtype!r}")
    opened = open_model(checkpoint, device="cpu", dtype="fp32", what="--checkpoint")
    model, tokenizer = opened.model, opened.tokenizer
    with claim(out, beside=True):  # --out must stay empty until it is renamed into place: the claim sits beside it
        wrote_tokenizer = export_hf(model, tokenizer, out, dtype=getattr(torch, dtype))
    note = "" if wrote_tokenizer else f" (no tokenizer: the {tokenizer.kind} tokenizer has no Hugging Face form)"
    arch = check_exportable(model)[0]  # the family it was written as: Llama, Mistral, Phi3, ...
    typer.echo(f"wrote a Hugging Face {arch.removesuffix('ForCausalLM')} ({arch}) to {out}{note}")



tokenizer_app = typer.Typer(help="Train tokenizers.", no_args_is_help=True, cls=Group)


@tokenizer_app.command("train")
def tokenizer_train(
    data: str = typer.Option(..., "--data", help="Text source: a file, directory, glob or hub id (dataset:config)."),
    vocab_size: int = integer(..., "--vocab-size", min=1, help="Number of pieces, e.g. 32000."),
    out: Path = typer.Option(..., "--out", help="The SentencePiece model file to write (must end in .model)."),
    text_field: str = typer.Option("text", "--text-field", help="Field holding the text in json/jsonl/parquet rows."),
) -> None:
    """Train a SentencePiece BPE tokenizer whose encode/decode round trip is lossless.

    Use it with `data.tokenizer=PATH.model`.

    Example: `tape tokenizer train --data corpus/ --vocab-size 8000 --out tok.model`.
    """
    from tapecli.data.tokenizer import train_tokenizer
    from tapecli.store.run import check_output

    check_output(out, file=True)  # not inside a run's checkpoints
    path = train_tokenizer(data, vocab_size, str(out), text_field=text_field)
    typer.echo(f"wrote {path}")

