"""Passkey retrieval as the official TAPE code runs it (LongLoRA's protocol), plus a depth x length sweep.

The prompt is five parts joined by newlines: a fixed instruction, a filler prefix, the key line
"The pass key is K. Remember it. K is the pass key.", a filler suffix and "What is the pass key? The pass key is".
The filler is the five-sentence grass/sky/sun string repeated 5000 times, joined by spaces; the prefix and the
suffix are both cut from its start, and together hold the budget's `n` characters. Budget i (i = 0, 1, ...) has
n = int(3.75 (i + 1) 1000 // 1024 * 1024) characters: 3072, 7168, 10240, ... Trial t of a budget seeds NumPy's legacy
RNG with t, then draws the prefix length randint(0, n) and the key randint(1, 50000), in that order (exclusive upper
bounds), so every model sees the same prompts. In a depth sweep the prefix is int(depth * n) characters instead
(the key is still trial t's).

The prompt's tokens are the prompt text's with the tokenizer's default special tokens, as the official
`tokenizer(prompt)` gives them (BOS first for Llama 2's tokenizer and tape's own, nothing for GPT-2's or SmolLM2's;
results.json records them under `special_tokens`, docs/special-tokens.md). The answer's tokens are what the
tokenizer makes of " " + key right after the prompt text (for Llama's tokenizer: "▁" and one id per digit, the
official "drop the BOS" answer). Exactly that many tokens are decoded greedily; a trial is correct iff they all
match. Accuracy per budget = correct / trials; the reported length is the mean prompt length in tokens.

`Passkey` is the protocol (`tapecli.eval.protocol`: a unit is a trial); the runner writes, to --out or
RUN/eval-passkey/<checkpoint>: settings.json, samples.jsonl (one row per trial: budget, trial, depth, key,
prompt_tokens, prediction, correct; the resume log), results.json, and passkey.png (accuracy vs prompt length, or the
depth x length heat-map of a sweep); several models are compared in one more passkey.png.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tapecli.errors import TapeError
from tapecli.eval.common import generate_batch
from tapecli.eval.protocol import Candidate, Evaluation, Opening, run
from tapecli.store.door import OpenedModel

INSTRUCTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there.")
FILLER_SENTENCES = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
FILLER = " ".join([FILLER_SENTENCES] * 5000)
QUESTION = "What is the pass key? The pass key is"
INTERVAL = 1000
PROTOCOL = ("passkey retrieval (LongLoRA / official TAPE eval_retrieval.py): budget i has int(3.75 (i+1) 1000 // 1024 "
            "* 1024) filler characters; trial t: numpy.random.seed(t), prefix = randint(0, n), key = randint(1, "
            "50000); prompt = instruction, filler[:prefix], key line, filler[:n - prefix], question (joined by "
            "newlines), with the tokenizer's default special tokens; answer = the tokens of ' ' + key after the "
            "prompt; greedy decoding of exactly that many tokens, correct iff all match; accuracy = correct / "
            "trials; length = mean prompt tokens. Depth sweep: prefix = int(depth * n), key as in trial t")
PLOT_FILE = "passkey.png"


def budget_chars(i: int) -> int:
    """Filler characters of budget i (i = 0, 1, ...): 3072, 7168, 10240, 14336, ..."""
    return int(3.75 * (i + 1) * INTERVAL // 1024 * 1024)


@dataclass(frozen=True)
class PasskeyPrompt:
    budget: int  # filler characters
    trial: int
    depth: int  # filler characters before the key line
    key: int
    text: str
    depth_fraction: float | None = None  # set in a depth sweep


def make_prompt(budget: int, trial: int, depth_fraction: float | None = None) -> PasskeyPrompt:
    """Trial `trial` of a budget, drawn exactly as the official code draws it (NumPy's legacy RNG seeded with the
    trial; `RandomState(t)` is the stream `numpy.random.seed(t)` starts, without touching the global state)."""
    if not 1 <= budget <= len(FILLER):
        raise TapeError(f"passkey budget {budget}: must be between 1 and {len(FILLER)} filler characters")
    rng = np.random.RandomState(trial)
    depth = int(rng.randint(0, budget))
    key = int(rng.randint(1, 50000))
    if depth_fraction is not None:
        depth = int(depth_fraction * budget)
    key_line = f"The pass key is {key}. Remember it. {key} is the pass key."
    text = "\n".join([INSTRUCTION, FILLER[:depth], key_line, FILLER[: budget - depth], QUESTION])
    return PasskeyPrompt(budget, trial, depth, key, text, depth_fraction)


def encode_prompt(tokenizer: Any, prompt: PasskeyPrompt) -> tuple[list[int], list[int]]:
    """(prompt ids with the tokenizer's default special tokens, answer ids: the tokens of " " + key after the
    prompt)."""
    before, after = tokenizer.default_specials
    body = tokenizer.encode(prompt.text)
    whole = tokenizer.encode(f"{prompt.text} {prompt.key}")
    # In context, as the answer would follow the prompt; a tokenizer that merges across the boundary gets the answer
    # tokenized on its own.
    answer = whole[len(body):] if whole[: len(body)] == body else tokenizer.encode(f" {prompt.key}")
    return [*before, *body, *after], answer


def plan_budgets(tokenizer: Any, budgets: list[int] | None, max_tokens: int, trials: int) -> list[int]:
    """The given budgets, or the protocol's budgets 0, 1, ... as long as every trial's prompt fits in max_tokens."""
    if budgets:
        return budgets
    chosen = []
    for i in range(len(FILLER) // 1024):
        n = budget_chars(i)
        if n > len(FILLER) or any(len(encode_prompt(tokenizer, make_prompt(n, t))[0]) > max_tokens
                                  for t in range(trials)):
            break
        chosen.append(n)
    if not chosen:
        raise TapeError(f"--max-tokens {max_tokens}: even the first budget ({budget_chars(0)} characters) does not "
                        "fit; raise it or pass --budgets")
    return chosen


@dataclass
class Passkey(Evaluation):
    """Passkey retrieval of one model (or several, compared), with `tape eval passkey`'s options."""

    name = "passkey"
    unit = "trials"
    plot_file = PLOT_FILE
    budgets: list[int] | None = None  # filler characters; None: the protocol's budgets that fit in max_tokens
    max_tokens: int = 8192
    trials: int = 20
    depths: list[float] | None = None  # a depth x length sweep
    chosen: list[int] = field(default_factory=list, init=False, repr=False)  # this model's budgets

    def check(self, models: list[str]) -> None:
        for name, value in (("--trials", self.trials), ("--max-tokens", self.max_tokens)):
            if value < 1:
                raise TapeError(f"{name} must be a positive integer, got {value}")
        if self.depths is not None and not all(0 <= d <= 1 for d in self.depths):
            raise TapeError(f"--depths: every depth must be a fraction in [0, 1], got {self.depths}")
        for budget in self.budgets or []:  # before the output directory exists
            if not 1 <= budget <= len(FILLER):
                raise TapeError(f"--budgets: {budget} must be between 1 and {len(FILLER)} filler characters")

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        """Prompts of up to --max-tokens fit (`tapecli.eval.budget`)."""
        from tapecli.eval.budget import check_prompt

        check_prompt(model.spec, model.config, opening, batch_size, self.max_tokens,
                     f"--max-tokens {self.max_tokens}")

    def prepare(self, opened: OpenedModel) -> None:
        self.chosen = plan_budgets(opened.tokenizer, self.budgets, self.max_tokens, self.trials)

    def settings(self, opened: OpenedModel) -> dict[str, Any]:
        return {"task": "passkey", "model": opened.record(), "budgets": self.chosen, "max_tokens": self.max_tokens,
                "trials": self.trials, "depths": self.depths}

    def units(self, opened: OpenedModel) -> list[tuple[int, float | None, int]]:
        depths = self.depths if self.depths is not None else [None]
        return [(n, d, t) for n in self.chosen for d in depths for t in range(self.trials)]

    def key(self, row: dict[str, Any]) -> tuple[int, float | None, int]:
        return row["budget"], row["depth_fraction"], row["trial"]

    def evaluate(self, opened: OpenedModel, units: list[tuple[int, float | None, int]]) -> list[dict[str, Any]]:
        return _answer(opened.model, opened.tokenizer, [make_prompt(n, t, d) for n, d, t in units], len(units))

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "passkey", "protocol": PROTOCOL, "settings": settings,
                "special_tokens": opened.tokenizer.describe_specials(*opened.tokenizer.default_specials),
                **summarise(rows, settings["budgets"], self.depths)}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        _plot(results, label, path)

    def compare(self, results: dict[str, dict[str, Any]], folder: Path) -> None:
        if self.depths is None:  # a sweep has one heat-map per model, in its own folder
            _plot_lines(results, folder / PLOT_FILE)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        return "\n".join(("" if len(results) == 1 else f"{label}: ")
                         + f"{entry['budget']} filler characters (~{entry['mean_prompt_tokens']:.0f} tokens): "
                         f"accuracy {entry['accuracy']:.0%}" for label, r in results.items() for entry in r["budgets"])


