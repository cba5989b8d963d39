"""The shape of a contextual PE's picture: what it computes in place of positions, as curves per layer.

A picture is gathered during the same probed forward pass as the attention statistics (`tape analyze attention`):

    picture = Kind(model, seq_len)                 # Kind = PICTURES[pe] (pictures/__init__.py)
    handles = picture.attach(model)                # forward hooks it needs (TAPE's state, PaTH's maps); removed after
    picture.observe(layer, chunk)                  # every probed chunk of weights (CoPE's positions ride in extras)
    row = picture.sums()                           # JSON sums of this forward: one samples.jsonl row's "picture"
    numbers = finish(Kind, [row, ...])             # per curve, layer and head: the mean in each bin

Every curve is a mean per bin of x, per layer and head: `Binned` keeps sums [layers, heads, bins] and counts
[layers, bins] in fp64, so sequences add up exactly. x is binned on a log axis: a distance i - j in the bins 0, 1, 2-3,
4-7, ... (`x_kind = "distance"`), or a position as a length n = position + 1 in 1, 2-3, 4-7, ... ("length").
A curve may have a reference (e.g. CoPE's absolute positions): a curve of one layer and one head, drawn dashed.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, ClassVar

import torch
from torch import Tensor

from tapecli.experiments.analyze.stats import bin_count, plain


class Binned:
    """Sums [layers, heads, bins] and counts [layers, bins] of named curves, fp64 on the CPU."""

    def __init__(self, names: list[str], layers: int, heads: int, bins: int) -> None:
        self.sums = {n: torch.zeros(layers, heads, bins, dtype=torch.float64) for n in names}
        self.counts = {n: torch.zeros(layers, bins, dtype=torch.float64) for n in names}

    def add(self, name: str, layer: int, bins: Tensor, values: Tensor) -> None:
        """values [heads, N] falling in bins [N] (long) of layer `layer`."""
        bins = bins.reshape(-1).cpu()
        self.sums[name][layer].index_add_(1, bins, values.reshape(values.shape[0], -1).double().cpu())
        self.counts[name][layer].index_add_(0, bins, torch.ones(bins.shape, dtype=torch.float64))

    def add_totals(self, name: str, layer: int, sums: Tensor, counts: Tensor) -> None:
        """Totals already binned: sums [heads, bins], counts [bins]."""
        self.sums[name][layer] += sums.double().cpu()
        self.counts[name][layer] += counts.double().cpu()

    def to_json(self) -> dict[str, Any]:
        return {n: {"sums": self.sums[n].tolist(), "counts": self.counts[n].tolist()} for n in self.sums}


class Picture(ABC):
    """One contextual PE's picture (module docstring). Subclasses set the class attributes and fill `self.binned`."""

    pe: ClassVar[str]  # the PE it pictures (`model.pe`)
    title: ClassVar[str]
    x_kind: ClassVar[str]  # "distance" (i - j) or "length" (position + 1)
    x_label: ClassVar[str]
    curves: ClassVar[dict[str, str]]  # curve name -> what its y axis shows
    references: ClassVar[dict[str, str]] = {}  # curve name -> the name of its reference curve (also in `curves`)

    def __init__(self, model: Any, seq_len: int) -> None:
        self.model, self.seq_len = model, seq_len
        self.binned = Binned(list(self.curves), self.layer_count(model), self.head_count(model), self.bins(seq_len))

    @classmethod
    def layer_count(cls, model: Any) -> int:
        return len(model.model.layers)

    @classmethod
    def head_count(cls, model: Any) -> int:
        return model.config.n_heads

    @classmethod
    def layer_names(cls, model: Any) -> list[str]:
        """How the plot names row k of every curve."""
        return [f"layer {k}" for k in range(cls.layer_count(model))]

    @classmethod
    def bins(cls, seq_len: int) -> int:
        return bin_count(seq_len) if cls.x_kind == "distance" else bin_count(seq_len + 1) - 1

    def attach(self, model: Any) -> list[Any]:
        """Forward hooks this picture needs (removed by the caller after the forward); none by default."""
        return []

    def observe(self, layer: int, chunk: Any) -> None:
        """One chunk of probed weights of layer `layer`; nothing by default."""
        return None

    def sums(self) -> dict[str, Any]:
        return self.binned.to_json()


def finish(kind: type[Picture], model: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The picture's numbers from the sums of several forwards: per curve, [layer][head][bin] means (None: empty)."""
    curves = {}
    for name, label in kind.curves.items():
        sums = sum(torch.tensor(r[name]["sums"], dtype=torch.float64) for r in rows)
        counts = sum(torch.tensor(r[name]["counts"], dtype=torch.float64) for r in rows)
        curves[name] = {"label": label, "values": plain(sums / counts[:, None, :])}
    return {"pe": kind.pe, "title": kind.title, "x_kind": kind.x_kind, "x_label": kind.x_label,
            "layers": kind.layer_names(model), "references": dict(kind.references), "curves": curves}
