"""The public API for writing a positional encoding: the stable import location for PEs outside the package.

    from tapecli.pe import LayerPE, PositionalEncoding, PositionState, ScoreBias

These are the very objects the built-in PEs use (tapecli/model/pe/base.py, where each hook's contract is written
down; docs/pe-api.md is the reference, docs/write-your-own-pe.md the tutorial): the two base classes, the position
state, the three needs a layer may declare to attention, and the helpers a PE may call. `RoPE` and `RotaryLayer`
are there to build on (xPos, RandPE and TAPE do). Names not listed here are internal and may change.
"""

from tapecli.model.pe.base import (
    CLAIMS,
    LayerCache,
    LayerPE,
    Need,
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
    pe_arguments,
    plain_attention,
    probing_active,
    report_weights,
    rows_for,
)
from tapecli.model.pe.rope import RoPE, RotaryLayer

__all__ = ["CLAIMS", "LayerCache", "LayerPE", "Need", "OwnAttention", "PositionState", "PositionalEncoding", "RoPE",
           "RotaryLayer", "ScoreBias", "ScoreMod", "WideValue", "apply_rotary", "by_query_chunks",
           "check_positive_int", "check_range", "default_positions", "encoded_attention", "flex_attention",
           "forced_path", "kernels_available", "pe_arguments", "plain_attention", "probing_active", "report_weights",
           "rows_for"]
