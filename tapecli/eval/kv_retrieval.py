"""Lost in the middle's key-value retrieval (Liu et al. 2023): accuracy by the gold pair's position and by the number
of pairs; the U-curve.

Per model, number of pairs k and gold position, `--samples` examples of `tapecli.data.kv_retrieval` (seeded, so every
model sees the same; an example's pairs are the same at every position). The model reads its tokenizer's default
special tokens + the official prompt and decodes greedily up to 100 tokens (the official default), stopping at EOS;
an answer is right when it holds the gold value, ignoring case (`evaluate_kv_responses.py`). Accuracy per (k,
position) is the percentage right; per k, the mean over its positions.

results.json, per model: `accuracy[k][position]` (positions 0-based), `by_keys[k]`, `mean_prompt_tokens[k]`, and from
`tapecli.eval.long_context` over k as the length: the effective number of pairs (RULER's 85.6 threshold on `by_keys`;
NoLiMa's 85 % of the smallest k's accuracy) and LongScore, each also in tokens (the mean prompt tokens at that k).
`KvRetrieval` is the protocol (a unit is one example at one position, (k, position, index); the models share one
folder); the runner writes settings.json, samples.jsonl, results.json, kv-retrieval.png (accuracy vs k, one line per
model), u-curve-<k>.png (accuracy vs gold position, one line per model: the U-curve) and heatmap*.png (k x position per
model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.long_context import THRESHOLD, headline, length_summary, mean_percent
from tapecli.eval.long_context import table as score_table
from tapecli.eval.protocol import Candidate, Evaluation, Opening, source_of
from tapecli.store.door import OpenedModel

PLOT_FILE = "kv-retrieval.png"
PROTOCOL = ("lost in the middle key-value retrieval (nelson-liu/lost-in-the-middle): k random UUID4 pairs in a JSON "
            "object, the gold pair moved to each gold position, the official kv_retrieval.prompt; default special "
            "tokens + prompt; greedy decoding of up to 100 tokens, stopping at EOS; right when the gold value occurs "
            "in the answer (case-insensitive); accuracy per (k, position) and per k (mean over positions)")

Unit = tuple[int, int, int]  # (pairs, gold position, example index)


@dataclass
class KvRetrieval(Evaluation):
    """Key-value retrieval on one model or several, with `tape eval kv-retrieval`'s options."""

    name = "kv-retrieval"
    unit = "prompts"
    plot_file = PLOT_FILE
    files = ("u-curve-*.png", "heatmap*.png")
    together = True
    keys: list[int] = field(default_factory=lambda: [75, 140, 300])
    positions: int | None = None  # gold positions per k; None: the paper's (4, 5, 7 for 75, 140, 300), else 5
    samples: int = 100
    seed: int = 0
    threshold: float = THRESHOLD
    gold: dict[int, list[int]] = field(default_factory=dict, init=False, repr=False)

    def check(self, models: list[str]) -> None:
        from tapecli.data.kv_retrieval import PAPER_POSITIONS, gold_positions

        self.keys = sorted(set(self.keys))
        if not self.keys:
            raise TapeError("--keys: pass at least one number of pairs, e.g. 75,140,300")
        if self.samples < 1:
            raise TapeError(f"--samples must be a positive integer, got {self.samples}")
        self.gold = {k: gold_positions(k, PAPER_POSITIONS.get(k, min(5, k)) if self.positions is None
                                       else self.positions) for k in self.keys}  # --positions 0 is refused there

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        """The longest prompt (the most pairs, estimated with the model's tokenizer) fits (`tapecli.eval.budget`)."""
        from tapecli.data import kv_retrieval as kv
        from tapecli.eval.budget import check_prompt

        tokenizer = model.tokenizer()
        tokens = kv.prompt_tokens(lambda text: tokenizer.encode(text, add_special_tokens=True), self.keys[-1],
                                  self.seed)
        check_prompt(model.spec, model.config, opening, batch_size, tokens + kv.MAX_NEW_TOKENS,
                     f"--keys {self.keys[-1]}")

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "kv-retrieval", "models": [source_of(m)[1] for m in models], "keys": self.keys,
                "positions": {str(k): v for k, v in self.gold.items()}, "samples": self.samples, "seed": self.seed,
                "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def units(self, opened: OpenedModel) -> list[Unit]:
        return [(k, p, i) for k in self.keys for p in self.gold[k] for i in range(self.samples)]

    def key(self, row: dict[str, Any]) -> Unit:
        return row["keys"], row["position"], row["index"]

    cell_fields = 1  # batches: `batch_size` prompts of one k at a time (prompts of one k have about one length)

    def evaluate(self, opened: OpenedModel, units: list[Unit]) -> list[dict[str, Any]]:
        from tapecli.data import kv_retrieval as kv
        from tapecli.eval.common import generate_texts

        examples = [kv.example(k, i, self.seed) for k, _, i in units]
        prompts = [kv.prompt(kv.at_position(ex, p), ex.key) for ex, (_, p, _) in zip(examples, units, strict=True)]
        answers = generate_texts(opened, prompts, len(units), kv.MAX_NEW_TOKENS)
        tokenizer = opened.tokenizer
        return [{"keys": k, "position": p, "index": i,
                 "prompt_tokens": len(tokenizer.encode(text, add_special_tokens=True)), "key": ex.key,
                 "value": ex.value, "prediction": pred, "score": float(kv.correct(ex.value, pred))}
                for (k, p, i), ex, text, pred in zip(units, examples, prompts, answers, strict=True)]

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        accuracy = {str(k): {str(p): mean_percent([r["score"] for r in rows if r["keys"] == k and r["position"] == p])
                             for p in self.gold[k]} for k in self.keys}
        by_keys = {k: round(sum(accuracy[str(k)].values()) / len(accuracy[str(k)]), 2) for k in self.keys}
        tokens = {str(k): round(sum(r["prompt_tokens"] for r in rows if r["keys"] == k)
                                / sum(r["keys"] == k for r in rows), 1) for k in self.keys}
        summary = length_summary(by_keys, self.threshold, [self.keys[0]])
        in_tokens = {f"{name}_tokens": tokens[str(summary[name])] if summary[name] is not None else None
                     for name in ("effective_length", "effective_length_nolima")}
        return {**opened.record(), "accuracy": accuracy, "by_keys": {str(k): v for k, v in by_keys.items()},
                **summary, **in_tokens, "mean_prompt_tokens": tokens}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "kv-retrieval", "protocol": PROTOCOL, "threshold": self.threshold, "settings": settings,
                "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        plot(results, path.parent)

    def summary(self, results: dict[str, dict[str, Any]]) -> str:
        lines = []
        for folder in results.values():
            for m in folder["models"]:
                positions = sorted({int(p) for cells in m["accuracy"].values() for p in cells})
                lines += ["", headline(m["name"], m, " pairs"),
                          score_table({f"{k} pairs": cells for k, cells in m["accuracy"].items()}, positions,
                                      first="gold position", labels=[str(p + 1) for p in positions])]
        return "\n".join(lines)


