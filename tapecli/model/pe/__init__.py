"""The registry of positional encodings: one small file per PE, one name each."""

from __future__ import annotations

from tapecli.model.pe.alibi import ALiBi
from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, apply_rotary, check_pe_args
from tapecli.model.pe.cope import CoPE
from tapecli.model.pe.fire import FIRE
from tapecli.model.pe.nope import NoPE
from tapecli.model.pe.path import PaTH
from tapecli.model.pe.randpe import RandPE
from tapecli.model.pe.rope import RoPE
from tapecli.model.pe.t5 import T5Bias
from tapecli.model.pe.tape import TAPE
from tapecli.model.pe.xpos import XPos

PE_REGISTRY: dict[str, type[PositionalEncoding]] = {
    "nope": NoPE,
    "rope": RoPE,
    "randpe": RandPE,
    "alibi": ALiBi,
    "fire": FIRE,
    "xpos": XPos,
    "t5": T5Bias,
    "tape": TAPE,
    "cope": CoPE,
    "path": PaTH,
}
PE_NAMES: tuple[str, ...] = tuple(PE_REGISTRY)


def build_pe(config, name: str | None = None, args: dict | None = None) -> PositionalEncoding:
    """Instantiate the model-level PE `name` with `args` (validated; ValueError naming model.pe / model.pe_args.*),
    by default `config.pe` with `config.pe_args`. Every PE of a model is built here, one per distinct (pe, pe_args)
    of its layers (`tapecli.model.schedule`)."""
    name = config.pe if name is None else name
    args = config.pe_args if args is None else args
    if name not in PE_REGISTRY:
        raise ValueError(f"model.pe: unknown positional encoding {name!r}; allowed: {', '.join(PE_NAMES)}")
    cls = PE_REGISTRY[name]
    return cls(config, **check_pe_args(cls, name, args))


__all__ = ["PE_NAMES", "PE_REGISTRY", "LayerPE", "PositionState", "PositionalEncoding", "apply_rotary", "build_pe"]
