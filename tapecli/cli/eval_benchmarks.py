"""`tape eval mrcr`, `longbench-v2`, `nolima`, `helmet`: the published long-context benchmarks, read from their
data files (or the hub). Registered on `eval_app` after the generated tasks of eval_long.py, whose token lengths and
threshold option they share."""

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
from tapecli.cli.eval_long import THRESHOLD_OPTION, base_token_lengths, token_lengths
from tapecli.cli.options import integer, numbers


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

    evaluation = Mrcr(data, numbers(needles, "--needles", min=2, max=8), token_lengths(bins, "--bins") if bins else [],
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

    evaluation = NoLiMa(needle_set, haystack, token_lengths(lengths), depths, metric, seed, threshold,
                        base_token_lengths(base_lengths))
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

    evaluation = Helmet(data, commas.split(tasks, "--tasks"), token_lengths(lengths), samples, shots, nli_model,
                        truncation_tokenizer)
    run_and_report(evaluation, model, out, dtype, device, pe_arg, batch_size)
