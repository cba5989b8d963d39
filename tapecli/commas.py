"""Comma-separated values of the command line: the one parser every list option goes through.

    split("rope, tape", "--pe")          # ["rope", "tape"]
    split("rope,,nope", "--pe")          # TapeError: an empty entry
    split("irope,irope", "--hybrid")     # TapeError: irope given twice

Each entry is stripped of spaces. No entries, an empty entry (two commas in a row, a comma at either end) or an
entry given twice is a mistake, not something to drop or repeat in silence: one line naming the option.
"""

from __future__ import annotations

from tapecli.errors import TapeError


def split(text: str, option: str) -> list[str]:
    """The entries of a comma-separated `text` (module docstring); TapeError naming `option` otherwise."""
    parts = [part.strip() for part in str(text).split(",")]
    if parts == [""]:
        raise TapeError(f"{option}: give at least one value")
    if "" in parts:
        raise TapeError(f"{option} {text!r}: an empty entry (two commas in a row, or a comma at either end); "
                        "separate the values by single commas")
    seen: set[str] = set()
    for part in parts:
        if part in seen:
            raise TapeError(f"{option} {text!r}: {part} is given twice; give each value once")
        seen.add(part)
    return parts
