"""`tape eval ruler`, `babilong`, `kv-retrieval`, `latent-list`: the generated long-context tasks, and what every
long-context evaluation shares (here and in eval_benchmarks.py): lengths in tokens (`token_lengths`: `1k` = 1024),
the effective length's threshold and base lengths. Registered on `eval_app` (tapecli.cli.eval, whose shared options
and runner they use); `tapecli.cli` imports this module after it, and eval_benchmarks.py after this one, so they
follow the other evaluations in `tape eval --help` in that order."""

from __future__ import annotations

import typer

from tapecli import commas
from tapecli.cli.eval import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    MODELS_OPTION,
    PE_ARG_OPTION,
    batch_size_option,
    eval_app,
    out_option,
    run_and_report,
)
from tapecli.cli.options import integer, number, numbers
from tapecli.errors import TapeError

MAX_PROMPT_TOKENS = 2**24


def token_lengths(text: str, option: str = "--lengths") -> list[int]:
    """`"0,1k,2k,4096"` -> [0, 1024, 2048, 4096] (k = 1024 tokens); one line naming the option when malformed or
    negative."""
    out = []
    for part in (p.lower() for p in commas.split(text, option)):
        try:
            length = int(part[:-1]) * 1024 if part.endswith("k") else int(part)
        except ValueError:
            raise TapeError(f"{option}: expected comma-separated token counts such as 0,1k,2k,4096, got {text!r}"
                            ) from None
        if length in out:  # 1k and 1024
            raise TapeError(f"{option} {text!r}: {length} tokens are given twice; give each length once")
        out.append(length)
    # (no prompt is longer than 2**24 tokens: a mistyped length would generate for hours before failing)
    return numbers(",".join(map(str, out)) if out else text, option, min=0, max=MAX_PROMPT_TOKENS)


def base_token_lengths(text: str | None) -> list[int] | None:
    return token_lengths(text, "--base-lengths") if text is not None else None


THRESHOLD_OPTION = number(85.6, "--threshold", min=0, max=100, help="Effective length: the longest length up to "
                          "which the average score (0-100) exceeds this (RULER: Llama-2-7B's 4K score).")
BASE_LENGTHS_OPTION = typer.Option(None, "--base-lengths", help="Lengths whose mean score is the model's base score "
                                   "(NoLiMa's effective length: 85% of it; LongScore) (default: the shortest "
                                   "length).", show_default=False)


