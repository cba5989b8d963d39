"""NoLiMa (Modarressi et al. 2025, arXiv 2502.05167; adobe-research/NoLiMa): its needle sets and haystacks, the tests
they expand to, and the needle placed in a haystack, as the official `run_tests.py` and `book_haystack.py` do.

Files (the hub dataset `amodaresi/NoLiMa`, fetched by the official `download_NoLiMa_data.sh`):
`needlesets/needle_set.json` (and its variants: `_hard`, `_w_CoT`, `_w_Distractor`, `_MC`, `_ONLYDirect`) and
`haystack/rand_shuffle/rand_book_{1..5}.txt`. `needle_set(path)` and `haystacks(path)` read a local file or folder, or
download them from the hub for users with a network; offline, one line says what to pass instead.

A needle set is a list of experiments: `id` (its first four characters, a number, seed the test), `system_prompt`,
`needle` (with `{1}`, `{2}`, ... and `{CHAR}`), `questions` ({question type: question}, e.g. onehop and twohop),
`tests` ({test id: {"input_args": [...], "gold_answers"?: [...]}}), and optionally `character_set`,
`task_template` and `distractors` ({question type: distractor}). `expand` turns it into tests exactly as
`run_tests.py`: one per (experiment, question type, test), seed = base seed + int(id[:4]); the needle has every
placeholder replaced, but the question only the last placeholder it holds (the official loop replaces each one in
the original question, keeping the last replacement), as does the distractor.

`Haystack` is `BookHaystack` over a model's own tokenizer (encode without special tokens, decode): the needle goes
after the first line break at or beyond `depth` x (length + 1) tokens from the book's start, the context is the
`length` tokens around it, the text before the needle cut back to its last line break; with a distractor, it is
placed first at a depth drawn as the official code draws it, and then moved into the needle's context at the same
text. `draws(test, rng, depths)` replays the random draws of one (test, haystack) series (the character per depth,
and the distractor's depth), so any single trial can be rebuilt, as after a resume.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.faults import reading

HUB_ID = "amodaresi/NoLiMa"
NEEDLE_SET = "needlesets/needle_set.json"
BOOKS = tuple(f"haystack/rand_shuffle/rand_book_{i}.txt" for i in range(1, 6))
HINT = ("download needlesets/needle_set.json and haystack/rand_shuffle/rand_book_1.txt ... rand_book_5.txt from "
        "https://huggingface.co/datasets/amodaresi/NoLiMa and pass them as --needle-set and --haystack (a folder or "
        "one book)")
DEFAULT_TASK_TEMPLATE = (
    "You will answer a question based on the following book snippet:\n\n{haystack}\n\nUse the information provided "
    "in the book snippet to answer the question. Your answer should be short and based on either explicitly stated "
    "facts or strong, logical inferences.\n\nQuestion: {question}\n\n Return only the final answer with no "
    "additional explanation or reasoning.")
LENGTHS = (250, 500, 1000, 2000, 4000, 8000, 16000, 32000)  # the official run configs' context_length
BASE_LENGTHS = (250, 500, 1000)  # the paper's base score: the mean at these
DEPTH_INTERVALS = 26  # document_depth_percent_intervals: np.linspace(0, 100, 26)
BASE_SEED = 42
MAX_TOKENS = 192  # the model configs' max_tokens
METRICS = ("contains", "EM", "lastline_EM", "lastline_contains")


@dataclass(frozen=True)
class Test:
    name: str  # id_testid_questiontype
    question_type: str
    system_prompt: str
    task_template: str
    gold_answers: Any  # a list, or "" when the needle names a {CHAR}
    seed: int
    character_set: Any  # a list, or ""
    needle: str
    question: str
    distractor: str | None


def _fetch(filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    from tapecli.data.sources import hub_unreachable

    try:
        return Path(hf_hub_download(HUB_ID, filename, repo_type="dataset"))
    except Exception as e:  # noqa: BLE001 - offline, unreachable or missing: one line
        if hub_unreachable(e):
            raise TapeError(f"{HUB_ID} cannot be read from the Hugging Face hub (offline or unreachable); "
                            f"{HINT}") from None
        text = f"{type(e).__name__}: {e}"
        raise TapeError(f"{HUB_ID}/{filename} could not be downloaded: {text.splitlines()[0]}") from None


def needle_set(path: str | None) -> tuple[list[dict[str, Any]], str]:
    """(the experiments, "name sha256:...") of a needle set file (None: the hub's needle_set.json)."""
    file = _fetch(NEEDLE_SET) if path is None else Path(path).expanduser()
    if not file.is_file():
        raise TapeError(f"--needle-set {path}: no such file; {HINT}")
    with reading(file):
        raw = file.read_bytes()
    try:
        experiments = json.loads(raw)
    except json.JSONDecodeError as e:
        raise TapeError(f"--needle-set {file}: not JSON ({e.msg} at line {e.lineno})") from None
    keys = ("id", "needle", "questions", "tests")
    if not isinstance(experiments, list) or not experiments or not all(
            isinstance(x, dict) and all(k in x for k in keys) for x in experiments):
        raise TapeError(f"--needle-set {file}: expected a list of experiments, each with {', '.join(keys)}")
    return experiments, f"{file.name} sha256:{hashlib.sha256(raw).hexdigest()}"


def haystacks(path: str | None) -> list[tuple[str, str, str]]:
    """[(name, text, "name sha256:...")] of the haystack books: a .txt file, every .txt file in a folder (in name
    order), or (None) the hub's five shuffled books."""
    if path is None:
        files = [_fetch(name) for name in BOOKS]
    else:
        root = Path(path).expanduser()
        files = [root] if root.is_file() else sorted(root.glob("*.txt")) if root.is_dir() else []
        if not files:
            raise TapeError(f"--haystack {path}: no .txt book there; {HINT}")
    out = []
    for file in files:
        with reading(file):
            text = file.read_text(encoding="utf-8")
        out.append((file.stem, text, f"{file.name} sha256:{hashlib.sha256(text.encode()).hexdigest()}"))
    return out


def expand(experiments: list[dict[str, Any]], base_seed: int = BASE_SEED) -> list[Test]:
    """run_tests.py's tests of a needle set, in its order."""
    tests = []
    for exp in experiments:
        try:
            seed = base_seed + int(str(exp["id"])[:4])
        except ValueError:
            raise TapeError(f"needle set experiment {exp['id']!r}: its id must start with 4 digits") from None
        for question_type, question in exp["questions"].items():
            for test_id, test in exp["tests"].items():
                needle, full_question, distractor = "" + exp["needle"], question, None
                for arg_no, arg in enumerate(test["input_args"]):
                    placeholder = "{" + str(arg_no + 1) + "}"
                    if placeholder in question:
                        full_question = question.replace(placeholder, arg)  # as published: from `question`
                    if placeholder in needle:
                        needle = needle.replace(placeholder, arg)
                    if "distractors" in exp and placeholder in exp["distractors"][question_type]:
                        distractor = exp["distractors"][question_type].replace(placeholder, arg)
                tests.append(Test(name=f"{exp['id']}_{test_id}_{question_type}", question_type=question_type,
                                  system_prompt=exp.get("system_prompt", ""),
                                  task_template=exp.get("task_template", DEFAULT_TASK_TEMPLATE),
                                  gold_answers=test.get("gold_answers", ""), seed=seed,
                                  character_set=exp.get("character_set", ""), needle=needle,
                                  question=full_question, distractor=distractor))
    return tests


def depths(intervals: int) -> list[float]:
    """np.linspace(0, 100, intervals) / 100: the needle depths of a series."""
    import numpy as np

    return [float(d) / 100 for d in np.linspace(0, 100, intervals)]


def draws(test: Test, seed: int, depth_list: list[float], length: int) -> list[tuple[str | None, float | None]]:
    """(character, distractor depth) per depth of one series, drawn as async_evaluate.py draws them from
    np.random.seed(seed): a character per depth (when the needle names {CHAR}), then the distractor's depth."""
    import numpy as np

    rng = np.random.RandomState(seed)
    out = []
    for depth in depth_list:
        character = None
        if "{CHAR}" in test.needle:
            if not isinstance(test.character_set, list):
                raise TapeError(f"NoLiMa test {test.name}: its needle names {{CHAR}} but it has no character_set")
            character = str(rng.choice(test.character_set))
        out.append((character, _distractor_depth(rng, depth, length) if test.distractor is not None else None))
    return out


def _distractor_depth(rng: Any, depth: float, length: int, free_zone: float = 0.2) -> float:
    left = max(0, depth - 2 * free_zone)
    right = max(0, 1 - (depth + 2 * free_zone))
    drawn = rng.uniform(0, left + right)
    drawn = depth + free_zone + (drawn - left) if drawn > left else drawn + free_zone
    if length < 500:
        drawn = 0.7 if depth < 0.6 else 0.6 if depth > 0.75 else 0.5
    return float(drawn)


class Haystack:
    """BookHaystack over one tokenizer: the book's tokens and the positions right after its line breaks."""

    def __init__(self, name: str, text: str, tokenizer: Any) -> None:
        self.name, self.tokenizer = name, tokenizer
        self.ids = tokenizer.encode(text)
        self.breaks = [0] + [i for i, t in enumerate(self.ids) if "\n" in tokenizer.decode([t])]

    def place(self, needle: str, length: int, depth: float, test: str = "") -> str:
        """The `length`-token context holding `needle` at `depth` (book_haystack's _generate_w_needle_placement,
        shift 0, no static depth)."""
        decode = self.tokenizer.decode
        candidates = [p for p in self.breaks if p / (length + 1) - depth >= 0]
        if not candidates:
            raise TapeError(f"NoLiMa {self.name}: the book is too short for {length} tokens at depth {depth:g}")
        at = min(candidates)  # the smallest non-negative delta: the first line break at or after the depth
        start = at - int(round(length * depth))
        end = start + length
        if start < 0 or end > len(self.ids):
            raise TapeError(f"NoLiMa {self.name}: the book ({len(self.ids)} tokens) is too short for {length} tokens "
                            f"at depth {depth:g}{f' ({test})' if test else ''}")
        pre = decode(self.ids[start : at + 1])
        pre = pre[: max(pre.rfind("\n"), 0)]
        return pre + " " + needle + "\n" + decode(self.ids[at + 1 : end])

    def place_with_distractor(self, needle: str, distractor: str, length: int, depth: float, distractor_depth: float,
                              test: str = "") -> str:
        """book_haystack's generate_w_needle_placement with a distractor (free zone 0.2)."""
        with_distractor = self.place(distractor, length, distractor_depth, test)
        where = with_distractor.index(distractor)
        span = (max(where - 50, 0), where - 1) if length >= 500 else (max(where - 25, 0), where - 1)
        text = self.place(needle, length, depth, test)
        anchor = with_distractor[span[0] : span[1]]
        if text.count(anchor) != 1:
            raise TapeError(f"NoLiMa {test}: the text before the distractor occurs {text.count(anchor)} times in the "
                            f"needle's context from {self.name} (the official code stops here too); pass longer "
                            "--lengths or drop that test or book")
        at = text.index(anchor) + (49 if length >= 500 else 23)
        return text[:at] + " " + distractor + "\n" + text[at:]


def score(metric: str, response: str, gold_answers: Any) -> int:
    """async_evaluate.py's _evaluate_response."""
    if metric == "EM":
        return int(response.strip() in gold_answers)
    if metric == "contains":
        return int(any([gold in response for gold in gold_answers]))
    if metric == "lastline_EM":
        return int(response.strip().split("\n")[-1] in gold_answers)
    if metric == "lastline_contains":
        return int(any([gold in response.strip().split("\n")[-1] for gold in gold_answers]))
    raise TapeError(f"--metric: one of {', '.join(METRICS)}, got {metric!r}")
