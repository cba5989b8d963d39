"""HELMET's per-sample metrics (princeton-nlp/HELMET utils.py and data.py), written out where no library computes
them, ROUGE through rouge-score (the library HELMET calls).

- `normalize_answer`: SQuAD's normalisation (lower case, no punctuation, no articles, single spaces);
- `substring_exact_match(prediction, answers)`: 1 when some normalised answer is a substring of the normalised
  prediction (utils.py's `drqa_metric_max_over_ground_truths(substring_exact_match_score, ...)`; answers a string, a
  list, or a list of lists, flattened);
- `parse_output(output, prefix)`: utils.py's parser (the text after `prefix` on its line, else the first line);
- `sub_em_score(output, answers, prefix)`: data.py's `load_json_kv` post_process (prefix "corresponding value:")
  and `default_post_process` (RAG; prefix "Answer:"): the larger SubEM of the raw output and of the output parsed
  after the prefix;
- `ruler_recall(output, answers)`: data.py's `load_ruler` post_process: the share of answers found, lower-cased, in
  the output;
- `rouge(prediction, answers)`: calculate_metrics' ROUGE part: `RougeScorer(["rougeL", "rougeLsum"],
  use_stemmer=True)`, `score(target=answer, prediction=prediction)` for each answer (flattened as above), the largest
  F1 and the largest recall of each over the answers (rougeL_f1, rougeL_recall, rougeLsum_f1, rougeLsum_recall).
  ROUGE-Lsum splits summaries at new lines, as rouge-score does.
"""

from __future__ import annotations

import re
import string
from functools import lru_cache
from typing import Any


def normalize_answer(text: str) -> str:
    """utils.py's normalize_answer."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _flat(answers: Any) -> list[str]:
    if isinstance(answers, str):
        return [answers]
    if isinstance(answers[0], list):
        return [a for group in answers for a in group]
    return list(answers)


def substring_exact_match(prediction: str, answers: Any) -> bool:
    """Max over the answers of `normalize_answer(answer) in normalize_answer(prediction)`."""
    return max(normalize_answer(a) in normalize_answer(prediction) for a in _flat(answers))


def parse_output(output: str, prefix: str = "Answer:") -> str | None:
    """utils.py's parse_output."""
    def lstrip_string(s: str, sub: str) -> str:
        return re.sub(f"^{re.escape(sub)}", "", s, flags=re.IGNORECASE)

    patterns = [re.compile(f"(?:{prefix})(.*)(?:\n|$)", flags=re.IGNORECASE), re.compile(r"(?:^)(.*)(?:\n|$)")]
    for pattern in patterns:
        matches = pattern.search(output)
        if matches is not None:
            return lstrip_string(matches[1].strip(), prefix).strip()
    return None


def sub_em_score(output: str, answer: Any, prefix: str) -> float:
    """load_json_kv's post_process and default_post_process, their reported metric: SubEM of the output or of its
    parsed value, the larger."""
    parsed = parse_output(output, prefix)
    return float(max(substring_exact_match(output, answer), substring_exact_match(parsed, answer)))


def ruler_recall(output: str, answers: list[str]) -> float:
    """load_ruler's post_process: the fraction of answers that occur, lower-cased, in the output."""
    return sum(a.lower() in output.lower() for a in answers) / len(answers)


@lru_cache(maxsize=1)
def _scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL", "rougeLsum"], use_stemmer=True)


def rouge(prediction: str, answers: Any) -> dict[str, float]:
    """calculate_metrics' ROUGE-L and ROUGE-Lsum: the best F1 and recall over the answers."""
    scores = [_scorer().score(target=a, prediction=prediction) for a in _flat(answers)]
    out = {}
    for kind in ("rougeL", "rougeLsum"):
        out[f"{kind}_f1"] = max(s[kind].fmeasure for s in scores)
        out[f"{kind}_recall"] = max(s[kind].recall for s in scores)
    return out
