"""HELMET's summarisation metrics that run offline (princeton-nlp/HELMET utils.py `calculate_metrics`, data.py's
post-processing), through Google's `rouge-score`, the library HELMET calls.

HELMET reports a GPT-4o judge for summarisation (scripts/eval_gpt4_summ.py: fluency x the F1 of key points recalled
and supported); it needs OpenAI's API and is not run here. What HELMET's own evaluation computes beside it is ROUGE:

- `rouge(prediction, answers)`: calculate_metrics' ROUGE part: `RougeScorer(["rougeL", "rougeLsum"],
  use_stemmer=True)`, `score(target=answer, prediction=prediction)` for each answer (a string, a list, or a list of
  lists, flattened), the largest F1 and the largest recall of each over the answers (rougeL_f1, rougeL_recall,
  rougeLsum_f1, rougeLsum_recall). ROUGE-Lsum splits summaries at new lines, as rouge-score does.
- `summ_scores(output, answers, prefix)`: the post-processing: the metrics of the output and, when utils.py's
  `parse_output(output, prefix)` finds text, of that text, the larger of each (load_multi_lexsum parses after
  "Summary:", load_infbench's summarisation uses default_post_process and so the first line, after "Answer:").
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

KEYS = ("rougeL_f1", "rougeL_recall", "rougeLsum_f1", "rougeLsum_recall")


@lru_cache(maxsize=1)
def _scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL", "rougeLsum"], use_stemmer=True)


def rouge(prediction: str, answers: Any) -> dict[str, float]:
    """calculate_metrics' ROUGE-L and ROUGE-Lsum: the best F1 and recall over the answers."""
    from tapecli.eval.helmet_metric import _flat

    scorer = _scorer()
    scores = [scorer.score(target=a, prediction=prediction) for a in _flat(answers)]
    out = {}
    for kind in ("rougeL", "rougeLsum"):
        out[f"{kind}_f1"] = max(s[kind].fmeasure for s in scores)
        out[f"{kind}_recall"] = max(s[kind].recall for s in scores)
    return out


def summ_scores(output: str, answers: Any, prefix: str) -> dict[str, float]:
    """The post-processed metrics: each the larger of the raw output's and the parsed output's."""
    from tapecli.eval.helmet_metric import parse_output

    scores = rouge(output, answers)
    parsed = parse_output(output, prefix)
    if parsed is not None:
        again = rouge(parsed, answers)
        scores = {k: max(v, again[k]) for k, v in scores.items()}
    return scores
