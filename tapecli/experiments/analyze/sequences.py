"""The sequences `tape analyze` feeds a model: `--seq-len` tokens each, from text or from a synthetic task.

    source = DataSource(data, seq_len, samples, seed, text_field)
    source.check()                                   # one line on a bad --data / --seq-len, before any model opens
    sequences = source.sequences(opened)             # [Sequence], the same data and positions for every model
    length = training_length(opened)                 # the length the model was trained at (None: unknown)

A sequence is `ids` [T] (what the model reads), `targets` [T] (the token each input position predicts; -100 where
nothing is scored) and `scored` [T] bool (where accuracy is counted). Position t (0-based) predicts from t + 1 tokens
of context, so positions are reported as 1..T, the training length L meaning contexts 1..L.

--data is one of:
- a synthetic task (`selective-copy`, `grid-1d`, `grid-2d`, `tapecli.data.synthetic`): every model must come from a
  run trained on it; the run's training distribution (its recipe's IID split) stretched to --seq-len tokens. Grid
  navigation: the same grid and blank rate, a walk of --seq-len tokens (loss on every token, accuracy on revisited
  cells, as `tape eval synthetic` scores them). Selective copy: symbols and blanks in the training proportion,
  round(copy_tokens x T / L) symbols, the rest blanks (loss and accuracy on the copied symbols). Sequence i is
  seeded by (task, "analyze-T", --seed, i), like every synthetic split.
- a text source or `.bin` token file, read as `tape eval perplexity` reads it (`tapecli.eval.perplexity`: each
  model's own tokenizer, documents joined with its special tokens): the first --samples disjoint windows of T + 1
  tokens; window w gives ids w[:T] and targets w[1:], every position scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.store.door import OpenedModel

IGNORE = -100


@dataclass(frozen=True)
class Sequence:
    """One analysed sequence (module docstring): tensors of T entries."""

    ids: Any
    targets: Any
    scored: Any


def synthetic_kind(data: str) -> str | None:
    """The synthetic task `data` names (a path that exists is text), else None."""
    from tapecli.data.synthetic import TASKS

    return data if data in TASKS and not Path(data).expanduser().exists() else None


@dataclass(frozen=True)
class DataSource:
    """--data, --seq-len, --samples, --seed and --text-field of a `tape analyze` command."""

    data: str
    seq_len: int
    samples: int
    seed: int = 1234
    text_field: str = "text"

    def check(self, models: list[str]) -> None:
        """One line on a bad value or a model that cannot read this data, before any model is opened."""
        if self.seq_len < 2:
            raise TapeError(f"--seq-len must be at least 2, got {self.seq_len}")
        if self.samples < 1:
            raise TapeError(f"--samples must be a positive integer, got {self.samples}")
        kind = synthetic_kind(self.data)
        if kind is None:
            from tapecli.data.sources import check_source

            check_source(self.data, "--data")
            return
        from tapecli.eval.synthetic import synthetic_recipe

        for model in models:
            trained = synthetic_recipe(model).data.kind
            if trained != kind:
                raise TapeError(f"--model {model}: trained on {trained}, not on --data {kind}")

    def describe(self) -> dict[str, Any]:
        """The data part of settings.json."""
        kind = synthetic_kind(self.data)
        path = Path(self.data).expanduser()
        data = kind or (str(path.resolve()) if path.exists() else self.data)
        return {"data": data, "kind": "synthetic" if kind else "text", "seq_len": self.seq_len,
                "samples": self.samples, **({"seed": self.seed} if kind else {"text_field": self.text_field})}

    def sequences(self, opened: OpenedModel) -> list[Sequence]:
        kind = synthetic_kind(self.data)
        return self._synthetic(opened, kind) if kind else self._text(opened)

    def _text(self, opened: OpenedModel) -> list[Sequence]:
        import numpy as np
        import torch

        from tapecli.eval.perplexity import check_vocab, load_stream, make_windows

        T = self.seq_len
        tokens = load_stream(self.data, opened.tokenizer, self.text_field, max_tokens=self.samples * (T + 1))
        check_vocab(tokens, opened.model.config.vocab_size, self.data, opened.name)
        windows = make_windows(len(tokens), T + 1, "disjoint", T + 1)[: self.samples]
        if not windows:
            raise TapeError(f"{self.data} has {len(tokens)} tokens for {opened.name}: too few for one sequence of "
                            f"--seq-len {T} (T + 1 tokens)")
        out = []
        for w in windows:
            block = torch.from_numpy(np.asarray(tokens[w.start : w.end], dtype=np.int64))
            out.append(Sequence(block[:-1], block[1:], torch.ones(T, dtype=torch.bool)))
        return out

    def _synthetic(self, opened: OpenedModel, kind: str) -> list[Sequence]:
        import torch

        from tapecli.data.synthetic import SyntheticDataset
        from tapecli.eval.synthetic import synthetic_recipe

        spec = stretched(kind, synthetic_recipe(opened).data, self.seq_len)
        data = SyntheticDataset(kind, spec, self.seed, f"analyze-{self.seq_len}", self.samples, self.seq_len)
        out = []
        for i in range(self.samples):
            ids, labels = data[i]
            scored = torch.tensor(data.example(i).scored, dtype=torch.bool)
            out.append(Sequence(ids, labels, scored))
        return out


def stretched(kind: str, data: Any, seq_len: int) -> Any:
    """The training distribution of synthetic task `kind` (a recipe's `data` section) at `seq_len` tokens (module
    docstring)."""
    from tapecli.data.synthetic import CopySpec, GridSpec

    iid = data.iid_spec() if getattr(data, "kind", None) == kind and hasattr(data, "iid_spec") else None
    if isinstance(iid, GridSpec):
        return GridSpec(kind, seq_len, iid.width, iid.p_empty)
    if not isinstance(iid, CopySpec):
        raise TapeError(f"data.kind: {kind!r} is not stretched to other lengths (selective copy and grid navigation "
                        "are)")
    symbols = max(1, round(iid.n_tokens * seq_len / iid.length))
    if 2 * symbols + 1 > seq_len:
        raise TapeError(f"--seq-len {seq_len} is too short for {kind} (at least {2 * symbols + 1} tokens: the "
                        "symbols, the separator and their copy)")
    return CopySpec(symbols, seq_len - 2 * symbols - 1)


def training_length(opened: OpenedModel) -> int | None:
    """The sequence length the model was trained at: its run recipe's data.seq_len (a tape run), else the PE's
    original_max_len or the model's max_seq_len (a checkpoint without a run, a Hugging Face model)."""
    from tapecli.store.run import run_recipe

    recipe = run_recipe(Path(opened.source)) if opened.kind == "tape" and opened.source else None
    if recipe is not None:
        return int(recipe.data.seq_len)
    config = opened.model.config
    return int(config.pe_args.get("original_max_len") or config.max_seq_len)


class OverSequences:
    """The evaluation-protocol hooks an analysis shares: its units are its source's sequences (`self.source`, a
    DataSource), one result row per sequence, keyed by the sequence's index; `prepare` also notes the model's
    training length. Put it before `Evaluation` in the bases."""

    def prepare(self, opened: OpenedModel) -> None:
        self.sequences = self.source.sequences(opened)
        self.length = training_length(opened)

    def units(self, opened: OpenedModel) -> list[int]:
        return list(range(len(self.sequences)))

    def key(self, row: dict[str, Any]) -> int:
        return row["sequence"]
