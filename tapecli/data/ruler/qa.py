"""Question answering (`qa_1` SQuAD, `qa_2` HotpotQA): RULER's `qa.py` (NVIDIA/RULER at main).

Documents ("Document {i}:\\n{text}", blank-line separated) around a question; the model answers from them. The
documents are the question's own paragraph(s), then (SQuAD) the other paragraphs of its article, then random other
paragraphs, the whole list shuffled with a fresh `Random(seed)`; beyond the whole corpus the corpus repeats. Sample i
asks question i of the file (in file order). The number of documents comes from the binary search of `sizing`
(probed on question 0, from 10 documents).

`read_squad` / `read_hotpotqa` read the files RULER downloads (`json/squad.json` = SQuAD 2.0 dev, `json/hotpotqa.json`
= HotpotQA dev distractor) exactly as the script does: (questions, the sorted set of all paragraphs). A SQuAD 1.1
file (no `is_impossible`) reads as all questions answerable.
"""

from __future__ import annotations

import random
from typing import Any

from tapecli.data.ruler.constants import FAMILIES
from tapecli.data.ruler.sizing import Counter, RulerSample, draw_samples, largest_fitting
from tapecli.errors import TapeError

FAMILY = FAMILIES["qa"]
DOCUMENT = "Document {i}:\n{document}"
QaSet = tuple[list[dict[str, Any]], list[str]]  # (questions, documents)


def read_squad(data: dict[str, Any]) -> QaSet:
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    doc_id = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        article = [doc_id[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):
                    own = doc_id[p["context"]]
                    qas.append({"query": qa["question"], "outputs": [a["text"] for a in qa["answers"]],
                                "context": [own], "more_context": [i for i in article if i != own]})
    return qas, docs


def read_hotpotqa(data: list[dict[str, Any]]) -> QaSet:
    docs = sorted({f"{title}\n{''.join(sentences)}" for d in data for title, sentences in d["context"]})
    doc_id = {c: i for i, c in enumerate(docs)}
    qas = [{"query": d["question"], "outputs": [d["answer"]],
            "context": [doc_id[f"{title}\n{''.join(sentences)}"] for title, sentences in d["context"]]}
           for d in data]
    return qas, docs


class QA:
    def __init__(self, task: str, args: dict, count: Counter, seed: int, qa_sets: dict[str, QaSet]) -> None:
        dataset = args["dataset"]
        if dataset not in qa_sets:
            raise TapeError(f"{task} needs the {dataset} data (--qa-data)")
        self.task, self.count, self.seed = task, count, seed
        self.qas, self.docs = qa_sets[dataset]
        self.rng = random.Random(seed)

    def make(self, index: int, num_docs: int) -> tuple[str, list[str]]:
        """`generate_input_output`: the whole prompt (template + answer prefix) and the answers of question `index`."""
        qa = self.qas[index]
        own, more = qa["context"], qa.get("more_context", [])
        if num_docs < len(self.docs):
            if num_docs - len(own) > len(more):
                taken = set(own + more)
                others = [i for i in range(len(self.docs)) if i not in taken]
                chosen = own + more + self.rng.sample(others, max(0, num_docs - len(own) - len(more)))
            else:
                chosen = own + self.rng.sample(more, num_docs - len(own))
            docs = [self.docs[i] for i in chosen]
        else:
            repeats = (num_docs + len(self.docs) - 1) // len(self.docs)
            docs = (self.docs * repeats)[:num_docs]
        random.Random(self.seed).shuffle(docs)
        context = "\n\n".join(DOCUMENT.format(i=i + 1, document=d) for i, d in enumerate(docs))
        return FAMILY.prompt_template.format(context=context, query=qa["query"]), qa["outputs"]

    def samples(self, max_length: int, num_samples: int) -> list[RulerSample]:
        if num_samples > len(self.qas):
            raise TapeError(f"{self.task}: --samples {num_samples} exceeds the {len(self.qas)} answerable questions "
                            "of the data")
        budget, to_generate, incremental = max_length, FAMILY.tokens_to_generate, 10
        per_doc = self.count(self.make(0, incremental)[0]) / incremental
        upper = max(int((budget / per_doc) * 3), incremental * 2)
        num_docs = largest_fitting(lambda n: self.count(self.make(0, n)[0]) + to_generate, budget, incremental, upper)
        return draw_samples(self.task, max_length, num_samples, FAMILY, self.count, self.make, num_docs, incremental,
                            "documents")
