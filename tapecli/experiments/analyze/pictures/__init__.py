"""Pictures of what contextual PEs compute in place of positions, one file per PE, registered here by PE name.

`PICTURES[pe]` is the `Picture` subclass `tape analyze attention` draws for models with that PE (pictures/base.py
holds the contract); a PE without an entry gets none. Adding one (e.g. FoX's forget-gate decay against the
distance) is a new file with a `Picture` subclass and one entry below.
"""

from __future__ import annotations

from tapecli.experiments.analyze.pictures.base import Picture, finish
from tapecli.experiments.analyze.pictures.cope import CoPEPicture
from tapecli.experiments.analyze.pictures.path import PaTHPicture
from tapecli.experiments.analyze.pictures.tape import TAPEPicture

PICTURES: dict[str, type[Picture]] = {kind.pe: kind for kind in (CoPEPicture, TAPEPicture, PaTHPicture)}

__all__ = ["PICTURES", "Picture", "finish"]
