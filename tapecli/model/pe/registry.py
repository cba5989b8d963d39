"""The one place a `model.pe` value becomes a PE class: the built-ins, installed plugins, files and modules.

    resolved = resolve_pe("kerple")           # ResolvedPE(cls, name, record)
    resolve_pe("path/kerple.py:Kerple", recorded=saved_config["pe_plugin"])
    pe = build_pe(config)                     # the model-level PE of a ModelConfig, pe_args validated
    pe_label("path/kerple.py:Kerple")         # "Kerple": a short name for tables and directories, nothing imported

A value is, in this order: a built-in name (BUILTINS); the name of an installed plugin (an entry point of the
group `tapecli.pe`); `FILE.py:CLASS` or `MODULE:CLASS`, imported only when this invocation's command line named it
(`tapecli.trust`). ModelConfig, every command's `--pe` and `tape pe check` go through `resolve_pe`; nothing else
maps names to classes. `recorded` is what a checkpoint recorded of the plugin (`plugins`): it names the package to
install when the plugin is missing and lets a copy of a recorded file be used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tapecli import trust
from tapecli.model.pe import plugins
from tapecli.model.pe.alibi import ALiBi
from tapecli.model.pe.base import PositionalEncoding, check_pe_args
from tapecli.model.pe.clipped_rope import ClippedRoPE
from tapecli.model.pe.comrope import ComRoPE
from tapecli.model.pe.cope import CoPE
from tapecli.model.pe.dape import DAPE
from tapecli.model.pe.fire import FIRE
from tapecli.model.pe.fox import FoX
from tapecli.model.pe.grape import GRAPE
from tapecli.model.pe.grape_ap import GRAPEAP
from tapecli.model.pe.liere import LieRE
from tapecli.model.pe.mapwm import MapWM
from tapecli.model.pe.nope import NoPE
from tapecli.model.pe.path import PaTH
from tapecli.model.pe.pope import PoPE
from tapecli.model.pe.randpe import RandPE
from tapecli.model.pe.rope import RoPE
from tapecli.model.pe.stickbreaking import StickBreaking
from tapecli.model.pe.t5 import T5Bias
from tapecli.model.pe.tape import TAPE
from tapecli.model.pe.xpos import XPos

BUILTINS: dict[str, type[PositionalEncoding]] = {
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
    "fox": FoX,
    "stickbreaking": StickBreaking,
    "pope": PoPE,
    "mapwm": MapWM,
    "clipped-rope": ClippedRoPE,
    "grape": GRAPE,
    "grape-ap": GRAPEAP,
    "liere": LieRE,
    "comrope": ComRoPE,
    "dape": DAPE,
}


@dataclass(frozen=True)
class ResolvedPE:
    cls: type[PositionalEncoding]
    name: str  # the built-in or plugin name, or the class name of a file or module
    record: dict[str, Any] | None  # None for a built-in; else where the code came from (plugins)


def resolve_pe(value: object, recorded: dict[str, Any] | None = None) -> ResolvedPE:
    """The PE class `value` names; ValueError of one line (`model.pe: ...`) when it names none or may not be
    imported."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"model.pe: expected the name of a positional encoding, got {value!r}")
    if value in BUILTINS:
        return ResolvedPE(BUILTINS[value], value, None)
    if trust.split_code(value) is not None:
        cls, record = plugins.code_plugin(value, recorded)
        return ResolvedPE(cls, record["name"], record)
    found = plugins.entry_point_plugin(value, recorded)
    if found is None:
        raise ValueError(plugins.missing_plugin(value, tuple(BUILTINS), recorded))
    return ResolvedPE(found[0], value, found[1])


def resolve_option(values: list[str] | tuple[str, ...], option: str = "--pe") -> list[ResolvedPE]:
    """Each value of a command's PE list resolved; TapeError of one line naming the option for the first that
    resolves to nothing. (Allowing code is the command line's business: tapecli.trust.allow_named.)"""
    from tapecli.errors import TapeError

    resolved = []
    for value in values:
        try:
            resolved.append(resolve_pe(value))
        except ValueError as e:
            raise TapeError(f"{option}: {str(e).removeprefix('model.pe: ')}") from None
    return resolved


def available_pes() -> list[tuple[str, ResolvedPE | None, str]]:
    """(name, how it resolves or None, a problem or "") of every built-in and installed plugin (`tape pe list`);
    a plugin that fails to import or shares a built-in's name is listed with what is wrong."""
    found: list[tuple[str, ResolvedPE | None, str]] = [(name, ResolvedPE(cls, name, None), "")
                                                      for name, cls in BUILTINS.items()]
    for name in plugins.installed_plugins():
        if name in BUILTINS:
            found.append((name, None, f"a plugin's entry point named {name!r}: the built-in takes that name"))
            continue
        try:
            found.append((name, resolve_pe(name), ""))
        except ValueError as e:
            found.append((name, None, str(e).removeprefix("model.pe: ")))
    return found


def pe_label(value: str) -> str:
    """A short name for a PE value without importing anything: the name itself, or the class of `target:CLASS`."""
    code = trust.split_code(value)
    return value if code is None else code[1]


def build_pe(config, name: str | None = None, args: dict | None = None) -> PositionalEncoding:
    """Instantiate a model-level PE with validated pe_args: by default `config.pe` with `config.pe_args` (and its
    `pe_plugin` record); a layer schedule's groups name theirs (`tapecli.model.schedule`, `tapecli.model.hybrid`)."""
    name = config.pe if name is None else name
    args = config.pe_args if args is None else args
    recorded = getattr(config, "pe_plugin", None) if name == config.pe else None
    cls = resolve_pe(name, recorded).cls
    return cls(config, **check_pe_args(cls, name, args))
