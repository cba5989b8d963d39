"""NoPE: no positional signal at all; order comes only from the causal mask."""

from tapecli.model.pe.base import PositionalEncoding


class NoPE(PositionalEncoding):
    """The base class already does nothing; NoPE is that, by name."""

    claims = ("shift-invariance",)
