"""The PE author's kit: the public API for writing a positional encoding, its conformance check and templates.

    from tapecli.pe import LayerPE, PositionalEncoding, PositionState, ScoreBias

    tapecli/pe/__init__.py   the API (this module): the stable import location for PEs outside the package
    tapecli/pe/check/        `tape pe check`: the conformance kit every PE must pass (`tape doctor` runs four checks)
    tapecli/pe/templates/    `tape pe new`'s skeletons, each a working PE

The names below are the very objects the built-in PEs use (tapecli/model/pe/base.py, where each hook's contract is
written down; docs/pe-api.md is the reference, docs/write-your-own-pe.md the tutorial): the two base classes, the
position state, the three needs a layer may declare to attention, and the helpers a PE may call. `RoPE` and
`RotaryLayer` are there to build on (xPos, RandPE and TAPE do). `__all__` is the API: what the built-ins use, plus
`CLAIMS` (what a PE may declare for `tape pe check` to verify) and `default_positions` (the default `positions`, for a
PE that overrides it) -- no more (a test says so). Names not in it are internal and may change.

`API_VERSION` is (major, minor): the minor grows when names are added, the major when a name or hook changes or
goes, so a plugin may check `tapecli.pe.API_VERSION[0] == 1` (and `>= (1, n)` for a name added in 1.n).
"""

from tapecli.model.pe.base import (
    CLAIMS,
    LayerCache,
    LayerPE,
    Need,  # noqa: F401  (not in __all__: importable for plugins written before API_VERSION existed)
    OwnAttention,
    PositionalEncoding,
    PositionState,
    ScoreBias,
    ScoreMod,
    WideValue,
    apply_rotary,
    by_query_chunks,
    check_positive_int,
    check_range,
    default_positions,
    encoded_attention,
    flex_attention,
    forced_path,
    kernels_available,
    optional_kernel,
    pe_arguments,  # noqa: F401  (as Need)
    plain_attention,
    probing_active,
    report_weights,
    rows_for,
)
from tapecli.model.pe.rope import RoPE, RotaryLayer

API_VERSION = (1, 0)

__all__ = ["API_VERSION", "CLAIMS", "LayerCache", "LayerPE", "OwnAttention", "PositionState", "PositionalEncoding",
           "RoPE", "RotaryLayer", "ScoreBias", "ScoreMod", "WideValue", "apply_rotary", "by_query_chunks",
           "check_positive_int", "check_range", "default_positions", "encoded_attention", "flex_attention",
           "forced_path", "kernels_available", "optional_kernel", "plain_attention", "probing_active", "report_weights",
           "rows_for"]
