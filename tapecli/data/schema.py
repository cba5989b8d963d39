"""What a data kind owns: the keys of a recipe's `data:` section, the keys of its `eval:` section, their checks, and
how its datasets are built. `tapecli.data.build.KINDS` lists the kinds; `tapecli.recipe` reads the sections.

A kind is a dataclass deriving from `DataSchema`: its fields are its `data:` keys, `kind` first, each with a default
and a one-line comment; `Eval` is the dataclass of its `eval:` keys (None: the kind has none). The recipe
type-checks values against the field annotations, then calls `check()`, which raises a TapeError naming the key. A
kind that brings its own tokenizer (addition, the synthetic tasks) has no `tokenizer` field but a `tokenizer`
property, so `recipe.data.tokenizer` reads the same for every kind. `check_files()` (training calls it before any
model is built) and `open_tokenizer()` turn a missing file named by `data.source` or `data.tokenizer` into one line
naming the key and how to fix it.

Plain Python: nothing here imports torch (the datasets do, when `build` is called).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, ClassVar

from tapecli.data.tokenizer import CHAR_TOKENIZERS
from tapecli.errors import TapeError, how_to_set


class DataSchema:
    """Base of every kind's `data:` schema (a dataclass; see the module docstring)."""

    Eval: ClassVar[type | None] = None  # the kind's `eval:` schema; None when the kind has no eval keys
    # How a trained run of this kind is judged (`tape sweep`): "validation" (exp of the logged validation loss),
    # "synthetic" (`tape eval synthetic`; "synthetic-grid" adds the grid's object accuracy), "addition"
    # (`tape eval addition`) or "babilong" (`tape eval babilong`).
    evaluation: ClassVar[str] = "validation"

    kind: str
    seq_len: int

    def check(self) -> None:
        """Raise TapeError naming the first key with a bad value (types are already checked)."""
        positive("data.seq_len", self.seq_len)

    def ignored_keys(self) -> dict[str, str]:
        """{`data.` key: why} of the keys this kind's other keys make meaningless (none by default)."""
        return {}

    def build(self, tokenizer: Any, seed: int, cache_dir: Path) -> tuple[Any, Any | None]:
        """(train, validation or None) datasets: `ds[i] -> (input_ids, labels)`, LongTensors of `seq_len`."""
        raise NotImplementedError

    def check_files(self) -> None:
        """Fail in one line naming the key if a local file the data keys name is missing (nothing by default)."""
        return None

    def no_validation(self) -> str | None:
        """Why `build` will give no validation split, in words naming the key and the fix; None when it gives one
        (the default: a kind whose validation set is generated). Told at a training's start; `tape sweep` refuses a
        sweep judged by the validation loss for it before training anything."""
        return None

    def open_tokenizer(self, vocab_size: int | None = None) -> Any:
        """The tokenizer `data.tokenizer` names, loaded. A file that is not there is one line naming data.tokenizer
        with the `tape tokenizer train` command that makes one from data.source (`vocab_size`: the recipe's
        model.vocab_size, else 32000), or the Llama-2 tokenizer to pass instead."""
        from tapecli.data.tokenizer import load_tokenizer
        from tapecli.faults import reading

        spec = self.tokenizer
        if spec != "byte" and spec not in CHAR_TOKENIZERS and not Path(spec).expanduser().exists():
            raise TapeError(missing_tokenizer(spec, getattr(self, "source", None), vocab_size))
        with reading(spec):
            return load_tokenizer(spec)


def missing_tokenizer(spec: str, source: str | None, vocab_size: int | None) -> str:
    """The one line for a data.tokenizer file that does not exist: the command that trains one on `source`."""
    out = spec if spec.endswith(".model") else "tokenizer.model"
    command = shlex.join(["tape", "tokenizer", "train", "--data", source or "CORPUS", "--vocab-size",
                          str(vocab_size or 32000), "--out", out])
    then = "" if out == spec else f" and pass data.tokenizer={out}"
    return (f"data.tokenizer: {spec} does not exist; make one from your corpus with `{command}`{then}, "
            f"or {how_to_set('data.tokenizer', 'DIR/tokenizer.model')} with the Llama-2 tokenizer (DIR: a download "
            "of meta-llama/Llama-2-7b-hf), or data.tokenizer=byte")


def positive(key: str, value: int | None) -> None:
    """A count that must be >= 1 when given (None passes: it means "derive it")."""
    if value is not None and value <= 0:
        raise TapeError(f"{key}: must be a positive integer, got {value}")


def check_tokenized(data: Any, needs_source: bool = True) -> None:
    """The shared checks of a kind that tokenizes text it reads (text, pairs, scrolls): its `source` (when the kind
    has no default one), its `tokenizer` (not a generated task's own) and its `val_fraction`."""
    if needs_source and not data.source:
        raise TapeError(f"data.source: data.kind '{data.kind}' needs a source (hub id, file, directory or glob)")
    check_text_tokenizer(data)
    if not 0 <= data.val_fraction < 1:
        raise TapeError(f"data.val_fraction: must be in [0, 1), got {data.val_fraction}")


def check_text_tokenizer(data: Any) -> None:
    """A kind that tokenizes text takes `byte`, a SentencePiece model or a tokenizer.json, not the tokenizer of a
    generated task."""
    if data.tokenizer in CHAR_TOKENIZERS:
        raise TapeError(f"data.tokenizer: '{data.tokenizer}' is the tokenizer of generated data and does not fit "
                        f"data.kind '{data.kind}'; use byte, a SentencePiece .model or a tokenizer.json")


def check_source_files(data: Any) -> None:
    """`check_files` of a kind whose `source` is documents (text, pairs): a local source names documents."""
    from tapecli.data.sources import check_source

    if data.source:
        check_source(data.source, "data.source")
