"""The official SCROLLS metric (`tau/scrolls` hub repo, `metrics/scrolls.py`), re-created on the same libraries.

The official metric is a `datasets.Metric` script downloaded at run time, which neither `datasets` >= 3 (no
`load_metric`) nor an offline machine can load, so its rules are restated here:

- quality, contract_nli: exact match; narrative_qa, qasper: token F1. Both after SQuAD normalisation (lower-case,
  drop `string.punctuation`, drop the words a/an/the, collapse whitespace); F1 counts tokens as a multiset; an
  example's value is its best over its references.
- gov_report, qmsum, summ_screen_fd: ROUGE-1, ROUGE-2, ROUGE-L (and ROUGE-Lsum) F-measures from Google's
  `rouge-score` with `use_stemmer=False`, every text first split into sentences joined by newlines; each key takes
  its best over the references separately; the score is the geometric mean of the three *averaged* ROUGE-1/2/L
  values (ROUGE-Lsum is reported, not scored).
- everything is a mean over examples, x100, rounded to 4 decimals; `scrolls_score` is the task's score key.

The token F1, exact match and normalisation are written out here because they are a few lines with no library
that matches SQuAD's exactly (lm-eval's copy sits in a module that cannot be imported with transformers 5); ROUGE
is never hand-written.

Sentence splitting (only ROUGE-Lsum depends on it; `rouge-score`'s tokenizer treats newlines as spaces, so ROUGE-1,
ROUGE-2, ROUGE-L and the score do not): the official code uses `nltk.sent_tokenize`, whose English Punkt model is a
separate download (`python -m nltk.downloader punkt_tab`). When that model is installed it is used, exactly as the
official metric does; otherwise nltk's untrained `PunktSentenceTokenizer` (same algorithm, no learned
abbreviations) stands in, and `results.json` names which one ran (`sentence_splitter`).
"""

from __future__ import annotations

import functools
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tapecli.data.sentences import sentence_splitter
from tapecli.errors import TapeError

# Task -> (metric family, score key, display keys), as `DATASET_TO_METRICS` in the official script.
TASK_METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gov_report": ("rouge", "rouge/geometric_mean", ("rouge/rouge1", "rouge/rouge2", "rouge/rougeL")),
    "summ_screen_fd": ("rouge", "rouge/geometric_mean", ("rouge/rouge1", "rouge/rouge2", "rouge/rougeL")),
    "qmsum": ("rouge", "rouge/geometric_mean", ("rouge/rouge1", "rouge/rouge2", "rouge/rougeL")),
    "narrative_qa": ("f1", "f1", ("f1",)),
    "qasper": ("f1", "f1", ("f1",)),
    "quality": ("exact_match", "exact_match", ("exact_match",)),
    "contract_nli": ("exact_match", "exact_match", ("exact_match",)),
}
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop articles, collapse whitespace (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1 of the normalised texts (multiset overlap); 0 when nothing overlaps (also for two empties)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


@functools.cache
def rouge_text(text: str) -> str:
    """The official ROUGE preprocessing: one sentence per line (`rouge_postprocess_text`)."""
    return "\n".join(sentence_splitter()[1](text))


def rouge_scores(prediction: str, references: Sequence[str]) -> dict[str, float]:
    """Per-key best ROUGE F-measure (x100) of one prediction over its references."""
    from rouge_score import rouge_scorer

    scorer = _scorer(rouge_scorer)
    pred = rouge_text(prediction)
    best = dict.fromkeys(ROUGE_TYPES, 0.0)
    for reference in references:
        scores = scorer.score(rouge_text(reference), pred)  # rouge-score takes (target, prediction)
        for key in ROUGE_TYPES:
            best[key] = max(best[key], scores[key].fmeasure * 100)
    return best


@functools.cache
def _scorer(rouge_scorer: Any) -> Any:
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=False)


def example_scores(task: str, prediction: str, references: Sequence[str]) -> dict[str, float]:
    """The metric values (x100, unrounded) of one example, keyed like results.json (`f1`, `rouge/rouge1`, ...)."""
    family = task_family(task)
    if family == "rouge":
        return {f"rouge/{k}": v for k, v in rouge_scores(prediction, references).items()}
    fn = token_f1 if family == "f1" else exact_match
    return {family: max(fn(prediction, r) for r in references) * 100}


def aggregate(task: str, per_example: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Mean over examples, the geometric mean for ROUGE tasks, rounding and `scrolls_score`, as the official
    `_compute` returns them (plus `num_predicted`)."""
    if not per_example:
        raise TapeError(f"{task}: no examples to score")
    family, score_key, display_keys = TASK_METRICS[task]
    means = {key: sum(e[key] for e in per_example) / len(per_example) for key in per_example[0]}
    if family == "rouge":
        product = means["rouge/rouge1"] * means["rouge/rouge2"] * means["rouge/rougeL"]
        means["rouge/geometric_mean"] = product ** (1 / 3)
    out: dict[str, Any] = {key: round(value, 4) for key, value in means.items()}
    out["num_predicted"] = len(per_example)
    out["scrolls_score"] = out[score_key]
    out["score_key"] = score_key
    out["display_keys"] = list(display_keys)
    if family == "rouge":
        out["sentence_splitter"] = sentence_splitter()[0]
    return out


def score_predictions(task: str, predictions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                      where: str = "predictions") -> dict[str, Any]:
    """Score {id: prediction} against {id: [reference, ...]} like the official evaluator: every id of the split
    must be predicted and no other (a missing or extra id raises TapeError naming one of them)."""
    missing = [i for i in references if i not in predictions]
    extra = [i for i in predictions if i not in references]
    if missing:
        raise TapeError(f"{where}: no prediction for id {missing[0]!r} ({len(missing)} of {len(references)} ids "
                        "missing)")
    if extra:
        raise TapeError(f"{where}: id {extra[0]!r} is not in the references ({len(extra)} unknown ids)")
    for i, text in predictions.items():
        if not isinstance(text, str):
            raise TapeError(f"{where}: the prediction for id {i!r} is {type(text).__name__}, not a string")
    out = aggregate(task, [example_scores(task, predictions[i], references[i]) for i in references])
    out["mean_prediction_length_characters"] = round(sum(len(predictions[i]) for i in references) / len(references), 4)
    return out


def task_family(task: str) -> str:
    if task not in TASK_METRICS:
        raise TapeError(f"unknown SCROLLS task {task!r}; allowed: {', '.join(TASK_METRICS)}")
    return TASK_METRICS[task][0]
