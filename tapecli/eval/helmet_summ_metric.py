"""HELMET's summarisation metrics that run offline (princeton-nlp/HELMET utils.py `calculate_metrics`, data.py's
post-processing), through Google's `rouge-score`, the library HELMET calls.

HELMET reports a GPT-4o judge for summarisation (scripts/eval_gpt4_summ.py: fluency x the F1 of key points recalled
and supported); it needs OpenAI's API and is not run here. What HELMET's own evaluation computes beside it is ROUGE
(`tapecli.eval.helmet_metric.rouge`):

- `summ_scores(output, answers, prefix)`: the post-processing: the metrics of the output and, when utils.py's
  `parse_output(output, prefix)` finds text, of that text, the larger of each (load_multi_lexsum parses after
  "Summary:", load_infbench's summarisation uses default_post_process and so the first line, after "Answer:").
"""

from __future__ import annotations

from typing import Any


def summ_scores(output: str, answers: Any, prefix: str) -> dict[str, float]:
    """The post-processed metrics: each the larger of the raw output's and the parsed output's."""
    from tapecli.eval.helmet_metric import parse_output, rouge

    scores = rouge(output, answers)
    parsed = parse_output(output, prefix)
    if parsed is not None:
        again = rouge(parsed, answers)
        scores = {k: max(v, again[k]) for k, v in scores.items()}
    return scores
