"""RULER's metric (`scripts/eval/synthetic/constants.py` and `scripts/eval/evaluate.py`, NVIDIA/RULER at main).

- `postprocess(prediction)`: strip, every control character (\\x00-\\x1f) becomes a newline, strip again.
- `string_match_all(preds, refs)`: per sample, the share of its references that occur in the prediction
  (case-insensitive substring); the mean over samples x 100, rounded to 2 decimals. NIAH, vt, cwe, fwe.
- `string_match_part(preds, refs)`: per sample, 1 if any reference occurs; same mean. QA.
- `sample_score(kind, pred, refs)`: one sample's value in [0, 1] (what samples.jsonl records); a task's score is the
  mean of its samples x 100, which equals the official functions above (the tests check it).

lm-eval 0.4.13's `string_match_part` (lm_eval/tasks/ruler/common_utils.py) takes the max over samples of the
share of references found, divided by the number of samples; per sample that is the "all" value, not "part".
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction.strip()).strip()


def string_match_all(preds: list[str], refs: list[list[str]]) -> float:
    score = sum(sum(1.0 if r.lower() in p.lower() else 0.0 for r in ref) / len(ref)
                for p, ref in zip(preds, refs, strict=True)) / len(preds) * 100
    return round(score, 2)


def string_match_part(preds: list[str], refs: list[list[str]]) -> float:
    score = sum(max(1.0 if r.lower() in p.lower() else 0.0 for r in ref)
                for p, ref in zip(preds, refs, strict=True)) / len(preds) * 100
    return round(score, 2)


METRIC_FUNCTIONS = {"all": string_match_all, "part": string_match_part}


def sample_score(kind: str, prediction: str, references: list[str]) -> float:
    """One sample's value in [0, 1] under the "all" or "part" metric (prediction already post-processed)."""
    hits = [r.lower() in prediction.lower() for r in references]
    return sum(hits) / len(hits) if kind == "all" else float(any(hits))
