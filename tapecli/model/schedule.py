"""The layer schedule: which PE, window, temperature and length scale each layer has (a model's "hybrid" layout).

    specs = layer_specs(config)        # one LayerSpec per layer, validated; every error names its key
    text = describe(specs)             # "rope x3 (window 1024) + nope x1 (llama4)", for tables

The model-level keys hold for every layer: `pe` and `pe_args`, `window` (null: global attention), `temperature`,
`length_scale` and `length_scale_args`, `sinks` (learned attention sinks, tapecli.model.attention.sinks).
`model.schedule` (a mapping; {} = no schedule) changes them per layer. It holds `kinds` (what a name means) and
exactly one way to give each layer a name:

    pattern: [local, local, local, global]        repeated over the layers from layer 0: layer i is pattern[i % n]
    every: {n: 4, kind: global, others: local}    every n-th layer (layers n-1, 2n-1, ...) is `kind`, the others
                                                  `others` (Llama 4's no_rope_layer_interval, Gemma 3's
                                                  sliding_window_pattern)
    layers: [local, global, local, ...]           one name per layer (Hugging Face's layer_types)
    kinds:                                        any of pe, pe_args, window, temperature, length_scale,
      local: {window: 1024, pe_args: {theta: 10000.0}}     length_scale_args, sinks; a key a kind leaves out takes
      global: {pe: nope, length_scale: llama4}             the model-level value

A name that is no kind but a PE's name means {pe: <name>}, so `pattern: [rope, rope, rope, nope]` needs no kinds.
A pattern or list may also be written as one string joined by "+" (`pattern: rope+rope+rope+nope`), which fits a
command line and `tape sweep --grid model.schedule.pattern=rope,nope,rope+rope+nope` (three cells).
A kind that keeps the model's PE merges its pe_args over model.pe_args (Gemma 3: local RoPE theta 1e4 over a global
1e6); a kind that names another PE starts from that PE's defaults. length_scale_args follow the same rule.

Layers whose (pe, pe_args) are equal share one model-level PE (`tapecli.model.hybrid`); what that means for PEs
that carry state or compute positions from content is documented there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tapecli.model.attention.scaling import check_length_scale, check_temperature
from tapecli.model.attention.sinks import check_sinks

LAYER_KEYS = ("pe", "pe_args", "window", "temperature", "length_scale", "length_scale_args", "sinks")
FORMS = ("pattern", "every", "layers")


@dataclass(frozen=True)
class LayerSpec:
    """What one layer is: its PE, attention window (None: global), temperature and length scale (arguments
    resolved), attention sinks or not, and the schedule's name for it (None without a schedule)."""

    pe: str
    pe_args: dict[str, Any] = field(default_factory=dict)
    window: int | None = None
    temperature: float = 1.0
    length_scale: str = "none"
    length_scale_args: dict[str, Any] = field(default_factory=dict)
    kind: str | None = None
    sinks: bool = False

    @property
    def pe_key(self) -> tuple[str, str]:
        """Layers with equal keys share one model-level PE."""
        return self.pe, json.dumps(self.pe_args, sort_keys=True)


def layer_names(schedule: dict[str, Any], n_layers: int) -> list[str]:
    """The schedule's name of every layer (ValueError naming the key that is wrong)."""
    unknown = sorted(set(schedule) - {*FORMS, "kinds"})
    if unknown:
        raise ValueError(f"model.schedule.{unknown[0]}: not a key of a schedule; allowed: {', '.join(FORMS)}, kinds")
    forms = [form for form in FORMS if form in schedule]
    if len(forms) != 1:
        raise ValueError(f"model.schedule: give exactly one of {', '.join(FORMS)} (got "
                         f"{', '.join(forms) or 'none'})")
    form, value = forms[0], schedule[forms[0]]
    key = f"model.schedule.{form}"
    if form == "every":
        if not isinstance(value, dict) or set(value) != {"n", "kind", "others"}:
            raise ValueError(f"{key}: expected {{n: N, kind: NAME, others: NAME}}, got {value!r}")
        n = value["n"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{key}.n: expected a positive integer, got {n!r}")
        if n > n_layers:
            raise ValueError(f"{key}.n: {n} is more than model.n_layers={n_layers}, so no layer would be "
                             f"{value['kind']!r}; give n <= {n_layers}")
        names = [value["kind"] if (i + 1) % n == 0 else value["others"] for i in range(n_layers)]
    else:
        if isinstance(value, str):
            value = value.split("+")
        if not isinstance(value, list) or not value:
            raise ValueError(f"{key}: expected a non-empty list of names (or names joined by +), got {value!r}")
        if form == "layers" and len(value) != n_layers:
            raise ValueError(f"{key}: names {len(value)} layers, the model has model.n_layers={n_layers}")
        if len(value) > n_layers:  # the names past the last layer would be dropped
            raise ValueError(f"{key}: names {len(value)} layers, more than model.n_layers={n_layers}; give at most "
                             f"{n_layers} names (the pattern repeats from layer 0)")
        names = [value[i % len(value)] for i in range(n_layers)]
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"{key}: expected names (strings), got {name!r}")
    return names