def plot(results: dict[str, Any], out: Path) -> None:
    from tapecli.eval.long_context import plot_grid, plot_lines, safe_name

    models, keys = results["models"], results["settings"]["keys"]
    plot_lines({m["name"]: [(k, m["by_keys"][str(k)]) for k in keys] for m in models}, out / PLOT_FILE,
               xlabel="pairs in the JSON object", ylabel="accuracy (%)",
               title=f"key-value retrieval; dashed: threshold {results['threshold']}", threshold=results["threshold"])
    for k in keys:
        positions = results["settings"]["positions"][str(k)]
        plot_lines({m["name"]: [(p + 1, m["accuracy"][str(k)][str(p)]) for p in positions] for m in models},
                   out / f"u-curve-{k}.png", xlabel="position of the gold pair (1 = first)", ylabel="accuracy (%)",
                   title=f"key-value retrieval, {k} pairs: accuracy by gold position", log_x=False)
    for n, m in enumerate(models):
        positions = sorted({int(p) for cells in m["accuracy"].values() for p in cells})
        plot_grid({f"{k} pairs": m["accuracy"][str(k)] for k in keys}, positions,
                  out / ("heatmap.png" if len(models) == 1 else f"heatmap-{n}-{safe_name(m['name'])}.png"),
                  xlabel="gold position (0-based)", ylabel="pairs", title=f"key-value retrieval: {m['name']}")

