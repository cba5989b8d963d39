"""HELMET's many-shot in-context learning category (princeton-nlp/HELMET data.py's `load_icl`, configs/icl*.yaml,
scripts/generate_configs.py): TREC coarse and fine, NLU, BANKING77 and CLINC150, labels mapped to random integers.

Data: the Hugging Face datasets load_icl reads (CogComp/trec, PolyAI/banking77, clinc_oos "plus",
xingkunliuxtracta/nlu_evaluation_data), from the hub or a local copy (`tapecli.data.helmet_hf`). Per task and input
length the number of demonstrations is generate_configs.py's (`SHOTS`: the `..._{N}shot_balance` names, 4K to 128K).

`rows(data, task, length, samples, shuffle)` is load_icl as published: the test split (NLU: the train split's
`train_test_split(test_size=0.1, seed=42)`), when longer than `samples` (max_test_samples: 500 in the configs)
shuffled with datasets' shuffle(seed=42) and cut to `samples` rows with balanced labels (`balance_labels`); for each
test text, the local seed (sha256(text) + 42) % 2**31 draws `shots` training rows with balanced labels and the label
mapping (`random.seed(local_seed)`; `random.shuffle(list(range(num_labels)))`); the context is the demonstrations as
"{text}\\nlabel: {mapped label}" a blank line apart, the answer the test row's mapped label. Each row:
{"context", "question", "answer"}, filled into `TEMPLATE` (user template + "\\n" + "label:"; no chat template).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

from tapecli.errors import TapeError

SEED = 42
TEMPLATE = ("Use the provided mapping from the text to label to assign a label to the text. Only output \"label: "
            "{{label}}\" and nothing else. \n\n{context}\n\n{question}\nlabel:")
_ITEM = "{text}\nlabel: {label}"
LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class Source:
    """Where one ICL task's rows come from and how load_icl reads them."""

    hub_id: str
    config: str | None
    folder: str  # the local copy's folder under --data
    label_field: str
    num_labels: int
    test_split: str | None  # None: NLU's 10% split of the train split
    shots: tuple[int, ...]  # demonstrations at 4K ... 128K (generate_configs.py)


SOURCES = {
    "icl_trec_coarse": Source("CogComp/trec", None, "trec", "coarse_label", 6, "test",
                              (200, 400, 800, 1600, 3300, 6600)),
    "icl_trec_fine": Source("CogComp/trec", None, "trec", "fine_label", 50, "test",
                            (200, 400, 800, 1600, 3200, 6400)),
    "icl_banking77": Source("PolyAI/banking77", None, "banking77", "label", 77, "test",
                            (180, 360, 720, 1450, 2900, 5900)),
    "icl_clinic150": Source("clinc_oos", "plus", "clinc_oos", "intent", 151, "validation",
                            (220, 440, 880, 1750, 3525, 7050)),
    "icl_nlu": Source("xingkunliuxtracta/nlu_evaluation_data", None, "nlu_evaluation_data", "label", 68, None,
                      (250, 510, 1020, 2040, 4080, 8296)),
}


def shots(task: str, length: int) -> int:
    """The demonstrations HELMET gives `task` at `length` tokens; one line for a length it has none for."""
    if length not in LENGTHS:
        raise TapeError(f"--lengths: {task} has demonstration counts for {', '.join(map(str, LENGTHS))} tokens only "
                        f"(HELMET's 4K-128K), got {length}")
    return SOURCES[task].shots[LENGTHS.index(length)]


def balance_labels(data: list[dict[str, Any]], shots: int, seed: int, label: str = "label") -> list[dict[str, Any]]:
    """load_icl's balance_labels: `shots` rows, label by label in rounds (labels in order of first appearance), each
    round in random order."""
    rand = random.Random(seed)
    groups: dict[Any, list[dict[str, Any]]] = {}
    for x in data:
        groups.setdefault(x[label], []).append(x)
    return _balanced(groups, shots, rand)


def _balanced(groups: dict[Any, list[Any]], shots: int, rand: random.Random) -> list[Any]:
    rounds = math.ceil(shots / len(groups))
    new: list[list[Any]] = [[] for _ in range(rounds)]
    for samples in groups.values():
        indices = rand.sample(range(len(samples)), rounds % len(samples))
        while len(indices) < rounds:  # with replacement, as published, when a label has too few rows
            indices += rand.sample(range(len(samples)), min(rounds - len(indices), len(samples)))
        for i, idx in enumerate(indices):
            new[i].append(samples[idx])
    for group in new:
        rand.shuffle(group)
    return [item for group in new for item in group][:shots]


def splits(data: str | None, task: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """(train rows, test rows, "hub id or folder: sizes") as {"text", "label"} dicts in the dataset's order."""
    from tapecli.data import helmet_hf

    source = SOURCES[task]
    where = source.hub_id if data is None else f"--data {data}: {source.folder}/"
    whole = helmet_hf.dataset(data, source.hub_id, source.folder, source.config)
    train = helmet_hf.split(whole, "train", where)
    if source.test_split is None:
        parts = train.train_test_split(test_size=0.1, seed=SEED)
        train, test = parts["train"], parts["test"]
    else:
        test = helmet_hf.split(whole, source.test_split, where)
    for part in (train, test):
        missing = [f for f in ("text", source.label_field) if f not in part.column_names]
        if missing:
            raise TapeError(f"{where}: the rows lack the field {missing[0]!r} (load_icl reads 'text' and "
                            f"{source.label_field!r})")
    listed = [[{"text": t, "label": int(y)} for t, y in zip(p["text"], p[source.label_field], strict=True)]
              for p in (train, test)]
    if not listed[0] or not listed[1]:
        raise TapeError(f"{where}: an empty split")
    return listed[0], listed[1], f"{where} train {len(listed[0])} rows, test {len(listed[1])} rows"


def rows(train: list[dict[str, Any]], test: list[dict[str, Any]], task: str, length: int, samples: int,
         shuffle: Any) -> list[dict[str, Any]]:
    """load_icl's test rows with their demonstrations and mapped labels (see the module docstring); `shuffle(size,
    seed)` is datasets' shuffle, as indices."""
    source = SOURCES[task]
    shot = shots(task, length)
    if len(test) > samples:
        test = balance_labels([test[i] for i in shuffle(len(test), SEED)], samples, SEED)
    groups: dict[int, list[dict[str, Any]]] = {}
    for x in train:
        groups.setdefault(x["label"], []).append(x)
    out = []
    for sample in test:
        local_seed = (int(hashlib.sha256(sample["text"].encode("utf-8")).hexdigest(), 16) + SEED) % 2**31
        demos = _balanced(groups, shot, random.Random(local_seed))
        mapping = list(range(source.num_labels))
        random.Random(local_seed).shuffle(mapping)
        for x in (sample, *demos):
            if not 0 <= x["label"] < source.num_labels:
                raise TapeError(f"{task}: label {x['label']} is outside 0..{source.num_labels - 1} "
                                f"({source.label_field} of {source.hub_id})")
        context = "\n\n".join(_ITEM.format(text=d["text"], label=str(mapping[d["label"]])) for d in demos)
        out.append({"context": context, "question": sample["text"], "answer": str(mapping[sample["label"]])})
    return out
