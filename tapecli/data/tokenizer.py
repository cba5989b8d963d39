"""Tokenizers: byte-level, SentencePiece `.model`, Hugging Face `tokenizer.json`, and named ones from a registry.

Every tokenizer has the same small interface (see docs/contracts.md):

    tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id
    tok.encode(text) -> list[int]      # no special tokens added
    tok.encode(text, add_special_tokens=True)   # the tokenizer's default special tokens around the text
    tok.default_specials -> (ids before, ids after)   # what that adds
    tok.has_bos                        # False: the tokenizer names no BOS token (bos_id is a stand-in)
    tok.token_text(id) -> str | None   # a special token as text ("<s>"); None when it has no text form
    tok.decode(ids) -> str             # special ids are skipped
    tok.save(directory)                # -> load_tokenizer_dir(directory) gives the same tokenizer back

Default special tokens (docs/special-tokens.md). tape's own tokenizers (byte, `synthetic`, a SentencePiece model or
tokenizer.json named by a recipe) put BOS before a text and nothing after it: tape's pre-training starts every
document with BOS (`[BOS] text [EOS]`, the EOS closing the document). `addition` adds nothing: its task trains and
evaluates prompts without BOS. A Hugging Face model's tokenizer adds what transformers' AutoTokenizer adds by
default; `tapecli.model.hf.load_hf_tokenizer` works that out and sets it with `set_default_specials`, and `save`
keeps it (in tokenizer_meta.json, only when it differs from tape's rule).

`train_tokenizer` trains a SentencePiece BPE model whose encode/decode round trip is lossless (tabs, runs of
spaces, newlines, any unicode), which matters for bits-per-byte and for string-level evaluation.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError

META_FILE = "tokenizer_meta.json"

# The character tokenizers of the generated tasks, by name: their symbols, in id order after PAD, BOS, EOS.
CHAR_TOKENIZERS = {
    "addition": "0123456789+=",  # tapecli.data.arithmetic: reversed-digit addition (`321+54=861`)
    "synthetic": "abcdefghijklmnop_|LRUD",  # tapecli.data.synthetic: 16 symbols, blank, separator, grid actions
    "flip-flop": "wri01",  # tapecli.data.flipflop: write / read / ignore instructions and the bits
    "counting": "abcdefghij=;.+?0123456789X",  # tapecli.data.counting: variables, `=`, `;`, pass, ++, print, 0-10
}


class Tokenizer:
    """Base class. Subclasses set the four ids and `kind`, and implement encode/decode.

    The default `save` writes only `tokenizer_meta.json` with the kind, which is enough for tokenizers that
    need no files (byte-level, or a named tokenizer from the registry whose name is its kind).
    """

    kind: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    # Ids a model's own files named (an imported Hugging Face model), saved in tokenizer_meta.json so that
    # load_tokenizer_dir gives them back; None: the tokenizer finds its ids itself.
    specials: dict[str, int] | None = None
    # (ids before, ids after) a text by default; None: tape's rule for this tokenizer (`_tape_default`).
    _defaults: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # False when the tokenizer's own files name no BOS token (Qwen's): bos_id is then a stand-in for tape's layouts.
    has_bos: bool = True

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The ids of `text`; with `add_special_tokens`, between the tokenizer's default special tokens."""
        ids = self._encode(text)
        if not add_special_tokens:
            return ids
        before, after = self.default_specials
        return [*before, *ids, *after]

    def _tape_default(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """tape's rule: BOS before a text, nothing after it (pre-training's `[BOS] text [EOS]`)."""
        return (self.bos_id,), ()

    @property
    def default_specials(self) -> tuple[list[int], list[int]]:
        """(ids before, ids after) that `encode(text, add_special_tokens=True)` puts around a text."""
        before, after = self._defaults if self._defaults is not None else self._tape_default()
        return list(before), list(after)

    def set_default_specials(self, before: list[int], after: list[int], has_bos: bool = True) -> None:
        """Replace tape's rule with a model's own (a Hugging Face tokenizer's)."""
        wanted = (tuple(before), tuple(after))
        self._defaults = None if wanted == self._tape_default() else wanted
        self.has_bos = has_bos

    def token_text(self, token_id: int) -> str | None:
        """A token as text, special tokens included ("<s>"); None for ids with no text form (byte-level specials)."""
        return None

    def token_name(self, token_id: int) -> str:
        """A token's text, or BOS / EOS / PAD for a special id with no text form (byte-level ones)."""
        text = self.token_text(token_id)
        names = {self.pad_id: "PAD", self.eos_id: "EOS", self.bos_id: "BOS"}
        return text if text else names.get(token_id, f"<id {token_id}>")

    def describe_specials(self, before: list[int], after: list[int]) -> dict[str, Any]:
        """For results files: the ids put before and after a text and the layout they give, e.g.
        `{"before": [1], "after": [], "layout": "<s> {text}"}`."""
        layout = " ".join([*map(self.token_name, before), "{text}", *map(self.token_name, after)])
        return {"before": list(before), "after": list(after), "layout": layout}

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta: dict = {"kind": self.kind}
        if self.specials:
            meta["specials"] = self.specials
        if self._defaults is not None:  # written only when not tape's rule: older checkpoints keep their bytes
            meta["default_specials"] = {"before": list(self._defaults[0]), "after": list(self._defaults[1])}
        if not self.has_bos:
            meta["has_bos"] = False
        (directory / META_FILE).write_text(json.dumps(meta) + "\n")
        return directory

    def _set_specials(self, specials: dict[str, int | str] | None, to_id: Callable[[str], int | None]) -> None:
        """Apply explicit `{"bos"|"eos"|"pad": id or token text}`; unknown token texts are a TapeError."""
        if not specials:
            return
        resolved = {}
        for kind, value in specials.items():
            token_id = to_id(value) if isinstance(value, str) else value
            if token_id is None or token_id < 0:
                raise TapeError(f"{self.path}: the {kind} token {value!r} is not in the vocabulary")
            resolved[kind] = int(token_id)
            setattr(self, f"{kind}_id", int(token_id))
        self.specials = resolved


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, then BOS=256, EOS=257, PAD=258. Needs no training and never fails."""

    kind = "byte"

    def __init__(self) -> None:
        self.bos_id, self.eos_id, self.pad_id = 256, 257, 258
        self.vocab_size = 259

    def _encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class CharTokenizer(Tokenizer):
    """One id per character of a fixed alphabet: PAD=0, BOS=1, EOS=2, then the symbols of `CHAR_TOKENIZERS[kind]`.
    Text outside the alphabet is a TapeError naming the character."""

    def __init__(self, kind: str) -> None:
        self.kind, self.symbols = kind, CHAR_TOKENIZERS[kind]
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._offset = 3
        self.vocab_size = self._offset + len(self.symbols)
        self._ids = {ch: self._offset + k for k, ch in enumerate(self.symbols)}

    def _tape_default(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The addition task trains and evaluates its prompts without BOS (`321+54=`); the others start with BOS."""
        return ((), ()) if self.kind == "addition" else super()._tape_default()

    @property
    def digit_ids(self) -> list[int] | None:
        """Token ids of the digits 0-9, in order (what `ModelConfig.abacus_digit_ids` needs); None without digits."""
        return [self._ids[d] for d in "0123456789"] if all(d in self._ids for d in "0123456789") else None

    def _encode(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as e:
            raise TapeError(f"the {self.kind} tokenizer has no token for {e.args[0]!r}; it knows "
                            f"{self.symbols!r}") from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.symbols[i - self._offset] for i in map(int, ids) if i >= self._offset)


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model file. Control pieces (BOS/EOS/PAD) are dropped by sentencepiece's own decode."""

    kind = "sentencepiece"
    file_name = "tokenizer.model"

    def __init__(self, path: Path, specials: dict[str, int | str] | None = None) -> None:
        import sentencepiece as spm

        from tapecli.faults import reading

        self.path = path
        with reading(path):  # a corrupt or truncated model: one line naming it
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id, self.eos_id, self.pad_id = self.sp.bos_id(), self.sp.eos_id(), self.sp.pad_id()
        self._set_specials(specials, self._piece_id)
        if self.bos_id < 0 or self.eos_id < 0:
            raise TapeError(f"sentencepiece model {path} has no BOS/EOS pieces; train it with bos_id and eos_id set")
        # Many public models (e.g. Llama's) define no pad piece; padding with EOS is harmless since pads are masked.
        if self.pad_id < 0:
            self.pad_id = self.eos_id

    def _piece_id(self, piece: str) -> int | None:
        token_id = self.sp.piece_to_id(piece)
        return None if token_id == self.sp.unk_id() and piece != self.sp.id_to_piece(token_id) else token_id

    def _encode(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def token_text(self, token_id: int) -> str | None:
        return self.sp.id_to_piece(int(token_id))

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def save(self, directory: str | Path) -> Path:
        directory = super().save(directory)
        # From memory, not a copy of self.path: that file may be gone (a pruned checkpoint the run resumed from).
        (directory / self.file_name).write_bytes(self.sp.serialized_model_proto())
        return directory


# Special-token spellings of common Hugging Face tokenizers, most specific first.
_HF_BOS = ("<s>", "<|begin_of_text|>", "<bos>", "[BOS]", "<|endoftext|>")
_HF_EOS = ("</s>", "<|end_of_text|>", "<eos>", "[EOS]", "<|endoftext|>")
_HF_PAD = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json`, loaded with the `tokenizers` library (no transformers needed)."""

    kind = "huggingface"
    file_name = "tokenizer.json"

    def __init__(self, path: Path, specials: dict[str, int | str] | None = None) -> None:
        from tokenizers import Tokenizer as HFBackend

        self.path = path
        try:
            self.tk = HFBackend.from_file(str(path))
        except Exception as e:  # the Rust side raises a bare Exception for malformed files
            raise TapeError(f"{path} is not a valid tokenizer.json: {e}") from None
        self.vocab_size = self.tk.get_vocab_size(with_added_tokens=True)
        self.bos_id, self.eos_id, self.pad_id = self._find(_HF_BOS), self._find(_HF_EOS), self._find(_HF_PAD)
        self._set_specials(specials, self.tk.token_to_id)
        if self.bos_id is None or self.eos_id is None:
            raise TapeError(
                f"{path} has no recognisable BOS/EOS token (looked for {', '.join(dict.fromkeys(_HF_BOS + _HF_EOS))})"
            )
        if self.pad_id is None:
            self.pad_id = self.eos_id

    def _find(self, candidates: tuple[str, ...]) -> int | None:
        for token in candidates:
            token_id = self.tk.token_to_id(token)
            if token_id is not None:
                return token_id
        return None

    def _encode(self, text: str) -> list[int]:
        return self.tk.encode(text, add_special_tokens=False).ids

    def token_text(self, token_id: int) -> str | None:
        return self.tk.decode([int(token_id)], skip_special_tokens=False)

    def post_processor_specials(self) -> tuple[list[int], list[int]]:
        """(ids before, ids after) a text that tokenizer.json's post-processor adds (what `tokenizers` and
        transformers add by default); ([], []) without a post-processor."""
        for probe in ("a", "0", " ", "the", "."):  # a text that yields at least one ordinary token
            encoding = self.tk.encode(probe, add_special_tokens=True)
            plain = [i for i, special in enumerate(encoding.special_tokens_mask) if not special]
            if plain:
                return encoding.ids[:plain[0]], encoding.ids[plain[-1] + 1:]
        return self.tk.encode("", add_special_tokens=True).ids, []

    def decode(self, ids: Iterable[int]) -> str:
        return self.tk.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, directory: str | Path) -> Path:
        directory = super().save(directory)
        self.tk.save(str(directory / self.file_name))  # from memory, like SentencePieceTokenizer.save
        return directory


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        raise TapeError(f"tokenizer file {path} does not exist")
    return path


def load_tokenizer(spec: str) -> Tokenizer:
    """`byte`, a character tokenizer's name (`addition`, `synthetic`), a `.model` path, a `tokenizer.json` path, or a
    saved directory."""
    if spec == "byte":
        return ByteTokenizer()
    if spec in CHAR_TOKENIZERS:
        return CharTokenizer(spec)
    path = Path(spec).expanduser()
    if path.suffix == ".model":
        return SentencePieceTokenizer(_existing_file(path))
    if path.suffix == ".json":
        return HFTokenizer(_existing_file(path))
    if (path / META_FILE).is_file():
        return load_tokenizer_dir(path)
    names = ", ".join(sorted(["byte", *CHAR_TOKENIZERS]))
    raise TapeError(
        f"unknown tokenizer {spec!r}; use one of {names}, a SentencePiece .model file, a tokenizer.json file, "
        "or a directory written by tokenizer.save()"
    )


def load_tokenizer_dir(directory: str | Path) -> Tokenizer:
    """Load what `tok.save(directory)` wrote."""
    directory = Path(directory)
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise TapeError(f"{meta_path} does not exist; is {directory} a saved tokenizer directory?")
    meta = json.loads(meta_path.read_text())
    kind, specials = meta["kind"], meta.get("specials")
    tok: Tokenizer
    if kind == "byte":
        tok = ByteTokenizer()
    elif kind == SentencePieceTokenizer.kind:
        tok = SentencePieceTokenizer(_existing_file(directory / SentencePieceTokenizer.file_name), specials)
    elif kind == HFTokenizer.kind:
        tok = HFTokenizer(_existing_file(directory / HFTokenizer.file_name), specials)
    elif kind in CHAR_TOKENIZERS:
        tok = CharTokenizer(kind)
    else:
        raise TapeError(f"{meta_path}: unknown tokenizer kind {kind!r}")
    defaults = meta.get("default_specials")  # absent: tape's rule (and every tokenizer saved before it existed)
    if defaults is not None or meta.get("has_bos") is False:
        before, after = (defaults["before"], defaults["after"]) if defaults is not None else tok.default_specials
        tok.set_default_specials(before, after, has_bos=meta.get("has_bos", True))
    return tok


def train_tokenizer(
    data: str, vocab_size: int, out: str, text_field: str = "text", max_chars: int = 200_000_000
) -> Path:
    """Train a lossless SentencePiece BPE model on the documents of `data` and write it to `out` (a .model file).

    `data` is any source `iter_documents` accepts; reading stops after `max_chars` characters (enough for a
    tokenizer, and it keeps a hub stream finite). Returns the path of the written model.
    """
    import sentencepiece as spm

    from tapecli.data.sources import iter_documents
    from tapecli.faults import check_output_file
    from tapecli.files import atomic_path

    out_path = Path(out)
    if out_path.suffix != ".model":
        raise TapeError(f"--out {out} must end with .model (a SentencePiece model file)")
    if vocab_size < 1:
        raise TapeError(f"--vocab-size must be a positive integer, got {vocab_size}")
    check_output_file(out_path)  # a directory or a read-only place fails now, not after the training
    with tempfile.TemporaryDirectory(prefix="tape-spm-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        written = 0
        with corpus.open("w", encoding="utf-8") as f:
            for doc in iter_documents(data, text_field=text_field, what="--data"):
                # sentencepiece reads one sentence per line; newlines are still encoded losslessly via byte_fallback.
                lines = [line for line in doc.splitlines() if line.strip()]
                if lines:
                    f.write("\n".join(lines) + "\n")
                    written += sum(len(line) for line in lines)
                if written >= max_chars:
                    break
        if written == 0:
            raise TapeError(f"{data} contains no text to train a tokenizer on")
        try:
            spm.SentencePieceTrainer.train(
                input=str(corpus), model_prefix=str(Path(tmp) / "spm"), vocab_size=vocab_size, model_type="bpe",
                # Lossless round trips (environment.md section 4): no normalisation, keep every space.
                normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
                allow_whitespace_only_pieces=True, byte_fallback=True, character_coverage=1.0,
                pad_id=0, unk_id=1, bos_id=2, eos_id=3, num_threads=2, minloglevel=2,
            )
        except RuntimeError as e:  # e.g. "INTERNAL: src/x.cc(638) [check] Vocabulary size is smaller than ..."
            check, _, reason = str(e).partition("] ")  # "INTERNAL: src/x.cc(638) [check] reason"
            reason = reason.strip() or check.rpartition("[")[-1] or str(e)
            raise TapeError(f"cannot train a {vocab_size}-piece tokenizer on {data}: {reason}") from None
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out_path) as partial:  # a failed copy (full disk) leaves an existing model untouched
            shutil.copyfile(Path(tmp) / "spm.model", partial)
    return out_path


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """A hash of what `tokenizer.save` writes: equal fingerprints mean the same token ids for every text."""
    import hashlib

    h = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        for f in sorted(Path(tmp).iterdir()):
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def train_symbol_tokenizer(out: str | Path, lines: Iterable[str], symbols: Sequence[str], vocab_size: int) -> Path:
    """A small lossless SentencePiece BPE model (the options of `train_tokenizer`, one thread, and no dummy prefix,
    which would glue a target's leading space to its prompt) trained on `lines`, whose user-defined `symbols` (fixed
    phrases; a leading space belongs to the phrase) are single pieces: the tokenizers of the CPU-sized examples
    (tapecli.data.ruler.example, tapecli.data.babilong.example). Written to `out` (a .model file) atomically."""
    import sentencepiece as spm

    from tapecli.files import atomic_path

    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="tape-spm-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(line for line in lines if line.strip()), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(Path(tmp) / "sp"), vocab_size=vocab_size, model_type="bpe",
            normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=False,
            split_digits=True, allow_whitespace_only_pieces=True, byte_fallback=True, character_coverage=1.0,
            pad_id=0, unk_id=1, bos_id=2, eos_id=3, num_threads=1, minloglevel=2,
            user_defined_symbols=[s.replace(" ", "\u2581") for s in symbols])
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as partial:
            partial.write_bytes((Path(tmp) / "sp.model").read_bytes())
    return out
