"""`tape eval helmet`'s summarisation (infbench_sum_eng, multi_lexsum) and citation (alce_asqa, alce_qampari) tasks:
what the HELMET protocol (`tapecli.eval.helmet`) asks of them, kept apart from its other categories.

- `prepare(evaluation, shuffled, draw)`: reads their files and fills the protocol's rows (here each drawn row is
  already the filled sample: HELMET's loaders cut documents and draw demonstrations before the model's own
  truncation), its draw and its list of files read (`tapecli.data.helmet_summ`, `helmet_cite`); opens the truncation
  tokenizer and the NLI model (on the CPU, moved to the models' device when first used), so that a bad name stops
  before anything is written.
- `score(evaluation, task, sample, output, device)`: the sample's metrics. As eval.py does for a completion without a
  chat template, the system template ("Summary:", "Answer:") is put before the generated text first. Summarisation:
  ROUGE-L and ROUGE-Lsum (F1 and recall, `helmet_summ_metric`; HELMET's GPT-4o judge is not run); citations: ALCE's
  STR-EM (ASQA) or QAMPARI's precision, recall and recall top-5, and, with `--nli-model`, citation recall and
  precision (`helmet_cite_metric`).
- `extend(summary, rows, tasks, lengths, nli_model)`: results.json beside the protocol's scores: `rougeL_f1[task]
  [length]`, `citations[task][length]` (citation_rec, citation_prec, x 100, the mean over the samples with sentences,
  as eval_alce averages them), HELMET's cite category (the mean of each task's answer metric, citation recall and
  precision) when the NLI model ran, and `notes` saying what was not computed.
"""

from __future__ import annotations

from typing import Any

CATEGORIES = ("summ", "cite")
JUDGE_NOTE = ("summarisation: ROUGE-Lsum F1 (x100); HELMET's primary metric, its GPT-4o judge (fluency x key-point "
              "F1), is not run")
NO_NLI_NOTE = ("citations: citation recall and precision were not computed (no --nli-model); the cite category is "
               "the mean of the answer metrics only (HELMET's also averages citation recall and precision)")


def prepare(evaluation: Any, shuffled: Any, draw: Any) -> None:
    """Rows, draw and files of the evaluation's summarisation and citation tasks at its lengths (`shuffled`, `draw`:
    the protocol's datasets shuffle and its max_test_samples draw)."""
    from tapecli.data import helmet, helmet_cite, helmet_summ

    for task in evaluation.tasks:
        category = helmet.TASKS[task].category
        samples = evaluation.samples or helmet.TASKS[task].samples
        if category == "summ":
            prepared, described = helmet_summ.prepare(evaluation.data, task, evaluation.lengths, samples,
                                                      evaluation.shots, evaluation.prepared.measurer(), shuffled)
            for length, chosen in prepared.items():
                evaluation.rows[task, length] = chosen
                evaluation.chosen[task, length] = sorted(chosen)
            evaluation.read_files += described
        elif category == "cite":
            rows, described = helmet_cite.read(evaluation.data, task)
            chosen = draw(len(rows), samples)
            for length in evaluation.lengths:
                evaluation.rows[task, length] = helmet_cite.samples(task, rows, length, evaluation.shots, chosen)
                evaluation.chosen[task, length] = chosen
            evaluation.read_files.append(described)
            if evaluation.nli_model and evaluation.nli is None:  # opened now: a bad name stops before any output
                from tapecli.eval.helmet_cite_metric import NliModel

                evaluation.nli = NliModel(evaluation.nli_model, "cpu")


def settings(evaluation: Any) -> dict[str, Any]:
    """settings.json's keys for these tasks (none when the run has none of them: earlier runs keep resuming)."""
    from tapecli.data import helmet
    from tapecli.data.sentences import sentence_splitter

    categories = {helmet.TASKS[t].category for t in evaluation.tasks}
    out: dict[str, Any] = {}
    if "cite" in categories:
        out["nli_model"] = evaluation.nli_model
        if evaluation.nli_model and "alce_asqa" in evaluation.tasks:
            out["sentence_splitter"] = sentence_splitter()[0]
    return out


def score(evaluation: Any, task: Any, sample: dict[str, Any], output: str, device: str) -> dict[str, Any]:
    """The sample's metrics (see the module docstring)."""
    from tapecli.data import helmet_cite, helmet_summ

    if task.category == "summ":
        from tapecli.eval.helmet_summ_metric import summ_scores

        prefix = helmet_summ.SYSTEM if task.name == "multi_lexsum" else "Answer:"  # load_infbench: default parse
        return summ_scores(helmet_summ.SYSTEM + output, sample["answer"], prefix)
    from tapecli.eval import helmet_cite_metric as alce

    text = alce.clean(helmet_cite.SYSTEM + output)
    plain = alce.remove_citations(text)
    out: dict[str, Any]
    if task.name == "alce_asqa":
        em, hit = alce.str_em(plain, sample["qa_pairs"])
        out = {"str_em": em, "str_hit": hit}
    else:
        out = alce.qampari(plain, sample["answers"])
    if evaluation.nli_model:
        from tapecli.data.sentences import sentence_splitter

        if isinstance(evaluation.nli, alce.NliModel):
            evaluation.nli.place(device)
        rec, prec = alce.citations(text, sample["question"], sample["docs"], evaluation.nli, sentence_splitter()[1],
                                   task.name == "alce_qampari")
        out.update(citation_rec=rec, citation_prec=prec)
    return out


def extend(summary: dict[str, Any], rows: list[dict[str, Any]], tasks: list[str], lengths: list[int],
           nli_model: str | None) -> dict[str, Any]:
    """The protocol's summary with these tasks' extra results and notes (see the module docstring)."""
    from tapecli.data.helmet import TASKS

    def cell(t: str, n: int) -> list[dict[str, Any]]:
        return [r for r in rows if r["task"] == t and r["length"] == n]

    def mean(values: list[float]) -> float:
        return round(100 * sum(values) / len(values), 2) if values else 0.0

    summ = [t for t in tasks if TASKS[t].category == "summ"]
    cite = [t for t in tasks if TASKS[t].category == "cite"]
    notes = []
    if summ:
        summary["rougeL_f1"] = {t: {str(n): mean([r["rougeL_f1"] for r in cell(t, n)]) for n in lengths
                                    if cell(t, n)} for t in summ}
        notes.append(JUDGE_NOTE)
    if cite and nli_model:
        summary["citations"] = {t: {str(n): {k: mean([r[k] for r in cell(t, n) if r[k] is not None])
                                             for k in ("citation_rec", "citation_prec")}
                                    for n in lengths if cell(t, n)} for t in cite}
        for n in lengths:
            parts = [v for t in cite if str(n) in summary["citations"][t]
                     for v in (summary["scores"][t][str(n)], *summary["citations"][t][str(n)].values())]
            if parts:
                summary["categories"]["cite"][str(n)] = round(sum(parts) / len(parts), 2)
    elif cite:
        notes.append(NO_NLI_NOTE)
    if notes:
        summary["notes"] = summary.get("notes", []) + notes
    return summary