@eval_app.command("ruler")
def eval_ruler(
    model: list[str] = MODELS_OPTION,
    tasks: str = typer.Option("all", "--tasks", "-t", help="all, or comma-separated tasks: niah_single_1..3, "
                              "niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe, qa_1 (SQuAD), "
                              "qa_2 (HotpotQA); lm-eval's names (ruler_vt, ruler_qa_squad, ...) work too."),
    lengths: str = typer.Option("4096", "--lengths", help="Comma-separated sequence lengths in tokens (prompt + "
                                "answer), e.g. 1024,2048,4096,8192."),
    samples: int = integer(500, "--samples", min=1, help="Samples per task and length (RULER: 500)."),
    haystack: str | None = typer.Option(None, "--haystack", help="Essay haystack: a text file, a folder of .txt/.md "
                                        "files, or RULER's PaulGrahamEssays.json. Without it the 5 essay tasks are "
                                        "skipped."),
    qa_data: list[str] | None = typer.Option(None, "--qa-data", help="SQuAD 2.0 dev / HotpotQA dev-distractor JSON "
                                             "(file or folder; repeatable). Without it qa_1 / qa_2 are skipped.",
                                             show_default=False),
    threshold: float = THRESHOLD_OPTION,
    base_lengths: str | None = BASE_LENGTHS_OPTION,
    seed: int = integer(42, "--seed", min=0, help="Seeds the generators (RULER: 42)."),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-ruler/<checkpoint name>; several models share one folder, "
                                 "./eval-ruler-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """RULER: NVIDIA's 13 synthetic long-context tasks, offline, and the effective context length.

    Samples come from the official generators (prompts, templates, needle depths, answer prefixes, seed 42), their haystacks sized to each length with the model's own tokenizer; scored by RULER's case-insensitive string match.

    results.json: score per task and length, average per length, effective length (RULER's threshold; NoLiMa: 85% of the base score) and LongScore; ruler.png: average vs length, one line per model; heatmap*.png: task x length per model.

    Interrupted? Run the same command again: finished samples are kept.

    Example: tape eval ruler --model runs/rope --model runs/alibi --tasks niah_single_1,vt --lengths 1024,2048,4096 --samples 50 --out eval/ruler
    """
    from tapecli.eval.ruler import Ruler

    evaluation = Ruler(tasks, numbers(lengths, "--lengths", min=1), samples, seed, threshold, haystack, qa_data,
                       notify=typer.echo, base_lengths=base_token_lengths(base_lengths))
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("babilong")
def eval_babilong(
    model: list[str] = MODELS_OPTION,
    tasks: str | None = typer.Option(None, "--tasks", "-t", help="all, or comma-separated bAbI tasks: qa1 (single "
                                     "supporting fact), qa2 (two), qa3 (three), qa4 (two-argument relations), qa5 "
                                     "(three-argument relations) (default: all).", show_default=False),
    lengths: str | None = typer.Option(None, "--lengths", help="Comma-separated lengths in tokens (prompt + 15 "
                                       "answer tokens; k = 1024); 0 = the facts alone (BABILong's 0k) (default: "
                                       "0,1k,2k,4k,8k,16k).", show_default=False),
    depths: str | None = typer.Option(None, "--depths", help="Where the facts go: comma-separated depths in [0, 1] "
                                      "(a window of the distractor text, see --depth-window; one heat-map row each), "
                                      "or `any` (anywhere: BABILong's own placement) (default: 0,0.25,0.5,0.75,1).",
                                      show_default=False),
    depth_window: float = number(0.2, "--depth-window", min=0, max=1, help="Width of a depth's window, as a fraction of the "
                                       "distractor text."),
    samples: int | None = integer(None, "--samples", min=1, help="Samples per task, length and depth (default: 20; "
                                       "x 5 depths = BABILong's 100 per task and length).", show_default=False),
    prompt: str | None = typer.Option(None, "--prompt", help="BABILong's prompt: full (instruction, few-shot "
                                      "examples, answer format), no-examples, or bare (context and question only: "
                                      "BABILong's setting for base models; the default).", show_default=False),
    haystack: str | None = typer.Option(None, "--haystack", help="Distractor text: a text file, a folder of "
                                        ".txt/.md files, or RULER's PaulGrahamEssays.json (default: RULER's noise "
                                        "sentences)."),
    data: str | None = typer.Option(None, "--data", help="A folder with BABILong's own files (RMT-team/babilong "
                                    "parquet or data/create_tasks.py JSON): read them instead of generating; "
                                    "--lengths must then be 0 or multiples of 1k."),
    threshold: float = THRESHOLD_OPTION,
    base_lengths: str | None = BASE_LENGTHS_OPTION,
    seed: int | None = integer(None, "--seed", min=0, help="Seeds the stories, the distractor text and the placement "
                                    "(default: 0).", show_default=False),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-babilong/<checkpoint name>; several models share one folder, "
                                 "./eval-babilong-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """BABILong: bAbI's reasoning tasks qa1-qa5 hidden in distractor text of growing length, offline.

    Stories come from tape's simulator of bAbI's world (seeded; no download), or from BABILong's own files (--data); the facts sit at each --depths window of RULER's noise sentences or your --haystack text, sized with the model's tokenizer. Greedy answers of up to 15 tokens, scored by BABILong's compare_answers.

    results.json: accuracy per task, length and depth, average per length, effective length (RULER: 85.6; NoLiMa: 85% of the base score) and LongScore; babilong.png, heatmap*.png (task x length), depth*.png (length x depth per task).

    A run trained on data kind babilong is evaluated on its recipe's eval keys (and its data.prompt) unless options say otherwise.

    Interrupted? Run the same command again: finished samples are kept.

    Example: tape eval babilong --model runs/rope --model runs/alibi --tasks qa1,qa2 --lengths 0,1k,2k,4k --samples 10 --out eval/babilong
    """
    from tapecli.eval.babilong import Babilong

    depth_list = (None if depths is None else "any" if depths.strip().lower() == "any"
                  else numbers(depths, "--depths", float, min=0, max=1))
    evaluation = Babilong(tasks, token_lengths(lengths) if lengths is not None else None, depth_list, samples, seed, prompt, haystack,
                          data, depth_window, threshold, base_token_lengths(base_lengths))
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("kv-retrieval")
def eval_kv_retrieval(
    model: list[str] = MODELS_OPTION,
    keys: str = typer.Option("75,140,300", "--keys", help="Comma-separated numbers of key-value pairs in the JSON "
                             "object (the paper: 75, 140, 300)."),
    positions: int | None = integer(None, "--positions", min=1, help="Gold positions per number of pairs, spread "
                                         "evenly from first to last (default: the paper's 4, 5 and 7 for 75, 140 "
                                         "and 300 pairs, else 5).", show_default=False),
    samples: int = integer(100, "--samples", min=1, help="Examples per number of pairs and gold position (the paper: "
                                "500)."),
    threshold: float = THRESHOLD_OPTION,
    seed: int = integer(0, "--seed", min=0, help="Seeds the UUIDs and the gold pair of every example."),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-kv-retrieval/<checkpoint name>; several models share one folder, "
                                 "./eval-kv-retrieval-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Lost in the middle's key-value retrieval: the value of one key among random UUID pairs, by the key's position.

    The official prompt (a JSON object of random UUID4 pairs, then the key); the gold pair is moved to each of --positions evenly spread positions; greedy answers of up to 100 tokens, right when they hold the value.

    results.json: accuracy per number of pairs and gold position, per number of pairs, the effective number of pairs (RULER: 85.6; NoLiMa: 85% of the smallest's) and LongScore; kv-retrieval.png (accuracy vs pairs), u-curve-<k>.png (the U-curve: accuracy vs gold position, one line per model), heatmap*.png.

    Interrupted? Run the same command again: finished prompts are kept.

    Example: tape eval kv-retrieval --model runs/rope --model runs/alibi --keys 10,20,40 --positions 5 --samples 20 --out eval/kv
    """
    from tapecli.eval.kv_retrieval import KvRetrieval

    evaluation = KvRetrieval(numbers(keys, "--keys", min=1), positions, samples, seed, threshold)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("latent-list")
def eval_latent_list(
    model: list[str] = MODELS_OPTION,
    lengths: str = typer.Option("1k,2k,4k,8k,16k", "--lengths", help="Comma-separated lengths in tokens (prompt + "
                                "answer; k = 1024)."),
    relevant_ops: str = typer.Option("1,5,20", "--relevant-ops", help="Comma-separated numbers of lines that change "
                                     "the list (the task's complexity); the rest of each program leaves it alone."),
    samples: int = integer(20, "--samples", min=1, help="Programs per length and number of relevant lines."),
    threshold: float = THRESHOLD_OPTION,
    base_lengths: str | None = BASE_LENGTHS_OPTION,
    seed: int = integer(0, "--seed", min=0, help="Seeds the programs."),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-latent-list/<checkpoint name>; several models share one folder, "
                                 "./eval-latent-list-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """Michelangelo's Latent List: what a long Python program that changes a list prints at its end.

    Programs of --relevant-ops lines that change the list `a` among distractor lines that do not, sized with the model's tokenizer; the last line prints a view of the list (the list, its length, sum, min, max, an element or a slice). Greedy answers, scored exactly (the printed value) and with partial credit.

    results.json: exact and approximate accuracy per number of relevant lines and length, the average per length, effective length (RULER: 85.6; NoLiMa: 85% of the base score) and LongScore; latent-list.png, heatmap*.png.

    Interrupted? Run the same command again: finished programs are kept.

    Example: tape eval latent-list --model runs/rope --model runs/tape --lengths 512,1k,2k --relevant-ops 1,5 --samples 10 --out eval/latent-list
    """
    from tapecli.eval.latent_list import LatentList

    evaluation = LatentList(token_lengths(lengths), numbers(relevant_ops, "--relevant-ops"), samples, seed, threshold,
                            base_token_lengths(base_lengths))
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)
