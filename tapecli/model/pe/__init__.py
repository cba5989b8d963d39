"""The registry of positional encodings: one small file per PE, one name each."""

from __future__ import annotations

from tapecli.model.pe.alibi import ALiBi
from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, apply_rotary, check_pe_args
from tapecli.model.pe.cope import CoPE
from tapecli.model.pe.fire import FIRE
from tapecli.model.pe.mapwm import MapWM
from tapecli.model.pe.nope import NoPE
from tapecli.model.pe.path import PaTH
from tapecli.model.pe.pope import PoPE
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
    "pope": PoPE,
    "mapwm": MapWM,
}
PE_NAMES: tuple[str, ...] = tuple(PE_REGISTRY)


def build_pe(config) -> PositionalEncoding:
    """Instantiate the model-level PE named by `config.pe` with `config.pe_args` (validated)."""
    cls = PE_REGISTRY[config.pe]
    return cls(config, **check_pe_args(cls, config.pe, config.pe_args))


__all__ = ["PE_NAMES", "PE_REGISTRY", "LayerPE", "PositionState", "PositionalEncoding", "apply_rotary", "build_pe"]
