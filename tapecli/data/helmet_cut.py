"""HELMET's document cut, shared by its long-document QA and summarisation categories (princeton-nlp/HELMET data.py:
`filter_length` and `truncate_llama2`): every document is measured and cut with one fixed tokenizer, Llama 2's
(`meta-llama/Llama-2-7b-hf`), "so that every model sees the same amount of information".

    tokenizer = load_tokenizer(name)        # a folder holding tokenizer.json (or that file), else a hub id's
    measure = Measure(tokenizer)
    measure.count(text)                     # tokens, with the tokenizer's default special tokens (data.py's len())
    text, cut = measure.truncate(text, n)   # over n tokens: cut after token n - len(SUFFIX's tokens), SUFFIX added

The tokenizer.json is read with the `tokenizers` library, which gives the ids and offsets of the transformers fast
tokenizer HELMET calls, without transformers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError

TRUNCATION_TOKENIZER = "meta-llama/Llama-2-7b-hf"  # data.py's truncate_llama2 and filter_length
SUFFIX = " ... [the rest of the text is omitted]"


class TruncationTokenizer:
    """A tokenizer.json read with the `tokenizers` library, called as HELMET calls its Llama 2 tokenizer:
    `tokenizer(text)` (default special tokens) gives `input_ids` and, asked, each token's `offset_mapping`."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(path))

    def __call__(self, text: str, return_offsets_mapping: bool = False) -> dict[str, list[Any]]:
        encoding = self.tokenizer.encode(text)
        return {"input_ids": encoding.ids, **({"offset_mapping": encoding.offsets} if return_offsets_mapping else {})}


def load_tokenizer(name: str) -> TruncationTokenizer:
    """The truncation tokenizer: a folder holding tokenizer.json (or that file), else a hub id's tokenizer.json."""
    from tapecli.faults import reading

    local = Path(name).expanduser()
    path = local / "tokenizer.json" if local.is_dir() else local
    if not path.is_file():
        if local.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
            raise TapeError(f"--truncation-tokenizer {name}: no tokenizer.json there; pass a folder holding a fast "
                            f"tokenizer (tokenizer.json), HELMET's is {TRUNCATION_TOKENIZER}'s")
        try:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(name, "tokenizer.json"))
        except Exception:  # noqa: BLE001 - offline, unreachable, gated or refused: the same sentence
            raise TapeError(f"--truncation-tokenizer {name} cannot be read from the Hugging Face hub (offline, "
                            f"unreachable or gated); pass a folder holding a copy of {TRUNCATION_TOKENIZER}'s "
                            "tokenizer.json (HELMET's) or of another fast tokenizer") from None
    with reading(path):
        try:
            return TruncationTokenizer(path)
        except Exception as e:  # noqa: BLE001 - the library's parse error: one line naming the file
            raise TapeError(f"--truncation-tokenizer {name}: {path} is not a tokenizer.json the tokenizers library "
                            f"reads ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


class Measure:
    """Token counts (with special tokens) and data.py's truncate_llama2, one tokenization per distinct text."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.separator = len(tokenizer(SUFFIX)["input_ids"])
        self.counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        if text not in self.counts:
            self.counts[text] = len(self.tokenizer(text)["input_ids"])
        return self.counts[text]

    def truncate(self, text: str, max_length: int) -> tuple[str, bool]:
        """(text, whether cut): truncate_llama2's cut at `max_length` tokens."""
        if self.count(text) <= max_length:
            return text, False
        offsets = self.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
        return text[:offsets[max_length - self.separator][1]] + SUFFIX, True
