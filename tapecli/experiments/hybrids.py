"""Named hybrid layouts for `tape bench --hybrid` and `tape doctor`: model keys (a schedule) for a window W.

    keys = hybrid_keys("irope", window=1024)      # {"pe": ..., "schedule": {...}} for ModelConfig / a recipe
    keys = hybrid_keys("gemma3", 1024, n_layers=2)   # the pattern's first 2 layers

  irope      Llama-4-like: 3 local RoPE layers (sliding window W; Llama 4's own local layers attend in fixed chunks)
             then 1 global NoPE layer with Llama 4's length scale (llama4), repeated
  rnope-swa  Command-A / RNoPE-SWA-like (arXiv 2501.18795): 3 RoPE layers with a sliding window W, then 1 global
             NoPE layer, repeated
  gemma3     Gemma-3-like: 5 local RoPE layers (theta 1e4, window W), then 1 global RoPE layer (theta 1e6)
The shipped recipes irope-*.yaml and rnope-swa-*.yaml spell the first two out (docs/hybrids.md).
"""

from __future__ import annotations

from typing import Any

from tapecli.errors import TapeError

HYBRIDS = ("irope", "rnope-swa", "gemma3")


def hybrid_keys(name: str, window: int, n_layers: int | None = None) -> dict[str, Any]:
    """The model keys of layout `name` with local layers of `window` keys (module docstring); with `n_layers`
    fewer than its pattern names, the pattern's first n_layers names (a model's pattern names no more layers than
    it has)."""
    keys = _layout(name, window)
    keys["schedule"]["pattern"] = keys["schedule"]["pattern"][:n_layers]
    return keys


def _layout(name: str, window: int) -> dict[str, Any]:
    local = {"pe": "rope", "window": window}
    if name == "irope":
        return {"pe": "rope", "schedule": {"pattern": ["local", "local", "local", "global"], "kinds": {
            "local": local, "global": {"pe": "nope", "length_scale": "llama4"}}}}
    if name == "rnope-swa":
        return {"pe": "rope", "schedule": {"pattern": ["local", "local", "local", "global"], "kinds": {
            "local": local, "global": {"pe": "nope"}}}}
    if name == "gemma3":
        return {"pe": "rope", "pe_args": {"theta": 1e6}, "schedule": {
            "pattern": ["local"] * 5 + ["global"], "kinds": {"local": {**local, "pe_args": {"theta": 1e4}},
                                                             "global": {}}}}
    raise TapeError(f"--hybrid: unknown layout {name!r}; allowed: {', '.join(HYBRIDS)}")


def parse_hybrids(text: str) -> list[str]:
    """--hybrid: comma-separated layout names (checked; none when `text` is empty; no empty or repeated entry)."""
    from tapecli import commas

    names = commas.split(text, "--hybrid") if text.strip() else []
    for name in names:
        if name not in HYBRIDS:
            raise TapeError(f"--hybrid: unknown layout {name!r}; allowed: {', '.join(HYBRIDS)}")
    return names