def layer_specs(config) -> list[LayerSpec]:
    """Every layer's LayerSpec for a ModelConfig (module docstring); ValueError naming the key on a mistake."""
    from tapecli.model.pe import PE_NAMES

    schedule = config.schedule or {}
    if not isinstance(schedule, dict):
        raise ValueError(f"model.schedule: expected a mapping, got {schedule!r}")
    kinds = schedule.get("kinds", {})
    if not isinstance(kinds, dict):
        raise ValueError(f"model.schedule.kinds: expected a mapping of names, got {kinds!r}")
    names = layer_names(schedule, config.n_layers) if schedule else [None] * config.n_layers
    resolved: dict[str | None, LayerSpec] = {}
    for name in dict.fromkeys(names):
        if name is None:
            body, key = {}, "model"
        elif name in kinds:
            body, key = kinds[name], f"model.schedule.kinds.{name}"
            if not isinstance(body, dict):
                raise ValueError(f"{key}: expected a mapping of {', '.join(LAYER_KEYS)}, got {body!r}")
        elif name in PE_NAMES:
            body, key = {"pe": name}, "model"  # the PE's own errors (e.g. model.causal) stand as they are
        else:
            raise ValueError(f"model.schedule: layer name {name!r} is neither one of model.schedule.kinds "
                             f"({', '.join(kinds) or 'none'}) nor a positional encoding ({', '.join(PE_NAMES)})")
        resolved[name] = resolve(config, body, key, name)
    specs = [resolved[name] for name in names]
    check_shared_pes(specs, config)
    return specs


def resolve(config, body: dict[str, Any], key: str, name: str | None) -> LayerSpec:
    """One kind's LayerSpec: its keys over the model-level ones (module docstring), each checked."""
    from tapecli.model.pe import build_pe

    unknown = sorted(set(body) - set(LAYER_KEYS))
    if unknown:
        raise ValueError(f"{key}.{unknown[0]}: not a layer key; allowed: {', '.join(LAYER_KEYS)}")
    pe = body.get("pe", config.pe)
    own = body.get("pe_args", {})
    if not isinstance(own, dict):
        raise ValueError(f"{key}.pe_args: expected a mapping, got {own!r}")
    pe_args = {**config.pe_args, **own} if pe == config.pe else dict(own)
    try:
        build_pe(config, pe, pe_args)
    except ValueError as e:
        raise ValueError(str(e).replace("model.", f"{key}.", 1) if key != "model" else str(e)) from None
    def where(layer_key: str) -> str:  # the key a value came from: the kind's own, or the model-level one
        return f"{key}.{layer_key}" if layer_key in body else f"model.{layer_key}"

    window = body.get("window", config.window)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"{where('window')}: expected a positive number of keys or null (global), got {window!r}")
    if window is not None and not config.causal:
        raise ValueError(f"{where('window')}: a sliding window needs a causal model (model.causal: true)")
    if window is not None and draws_positions(pe, config):
        raise ValueError(f"{where('window')}: pe {pe!r} trains on random positions, which a window (counted in "
                         "positions) would not match at evaluation; use it without a window")
    temperature = check_temperature(body.get("temperature", config.temperature), where("temperature"))
    scale = body.get("length_scale", config.length_scale)
    own_args = body.get("length_scale_args", {})
    scale_args = {**config.length_scale_args, **own_args} if scale == config.length_scale else own_args
    scale_key = f"{key}.length_scale" if {"length_scale", "length_scale_args"} & set(body) else "model.length_scale"
    scale_args = check_length_scale(scale, scale_args, config.max_seq_len, scale_key)
    sinks = check_sinks(body.get("sinks", config.sinks), where("sinks"))
    options = pe_class(pe, config).attention_options
    names = {"window": "sliding window", "temperature": "temperature", "sinks": "attention sinks"}
    for option, value, default in (("window", window, None), ("temperature", temperature, 1.0),
                                   ("sinks", sinks, False)):
        if value != default and option not in options:
            raise ValueError(f"{where(option)}: pe {pe!r} computes attention itself and does not implement "
                             f"{'a ' if option != 'sinks' else ''}{names[option]}")
    return LayerSpec(pe=pe, pe_args=pe_args, window=window, temperature=temperature, length_scale=scale,
                     length_scale_args=scale_args, kind=name, sinks=sinks)


