"""DroPE (Gelberg et al., arXiv 2512.12167; official code github.com/SakanaAI/DroPE): drop a pre-trained model's
positional embedding from every layer, then recalibrate briefly at the original training length.

    schedule = drope_schedule(base_config)     # the model.schedule that makes every layer NoPE

The official code (custom_models/attention.py, `attention_type: nope`) keeps each attention module and hands it
cos = 1, sin = 0 (RoPE's identity rotation): same projections, same 1/sqrt(head_dim) softmax scale, same masks and
sliding windows. Here that is a layer schedule whose every layer is `nope` and keeps the base layer's window,
temperature and length scale (tapecli.model.schedule), so the converted model is the base's weights in a NoPE
transformer: no parameter is added or removed, and `tape eval` / resume open it like any run.
"""

from __future__ import annotations

from typing import Any


def drope_schedule(base: dict[str, Any]) -> dict[str, Any]:
    """The `model.schedule` of the DroPE model of `base` (a `ModelConfig.to_dict()`): every layer `nope`, each with
    the base layer's window, temperature and length scale. A uniform base gives `{pattern: [nope]}`; a hybrid one
    (windows, per-layer scales) one kind per distinct layer, named `drope0`, `drope1`, ..."""
    from tapecli.model import ModelConfig

    bodies: list[dict[str, Any]] = []
    for spec in ModelConfig.from_dict(base).layers():
        body: dict[str, Any] = {"pe": "nope"}
        for key in ("window", "temperature", "length_scale", "length_scale_args"):
            if getattr(spec, key) != base.get(key):  # a key a kind leaves out takes the model-level value
                body[key] = getattr(spec, key)
        bodies.append(body)
    if all(body == {"pe": "nope"} for body in bodies):
        return {"pattern": ["nope"]}
    kinds: list[dict[str, Any]] = []
    for body in bodies:
        if body not in kinds:
            kinds.append(body)
    return {"layers": [f"drope{kinds.index(body)}" for body in bodies],
            "kinds": {f"drope{i}": body for i, body in enumerate(kinds)}}


def has_positional_embedding(base: dict[str, Any]) -> bool:
    """Whether any layer of `base` has a PE to drop."""
    from tapecli.model import ModelConfig

    return any(spec.pe != "nope" for spec in ModelConfig.from_dict(base).layers())
