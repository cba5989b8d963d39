"""`tape eval ruler`, `babilong`, `kv-retrieval`, `latent-list`, `mrcr`, `longbench-v2`, `nolima`: the long-context
evaluations, which share lengths in tokens (`1k` = 1024), the effective length's threshold and base lengths.
Registered on `eval_app` (tapecli.cli.eval, whose shared options and runner they use); `tapecli.cli` imports this
module after it, so they follow the other evaluations in `tape eval --help`."""

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


def _lengths(text: str, option: str = "--lengths") -> list[int]:
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


def _base_lengths(text: str | None) -> list[int] | None:
    return _lengths(text, "--base-lengths") if text is not None else None


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
                       notify=typer.echo, base_lengths=_base_lengths(base_lengths))
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
    evaluation = Babilong(tasks, _lengths(lengths) if lengths is not None else None, depth_list, samples, seed, prompt, haystack,
                          data, depth_window, threshold, _base_lengths(base_lengths))
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

    evaluation = LatentList(_lengths(lengths), numbers(relevant_ops, "--relevant-ops"), samples, seed, threshold,
                            _base_lengths(base_lengths))
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("mrcr")
def eval_mrcr(
    model: list[str] = MODELS_OPTION,
    data: str | None = typer.Option(None, "--data", help="MRCR's parquet files: a folder (its 2needle/, 4needle/, "
                                    "8needle/) or one file (default: the hub dataset openai/mrcr, online only)."),
    needles: str = typer.Option("2,4,8", "--needles", help="Comma-separated needle counts among 2, 4, 8."),
    bins: str | None = typer.Option(None, "--bins", help="Comma-separated bin edges in tokens (prompt + answer, in "
                                    "the model's tokenizer; k = 1024); a row counts in the (lower, upper] bin holding "
                                    "it, rows outside every bin are left out (default: the official 4k,8k,...,1024k).",
                                    show_default=False),
    samples: int | None = integer(None, "--samples", min=1, help="Conversations per needle count and bin, the first "
                                  "in file order (default: all; the dataset holds 100).", show_default=False),
    batch_size: int = batch_size_option(1, "Conversations decoded together"),
    out: str | None = out_option("RUN/eval-mrcr/<checkpoint name>; several models share one folder, "
                                 "./eval-mrcr-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """OpenAI MRCR: reproduce the i-th of 2, 4 or 8 identical requests' answers from a long conversation.

    The conversation is read as "User:" / "Assistant:" turns; the model must start its answer with the row's hash. Greedy answers of up to twice the answer's tokens, stopping at EOS or the next "User:" turn, scored by the dataset card's grade(): 0 without the hash, else the difflib SequenceMatcher ratio.

    results.json: the mean ratio per needle count and bin, per needle count, per bin and overall, and the share of answers without the hash; mrcr.png: ratio vs bin, one line per model and needle count.

    Interrupted? Run the same command again: finished conversations are kept.

    Example: tape eval mrcr --model runs/rope --data mrcr/ --needles 2,4 --bins 4k,8k,16k,32k --samples 20 --out eval/mrcr
    """
    from tapecli.eval.mrcr import Mrcr

    evaluation = Mrcr(data, numbers(needles, "--needles", min=2, max=8), _lengths(bins, "--bins") if bins else [],
                      samples)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("longbench-v2")
def eval_longbench_v2(
    model: list[str] = MODELS_OPTION,
    data: str | None = typer.Option(None, "--data", help="LongBench v2's data.json, or a folder holding it (default: "
                                    "the hub dataset THUDM/LongBench-v2, online only)."),
    cot: bool = typer.Option(False, "--cot/--no-cot", help="Chain of thought, as the official pred.py -cot: up to "
                             "1,024 tokens of reasoning, then the answer prompt with it."),
    max_length: int | None = integer(None, "--max-length", min=2, help="Prompt budget in tokens; a longer prompt "
                                     "keeps its first and last halves (default: the model's max_seq_len less the "
                                     "tokens to generate).", show_default=False),
    limit: int | None = integer(None, "--limit", min=1, help="Only the first N questions (a quick look; the score is "
                                "then not the benchmark's).", show_default=False),
    batch_size: int = batch_size_option(1, "Questions decoded together"),
    out: str | None = out_option("RUN/eval-longbench-v2/<checkpoint name> (with --cot: eval-longbench-v2-cot); "
                                 "several models share one folder, ./eval-longbench-v2-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """LongBench v2: multiple-choice questions on long documents, accuracy by difficulty and length.

    The official prompts (0-shot, or chain of thought with --cot), cut in the middle to the prompt budget as the official pred.py cuts them; greedy answers of up to 128 tokens; the letter found by pred.py's extract_answer ("The correct answer is (X)").

    results.json: accuracy overall, easy, hard, short, medium, long (as result.py prints it), the compensated variant (0.25 per unanswered question), unanswered and truncated counts; longbench-v2.png.

    Interrupted? Run the same command again: finished questions are kept.

    Example: tape eval longbench-v2 --model runs/rope --data LongBench-v2/data.json --cot --out eval/longbench-v2-cot
    """
    from tapecli.eval.longbench_v2 import LongBenchV2

    evaluation = LongBenchV2(data, cot, max_length, limit)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("nolima")
def eval_nolima(
    model: list[str] = MODELS_OPTION,
    needle_set: str | None = typer.Option(None, "--needle-set", help="NoLiMa's needle set JSON (needle_set.json, or "
                                          "a variant: _hard, _w_CoT, _w_Distractor, ...) (default: the hub's "
                                          "amodaresi/NoLiMa needle_set.json, online only)."),
    haystack: str | None = typer.Option(None, "--haystack", help="The haystack books: a folder of .txt files "
                                        "(rand_book_1.txt ... rand_book_5.txt) or one (default: the hub's five, "
                                        "online only)."),
    lengths: str = typer.Option("250,500,1000,2000,4000,8000,16000,32000", "--lengths", help="Comma-separated "
                                "context lengths in tokens of book text (NoLiMa's 1K is 1000; k = 1024 here)."),
    depths: int = integer(26, "--depths", min=1, help="Needle depths per test, book and length: np.linspace(0, 100, "
                          "N) % (NoLiMa: 26)."),
    metric: str = typer.Option("contains", "--metric", help="contains (NoLiMa's run configs), EM, lastline_EM or "
                               "lastline_contains."),
    seed: int = integer(42, "--seed", min=0, help="Base seed of the character draws (NoLiMa: 42)."),
    threshold: float = THRESHOLD_OPTION,
    base_lengths: str | None = typer.Option(None, "--base-lengths", help="Lengths whose mean score is the base "
                                            "score (NoLiMa's effective length: 85% of it; LongScore) (default: 250, "
                                            "500 and 1000 where evaluated, else the shortest length).",
                                            show_default=False),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-nolima/<checkpoint name>; several models share one folder, "
                                 "./eval-nolima-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """NoLiMa: needle in a haystack without literal matches between the question and the needle.

    Every test of the needle set (one-hop and two-hop questions), every book and length gets --depths trials, placed and seeded as the official run_tests.py and book_haystack.py do it, with the model's own tokenizer; greedy answers of up to 192 tokens, scored by the official _evaluate_response (--metric).

    results.json: accuracy per length (all, per question type, per test), the base score, NoLiMa's effective length (85% of the base score), RULER's and LongScore; nolima.png: accuracy vs length.

    Interrupted? Run the same command again: finished trials are kept.

    Example: tape eval nolima --model runs/rope --needle-set NoLiMa/needle_set.json --haystack NoLiMa/rand_shuffle --lengths 250,500,1000,2000 --depths 11 --out eval/nolima
    """
    from tapecli.eval.nolima import NoLiMa

    evaluation = NoLiMa(needle_set, haystack, _lengths(lengths), depths, metric, seed, threshold,
                        _base_lengths(base_lengths))
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)


@eval_app.command("helmet")
def eval_helmet(
    model: list[str] = MODELS_OPTION,
    data: str | None = typer.Option(None, "--data", help="HELMET's released data: the data/ folder extracted from "
                                    "its data.tar.gz (json_kv/, ruler/, ...), holding for ICL and long-document QA "
                                    "local copies of the hub datasets HELMET reads (trec/, banking77/, clinc_oos/, "
                                    "nlu_evaluation_data/, narrativeqa/, infinitebench/) (default: the hub, online "
                                    "only)."),
    tasks: str = typer.Option("recall,rag,rerank", "--tasks", "-t", help="Comma-separated categories or tasks: "
                              "recall (HELMET's synthetic recall: json_kv, ruler_niah_mk_2, ruler_niah_mk_3, "
                              "ruler_niah_mv), rag (kilt_nq, kilt_triviaqa, kilt_hotpotqa, kilt_popqa), rerank "
                              "(msmarco_rerank_psg), icl (icl_trec_coarse, icl_trec_fine, icl_banking77, "
                              "icl_clinic150, icl_nlu), longqa (narrativeqa, infbench_qa_eng, infbench_choice_eng), "
                              "summ (infbench_sum_eng, multi_lexsum), cite (alce_asqa, alce_qampari), or tasks among "
                              "them."),
    lengths: str = typer.Option("8k,16k,32k,64k,128k", "--lengths", help="Comma-separated input lengths in tokens "
                                "(HELMET's input_max_length; k = 1024): each picks the task's file for that length "
                                "and is the prompt + answer budget (json_kv, RAG and re-ranking have files for 4k-128k only)."),
    samples: int | None = integer(None, "--samples", min=1, help="Rows per task and length, drawn as HELMET draws "
                                  "max_test_samples (shuffle with seed 42) (default: HELMET's, 100; ICL 500)."),
    shots: int = integer(2, "--shots", min=0, help="In-context demonstrations: json_kv's from the row itself, RAG's "
                         "and re-ranking's drawn per question from the task's demonstration file, long-document "
                         "QA's from other questions (HELMET: 2; ICL's many shots are set by the length)."),
    nli_model: str | None = typer.Option(None, "--nli-model", help="Citations: the NLI model that scores citation "
                                         "recall and precision, a folder or a hub id (HELMET and ALCE: "
                                         "google/t5_xxl_true_nli_mixture); without it only the answer metrics are "
                                         "computed, and the output says so."),
    truncation_tokenizer: str = typer.Option("meta-llama/Llama-2-7b-hf", "--truncation-tokenizer", help="Long-"
                                             "document QA and summarisation: the tokenizer HELMET measures and cuts "
                                             "documents with before any model sees them (Llama-2's; a folder or a hub "
                                             "id, a fast tokenizer)."),
    batch_size: int = batch_size_option(1, "Prompts decoded together"),
    out: str | None = out_option("RUN/eval-helmet/<checkpoint name>; several models share one folder, "
                                 "./eval-helmet-comparison"),
    dtype: str = DTYPE_OPTION,
    device: str = DEVICE_OPTION,
    pe_arg: list[str] | None = PE_ARG_OPTION,
) -> None:
    """HELMET: its synthetic recall, RAG, re-ranking, many-shot ICL, long-document QA, summarisation and citation categories at 4K-128K tokens.

    HELMET's released files and the Hugging Face datasets it reads, its prompts and base-model demonstrations (no chat template); a prompt over the length less the tokens to generate has its context cut at the end, as HELMET's tokenize() does (long-document QA's and summarisation's documents first cut with the Llama-2 tokenizer, as HELMET does); greedy answers up to each task's generation length (RAG, re-ranking, ICL: stopping at a new line), scored by HELMET's metrics (SubEM for json_kv and RAG, RULER recall for the RULER tasks, NDCG@10 for re-ranking, accuracy for ICL and InfiniteBench's multiple choice, ROUGE-L F1 for InfiniteBench's QA, ROUGE-Lsum F1 for summarisation, ALCE's STR-EM or QAMPARI recall top-5, and citation recall and precision with --nli-model). NarrativeQA is scored by ROUGE-L F1 and SubEM and summarisation by ROUGE-Lsum F1: HELMET's GPT-4o judge is not run.

    results.json: the score (x100) per task and length, each category's (the mean of its tasks) per length; helmet.png: category score vs length.

    Interrupted? Run the same command again: finished samples are kept.

    Example: tape eval helmet --model runs/rope --data HELMET/data --lengths 8k,16k --samples 20 --out eval/helmet
    """
    from tapecli.eval.helmet import Helmet

    evaluation = Helmet(data, commas.split(tasks, "--tasks"), _lengths(lengths), samples, shots, nli_model,
                        truncation_tokenizer)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)
