"""HELMET's citation metrics: ALCE's evaluation as HELMET ships it (princeton-nlp/HELMET eval_alce.py, run by eval.py
with `--citations` and its default `--at_most_citations 3`), per sample, written out: no library computes them.

- `clean(output)`: eval_alce's first step: runs of new lines become one space, "<|im_end|>" is dropped;
  `remove_citations` (utils.py) takes "[n]" markers out for the answer metrics.
- `str_em(output, qa_pairs)` (ASQA): the share of the question's disambiguations with a short answer that appears,
  SQuAD-normalised, in the normalised output (compute_str_em's per-item value; `str_hit` is 1 when all do).
- `qampari(output, answers)` (QAMPARI): the output split at commas (after trailing ".", ","), normalised, empty parts
  dropped; precision (predictions among all aliases), recall (answers with an alias predicted), recall top-5
  (min(5, hits) / min(5, answers)), their F1s (compute_qampari_f1 without CoT).
- `citations(output, question, docs, nli, split, qampari)` (compute_autoais): sentences (ASQA: the sentence
  splitter's, those of 5 characters or more; QAMPARI: the question + each comma-separated answer), each with its
  "[n]" citations (the first 3), is entailed by its cited passages together ("Title: t\\ntext", one per line) or
  not; a sentence citing nothing, or a passage beyond the question's list, counts 0. Precision: a citation of a
  supported sentence with more than one citation counts unless it alone does not entail it and the others still do;
  with one citation, the sentence's entailment. Recall = entailed / sentences, precision = good / citations (0
  without citations); a sample without sentences gets none (eval_alce skips it when it averages).
- `NliModel`: ALCE's `_run_nli_autoais`: "premise: {passage} hypothesis: {claim}", greedy generation of up to 10
  tokens by a seq2seq model (ALCE and HELMET use google/t5_xxl_true_nli_mixture), 1 when the decoded text is "1".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.helmet_metric import normalize_answer

NLI_MODEL = "google/t5_xxl_true_nli_mixture"
AT_MOST_CITATIONS = 3  # eval_alce.py's --at_most_citations default


def clean(output: str) -> str:
    """eval_alce's output clean-up: new-line runs to one space, "<|im_end|>" removed."""
    return re.sub(r"\n+", " ", output).replace("<|im_end|>", "")


def remove_citations(sent: str) -> str:
    """utils.py's remove_citations."""
    return re.sub(r"\[\d+", "", re.sub(r" \[\d+", "", sent)).replace(" |", "").replace("]", "")


def str_em(output: str, qa_pairs: list[dict[str, Any]]) -> tuple[float, float]:
    """(STR-EM, STR-HIT) of one ASQA sample's citation-free output."""
    text = normalize_answer(output)
    found = [any(normalize_answer(a) in text for a in pair["short_answers"]) for pair in qa_pairs]
    acc = sum(found) / len(found)
    return acc, float(acc == 1)


def qampari(output: str, answers: list[list[str]]) -> dict[str, float]:
    """compute_qampari_f1's per-sample values (no CoT) of a citation-free output."""
    preds = [normalize_answer(x.strip()) for x in output.rstrip().rstrip(".").rstrip(",").split(",")]
    preds = [p for p in preds if len(p) > 0]
    groups = [[normalize_answer(x) for x in group] for group in answers]
    flat = [a for group in groups for a in group]
    prec = sum(p in flat for p in preds) / len(preds) if preds else 0
    hits = sum(any(x in preds for x in group) for group in groups)
    rec = hits / len(groups)
    rec_top5 = min(5, hits) / min(5, len(groups))
    return {"num_preds": len(preds), "qampari_prec": prec, "qampari_rec": rec, "qampari_rec_top5": rec_top5,
            "qampari_f1": 0 if prec + rec == 0 else 2 * prec * rec / (prec + rec),
            "qampari_f1_top5": 0 if prec + rec_top5 == 0 else 2 * prec * rec_top5 / (prec + rec_top5)}


def _document(doc: dict[str, Any]) -> str:
    return "Title: %s\n%s" % (doc["title"], doc["sent"] if "sent" in doc else doc["text"])  # noqa: UP031 - ALCE's


def citations(output: str, question: str, docs: list[dict[str, Any]], nli: Callable[[str, str], int],
              split: Callable[[str], list[str]], qampari_: bool) -> tuple[float | None, float | None]:
    """(citation recall, citation precision) of one sample's cleaned output, or (None, None) without sentences."""
    if qampari_:
        sents = [question + " " + x.strip() for x in output.rstrip().rstrip(".").rstrip(",").split(",")]
    else:
        sents = [x for x in split(output) if len(x.strip()) >= 5]
    if not sents:
        return None, None
    entail = entail_prec = total = 0
    for sent in sents:
        target = remove_citations(sent).strip()
        ref = [int(r[1:]) - 1 for r in re.findall(r"\[\d+", sent)]
        if not ref or any(r >= len(docs) for r in ref):
            joint = 0
        else:
            ref = ref[:AT_MOST_CITATIONS]
            total += len(ref)
            joint = nli("\n".join(_document(docs[r]) for r in ref), target)
        entail += joint
        if joint and len(ref) > 1:
            for r in ref:
                if nli(_document(docs[r]), target):
                    entail_prec += 1
                else:
                    rest = list(ref)
                    rest.remove(r)
                    entail_prec += 0 if nli("\n".join(_document(docs[p]) for p in rest), target) else 1
        else:
            entail_prec += joint
    return entail / len(sents), (entail_prec / total if total > 0 else 0)


class NliModel:
    """ALCE's AutoAIS judge: a seq2seq NLI model read from a folder or the hub, on `device`, in bfloat16 as ALCE
    loads it; calling it with (passage, claim) gives 1 (entailed) or 0."""

    def __init__(self, name: str, device: str) -> None:
        import torch

        from tapecli.data.sources import hub_unreachable

        try:
            from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        except ImportError:
            raise TapeError("--nli-model needs the transformers library (pip install transformers), which loads the "
                            "NLI model") from None
        try:
            self.model = AutoModelForSeq2SeqLM.from_pretrained(name, dtype=torch.bfloat16).to(device).eval()
            self.tokenizer = AutoTokenizer.from_pretrained(name, use_fast=False)
        except Exception as e:  # noqa: BLE001 - offline, missing or unreadable: one line naming the fix
            why = ("cannot be read from the Hugging Face hub (offline or unreachable)" if hub_unreachable(e) else
                   f"cannot be opened ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            raise TapeError(f"--nli-model {name} {why}; pass a folder holding a copy of {NLI_MODEL} (the NLI model "
                            "HELMET and ALCE score citations with), or leave --nli-model out to skip citation recall "
                            "and precision") from None
        self.device = device

    def place(self, device: str) -> None:
        """Move the model to `device` (the evaluated models') unless it is there."""
        if str(device) != str(self.device):
            self.model.to(device)
            self.device = device

    def __call__(self, passage: str, claim: str) -> int:
        import torch

        ids = self.tokenizer(f"premise: {passage} hypothesis: {claim}", return_tensors="pt").input_ids
        with torch.inference_mode():
            out = self.model.generate(ids.to(self.device), max_new_tokens=10)
        return 1 if self.tokenizer.decode(out[0], skip_special_tokens=True) == "1" else 0