def record_resolved_args(config, specs: list[LayerSpec]) -> None:
    """Write into `config` the pe_args its PEs resolved from it (`PositionalEncoding.resolved_args`: CoPE's npos_max)
    that it does not hold yet, so that a later version's default cannot change what a saved model means: into
    model.pe_args for the model's own PE (every kind that keeps that PE merges them), else into the layer's kind
    (a layer named after a PE gets a kind of that name). New dicts, never the caller's."""
    from tapecli.model.pe import build_pe
    from tapecli.model.pe.base import PositionalEncoding

    for spec in {spec.kind: spec for spec in specs}.values():
        if pe_class(spec.pe, config).resolved_args is PositionalEncoding.resolved_args:
            continue  # resolves nothing: no need to build it
        resolved = build_pe(config, spec.pe, spec.pe_args).resolved_args()
        recorded = {key: value for key, value in resolved.items() if key not in spec.pe_args}
        if not recorded:
            continue
        if spec.pe == config.pe:
            config.pe_args = {**config.pe_args, **recorded}
            continue
        kinds = config.schedule.get("kinds", {})
        body = kinds.get(spec.kind, {"pe": spec.pe})
        body = {**body, "pe_args": {**body.get("pe_args", {}), **recorded}}
        config.schedule = {**config.schedule, "kinds": {**kinds, spec.kind: body}}


def check_shared_pes(specs: list[LayerSpec], config) -> None:
    """A PE that draws its own positions (RandPE while training) would give the layers of other PEs no positions
    to agree on: it may be a model's only PE, not one of several."""
    if len({spec.pe_key for spec in specs}) < 2:
        return
    for spec in specs:
        if draws_positions(spec.pe, config):
            raise ValueError(f"model.schedule: pe {spec.pe!r} draws its own positions while training, so it cannot "
                             "share a model with other PEs (or other pe_args); use it for every layer")


def pe_class(pe: str, config=None) -> type:
    """The class of PE `pe` (a built-in or plugin; for the model's own `pe`, as its config recorded it)."""
    from tapecli.model.pe import resolve_pe

    recorded = config.pe_plugin if config is not None and pe == config.pe else None
    return resolve_pe(pe, recorded).cls


def draws_positions(pe: str, config=None) -> bool:
    """Whether PE `pe` chooses its own positions (RandPE while training) instead of the model's."""
    from tapecli.model.pe.base import PositionalEncoding

    return pe_class(pe, config).positions is not PositionalEncoding.positions


def is_uniform(specs: list[LayerSpec]) -> bool:
    """Every layer the same, global, at temperature 1 and without length scale: what a model without these keys
    is (and what checkpoints of tape 0.1 hold)."""
    first = specs[0]
    return all(spec.pe_key == first.pe_key for spec in specs) and all(
        spec.window is None and spec.temperature == 1.0 and spec.length_scale == "none" and not spec.sinks
        for spec in specs)


def describe(specs: list[LayerSpec]) -> str:
    """A short label: each distinct layer with its count, in order of first appearance, e.g.
    "rope x3 (window 1024) + nope x1 (llama4 scale)"; just "rope" for a plain model."""
    counts: dict[tuple[str, str], int] = {}
    for spec in specs:
        extras = [f"window {spec.window}"] if spec.window is not None else []
        extras += [f"T {spec.temperature:g}"] if spec.temperature != 1.0 else []
        extras += [f"{spec.length_scale} scale"] if spec.length_scale != "none" else []
        extras += ["sinks"] if spec.sinks else []
        label = (spec.pe, f" ({', '.join(extras)})" if extras else "")
        counts[label] = counts.get(label, 0) + 1
    if len(counts) == 1:
        return "".join(next(iter(counts)))
    return " + ".join(f"{pe} x{count}{extras}" for (pe, extras), count in counts.items())