def evaluate_passkey(
    model: str,
    out_dir: str | Path,
    budgets: list[int] | None = None,
    max_tokens: int = 8192,
    trials: int = 20,
    depths: list[float] | None = None,
    dtype: str = "auto",
    device: str = "auto",
    pe_args: dict[str, Any] | None = None,
    batch_size: int = 1,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run (or resume) passkey retrieval for one model into `out_dir`; returns what results.json holds."""
    report = run(Passkey(budgets, max_tokens, trials, depths), [model], out_dir, dtype=dtype, device=device,
                 pe_args=pe_args, batch_size=batch_size, show_progress=show_progress)
    return next(iter(report.results.values()))


def _answer(model: Any, tokenizer: Any, prompts: list[PasskeyPrompt], batch_size: int) -> list[dict[str, Any]]:
    """Greedy answers to a chunk of prompts, scored; one samples.jsonl row per prompt."""
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    longest = max(len(answer) for _, answer in encoded)
    # Greedy decoding is deterministic, so decoding `longest` tokens and keeping each answer's length is the same
    # as decoding exactly that many.
    outputs = generate_batch(model, [ids for ids, _ in encoded], max_new_tokens=longest, batch_size=batch_size)
    rows = []
    for prompt, (ids, answer), output in zip(prompts, encoded, outputs, strict=True):
        generated = output[: len(answer)]
        rows.append({"budget": prompt.budget, "trial": prompt.trial, "depth": prompt.depth,
                     "depth_fraction": prompt.depth_fraction, "key": prompt.key, "prompt_tokens": len(ids),
                     "answer": answer, "generated": generated, "prediction": tokenizer.decode(generated),
                     "correct": generated == answer})
    return rows


def summarise(rows: list[dict[str, Any]], budgets: list[int], depths: list[float] | None) -> dict[str, Any]:
    """Accuracy and mean prompt length per budget (and per budget x depth in a sweep), and overall."""

    def cell(selected: list[dict[str, Any]]) -> dict[str, Any]:
        return {"accuracy": sum(r["correct"] for r in selected) / len(selected),
                "mean_prompt_tokens": sum(r["prompt_tokens"] for r in selected) / len(selected),
                "trials": len(selected)}

    per_budget = [{"budget": n, **cell([r for r in rows if r["budget"] == n])} for n in budgets]
    summary: dict[str, Any] = {"accuracy": sum(r["correct"] for r in rows) / len(rows), "budgets": per_budget}
    if depths is not None:
        summary["grid"] = [{"budget": n, "depth_fraction": d,
                            **cell([r for r in rows if r["budget"] == n and r["depth_fraction"] == d])}
                           for d in depths for n in budgets]
    return summary


def _plot(results: dict[str, Any], name: str, path: Path) -> None:
    from tapecli.eval.plots import save_grid_heatmap

    budgets = results["budgets"]
    depths = results["settings"]["depths"]
    if depths is None:
        _plot_lines({name: results}, path)
        return
    grid = [[c["accuracy"] for c in results["grid"] if c["depth_fraction"] == d] for d in depths]
    save_grid_heatmap(grid, path, x_labels=[f"{b['budget']}\n~{b['mean_prompt_tokens']:.0f}" for b in budgets],
                      y_labels=[f"{d:.0%}" for d in depths],
                      xlabel="filler budget (characters) / mean prompt length (tokens)",
                      ylabel="key depth (share of filler before it)", title=f"passkey retrieval: {name}")


def _plot_lines(results: dict[str, dict[str, Any]], path: Path) -> None:
    """Accuracy vs mean prompt length, one line per model ({label: results})."""
    from tapecli.eval.plots import save_line_plot

    series = {name: [(b["mean_prompt_tokens"], b["accuracy"]) for b in r["budgets"]] for name, r in results.items()}
    save_line_plot(series, path, xlabel="prompt length (tokens, mean)", ylabel="passkey accuracy",
                   title="passkey retrieval", ylim=(-0.03, 1.03))
