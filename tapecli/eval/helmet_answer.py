"""HELMET's metrics for its ICL and long-document QA categories (princeton-nlp/HELMET utils.py's `calculate_metrics`
and data.py's post-processing), written out on top of `helmet_metric` (SQuAD normalisation, SubEM, `parse_output`);
ROUGE-L F1 is `helmet_metric.rouge`'s rougeL_f1.

- `exact_match(prediction, answers)`: utils.py's drqa exact match, the max over the answers (a string or a list);
- `scores(task, output, answer)`: the metrics HELMET reports for the task (scripts/collect_results.py), as data.py's
  post_process computes them: ICL, exact_match of the output parsed after "label:" (load_icl's post_process);
  infbench_qa_eng, rougeL_f1, and narrativeqa, rougeL_f1 and substring_exact_match, each the larger of the raw and
  the parsed output (default_post_process; HELMET reports NarrativeQA by a GPT-4o judge, which tape does not run);
  infbench_choice_eng, exact_match of the raw or the parsed output against [letter, "letter. option"], or 1 when
  "letter. option" occurs, lower-cased, in the output (choice_post_process).
"""

from __future__ import annotations

from typing import Any

from tapecli.eval.helmet_metric import _flat, normalize_answer, parse_output, rouge, substring_exact_match


def exact_match(prediction: str, answers: Any) -> bool:
    """Max over the answers of `normalize_answer(prediction) == normalize_answer(answer)`."""
    return max(normalize_answer(prediction) == normalize_answer(a) for a in _flat(answers))


def scores(task: str, output: str, answer: Any) -> dict[str, float]:
    """The task's reported metric (and NarrativeQA's SubEM beside its ROUGE-L F1) for one output."""
    if task.startswith("icl_"):
        return {"exact_match": float(exact_match(parse_output(output, "label:"), answer))}
    parsed = parse_output(output)
    if task == "infbench_choice_eng":
        em = max(exact_match(output, answer), exact_match(parsed, answer))
        return {"exact_match": float(em or answer[1].lower() in output.lower())}
    out = {"rougeL_f1": max(rouge(output, answer)["rougeL_f1"], rouge(parsed, answer)["rougeL_f1"])}
    if task == "narrativeqa":
        out["substring_exact_match"] = float(max(substring_exact_match(output, answer),
                                                 substring_exact_match(parsed, answer)))
    return out
