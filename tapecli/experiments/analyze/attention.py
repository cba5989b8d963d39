"""`tape analyze attention`: what every head of every layer attends to, at any length, for every PE.

Each model reads the same --samples sequences of --seq-len tokens (`sequences.DataSource`), one forward pass per
sequence with attention probed (`tapecli.model.attention.probe`): every layer's exact attention weights reach a
`Recorder` one chunk of queries at a time, whatever path the PE takes (the probe path for plain, bias and TAPE
attention, FoX's widened heads and MapWM's rotated ones, a sliding-window layer's band; CoPE's and PaTH's own chunked
paths), so no [T, T] map is ever held for a long sequence. A model with a layer that does not report its weights
(stick-breaking, a plugin's `OwnAttention` without `reports_weights`) is refused in one line before any model is
opened (`check_probing`). From them:

- the statistics of `stats.py` per layer and head (distance histogram, mean distance, entropy and its growth with
  the context, mass on the first --sink tokens, mass within the last --window tokens), summed over sequences;
- for a contextual PE, its picture (`pictures/`: CoPE's contextual positions, TAPE's positional state, PaTH's
  accumulated maps), from the same forward;
- when --seq-len is at most --maps-max, the attention maps of the first sequence themselves (every layer and head).

`AttentionAnalysis` is an evaluation protocol (`tapecli.eval.protocol`): a unit is a sequence, the models share one
folder (--out): settings.json, samples.jsonl (per sequence and model: the sums; the resume log), results.json (per
model: the statistics, the picture, the maps) and the PNGs of `plots.py`: heatmaps.png (layer x head, one row per
model, one column per statistic), distance.png, entropy.png, and per model maps-<model>.png and pe-<model>.png.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import TapeError
from tapecli.eval.protocol import Candidate, Evaluation, Opening, source_of
from tapecli.experiments.analyze.pictures import PICTURES, Picture, finish
from tapecli.experiments.analyze.sequences import DataSource, OverSequences, Sequence
from tapecli.experiments.analyze.stats import AttentionStats, bin_labels, merge
from tapecli.experiments.analyze.stats import finish as finish_stats
from tapecli.store.door import OpenedModel

HEATMAP_FILE = "heatmaps.png"
MAP_DIGITS = 4  # the maps in results.json are rounded to this many decimals


class Recorder:
    """Everything one probed forward of one sequence adds up: the statistics, the picture, the maps."""

    def __init__(self, model: Any, seq_len: int, sink: int, window: int, maps: bool) -> None:
        import torch

        config = model.config
        self.layer = 0
        self.stats = AttentionStats(len(model.model.layers), config.n_heads, seq_len, sink, window)
        kind = PICTURES.get(config.pe)
        self.picture: Picture | None = kind(model, seq_len) if kind else None
        self.maps = (torch.zeros(len(model.model.layers), config.n_heads, seq_len, seq_len, dtype=torch.float64)
                     if maps else None)

    def observe(self, chunk: Any) -> None:
        """One chunk of probed weights of the current layer (`probe.WeightsChunk`)."""
        self.stats.observe(self.layer, chunk)
        if self.picture is not None:
            self.picture.observe(self.layer, chunk)
        if self.maps is not None:
            C, K = chunk.weights.shape[-2:]
            self.maps[self.layer, :, chunk.first : chunk.first + C, :K] = chunk.weights[0].double().cpu()

    @contextlib.contextmanager
    def attached(self, model: Any) -> Iterator[None]:
        """Probe attention, and know which layer each chunk comes from (a pre-hook per block)."""
        from tapecli.model.attention import probe

        def enter(layer: int):
            def hook(module, args):
                self.layer = layer
            return hook

        handles = [block.register_forward_pre_hook(enter(k)) for k, block in enumerate(model.model.layers)]
        if self.picture is not None:
            handles += self.picture.attach(model)
        try:
            with probe.probing(self.observe):
                yield
        finally:
            for handle in handles:
                handle.remove()

    def row(self) -> dict[str, Any]:
        return {"stats": self.stats.sums(),
                **({"picture": self.picture.sums()} if self.picture is not None else {}),
                **({"maps": self.maps.round(decimals=MAP_DIGITS).tolist()} if self.maps is not None else {})}


def record(model: Any, ids: Any, seq_len: int, sink: int, window: int, maps: bool, name: str = "") -> dict[str, Any]:
    """One probed forward of ids [T] (no gradients): the row of `Recorder`; a layer that cannot report its weights
    is a TapeError naming model `name` and the layer (`refusal`)."""
    import torch

    from tapecli.model.attention.probe import NotReported

    recorder = Recorder(model, seq_len, sink, window, maps)
    device = next(model.parameters()).device
    try:
        with recorder.attached(model), torch.inference_mode():
            model.run(ids[None].to(device))
    except NotReported:
        raise refusal(name, model.config, recorder.layer) from None
    return recorder.row()


def refusal(model: str, config: Any, layer: int) -> TapeError:
    """The one line for a model whose layer `layer` computes its own attention without reporting its weights."""
    spec = config.layers()[layer]
    return TapeError(f"--model {model}: layer {layer}'s PE {spec.pe!r} computes its own attention and does not "
                     "report its weights, so `tape analyze attention` cannot probe it; analyze it with `tape analyze "
                     "position-loss`, or (a plugin) set OwnAttention(reports_weights=True) and call "
                     "tapecli.pe.report_weights from its attention")


def check_probing(model: str, config: Any) -> None:
    """Refuse in one line (`refusal`), before any model is opened, a model with a layer that cannot report its
    attention weights: a miniature of it (the same PEs, layer schedule, windows and head width; one head, a narrow
    residual stream, random weights: a few MB on the CPU) runs a probed forward of 2 tokens. A configuration the
    miniature cannot mirror (a PE that needs its real shapes) is left to the real forward, which refuses the same
    way (`record`)."""
    import torch

    from tapecli.model import ModelConfig, Transformer

    data = config.to_dict()
    small = {"n_heads": 1, "n_kv_heads": 1, "head_dim": config.head_dim, "dim": config.head_dim, "ffn_dim": 8}
    if not data.get("abacus"):
        small["vocab_size"] = min(config.vocab_size, 16)
    try:
        with torch.device("cpu"):
            mini = Transformer(ModelConfig.from_dict({**data, **small})).eval()
    except Exception:  # noqa: BLE001 - a PE that wants the real shapes: the real forward decides
        return
    try:
        record(mini, torch.zeros(2, dtype=torch.long), 2, sink=1, window=1, maps=False, name=model)
    except TapeError:
        raise  # `refusal`
    except Exception:  # noqa: BLE001 - the miniature does not mirror this model: the real forward decides
        return


@dataclass
class AttentionAnalysis(OverSequences, Evaluation):
    """Attention statistics, pictures and maps of several models on the same sequences (module docstring)."""

    name = "attention"
    unit = "sequences"
    plot_file = HEATMAP_FILE
    files = ("distance.png", "entropy.png", "maps-<model>.png", "pe-<model>.png")
    together = True
    source: DataSource
    sink: int = 1
    window: int = 16
    maps_max: int = 64
    sequences: list[Sequence] = field(default_factory=list, init=False, repr=False)
    length: int = field(default=0, init=False, repr=False)

    def check(self, models: list[str]) -> None:
        self.source.check(models)
        for option, value in (("--sink", self.sink), ("--window", self.window)):
            if value < 1 or value >= self.source.seq_len:
                raise TapeError(f"{option} must be between 1 and --seq-len - 1 ({self.source.seq_len - 1}), "
                                f"got {value}")
        if self.maps_max < 0:
            raise TapeError(f"--maps-max must be 0 (no maps) or more, got {self.maps_max}")

    def check_model(self, model: Candidate, opening: Opening, batch_size: int) -> None:
        check_probing(model.spec, model.config)

    def shared_settings(self, models: list[str | OpenedModel], opening: Opening) -> dict[str, Any]:
        return {"task": "attention", "models": [source_of(m)[1] for m in models], **self.source.describe(),
                "sink": self.sink, "window": self.window, "maps": self.source.seq_len <= self.maps_max,
                "dtype": opening.dtype_name(), "pe_args": opening.pe_args}

    def evaluate(self, opened: OpenedModel, units: list[int]) -> list[dict[str, Any]]:
        T = self.source.seq_len
        return [{"sequence": i, **record(opened.model, self.sequences[i].ids, T, self.sink, self.window,
                                         maps=i == 0 and T <= self.maps_max, name=opened.spec)}
                for i in units]

    def results(self, opened: OpenedModel, settings: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
        stats = finish_stats(merge([r["stats"] for r in rows]))
        kind = PICTURES.get(opened.model.config.pe)
        picture = finish(kind, opened.model, [r["picture"] for r in rows]) if kind else None
        maps = next((r["maps"] for r in rows if "maps" in r), None)
        return {**opened.record(), "training_length": self.length, "sequences": len(rows),
                "distance_bins": bin_labels(self.source.seq_len), "stats": stats, "picture": picture,
                "maps": maps}

    def combine(self, settings: dict[str, Any], entries: list[dict[str, Any]]) -> dict[str, Any]:
        return {"task": "attention", "settings": settings, "models": entries}

    def plot(self, results: dict[str, Any], path: Path, label: str) -> None:
        from tapecli.experiments.analyze import plots

        plots.attention_plots(results, path)

    def summary(self, results: dict[str, dict[str, Any]]) -> Any:
        from tapecli.experiments.analyze.tables import attention_table

        return attention_table(results[self.name])
