"""Positional encodings: one small file per PE, and the registry that turns a `model.pe` value into a class.

Every PE file imports tape only through `tapecli.model.pe.base`, the API that `tapecli.pe` publishes; `registry`
holds the built-ins and resolves plugins (`plugins`: entry points, files, modules).
"""

from __future__ import annotations

from tapecli.model.pe.base import LayerPE, PositionalEncoding, PositionState, apply_rotary, check_pe_args
from tapecli.model.pe.registry import BUILTINS, ResolvedPE, build_pe, pe_label, resolve_option, resolve_pe

PE_REGISTRY: dict[str, type[PositionalEncoding]] = BUILTINS  # the built-ins by name (plugins: resolve_pe)
PE_NAMES: tuple[str, ...] = tuple(BUILTINS)

__all__ = ["PE_NAMES", "PE_REGISTRY", "LayerPE", "PositionState", "PositionalEncoding", "ResolvedPE", "apply_rotary",
           "build_pe", "check_pe_args", "pe_label", "resolve_option", "resolve_pe"]
