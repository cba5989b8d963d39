"""The one place the files of a Hugging Face model directory are read; each fault is one line naming the file.

    read_json_object(path) -> dict            config.json, model.safetensors.index.json, tokenizer_config.json
    weight_files(directory) -> list[Path]     the shards the index lists (each present), else *.safetensors
    read_weights(files, dtype, device, skip)  (name, tensor, file), one tensor at a time, cast to `dtype`
    fingerprint(directory) -> dict            what identifies the weights, cheaply (a frozen base is checked by it)

Every fault in a file raises `TapeError("<file> ...")` (exit code 2): not JSON, not safetensors, truncated or empty
(through `tapecli.faults.reading`), a JSON list where an object belongs, an index that names no or absent shards, a
weight stored as integers. OS errors (permission denied) pass through to the CLI's boundary, which names their file.
What the contents *mean* (architecture, shapes against config.json, missing tensors) is `tapecli.model.hf.load`'s check.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError
from tapecli.faults import reading

if TYPE_CHECKING:
    import torch

INDEX = "model.safetensors.index.json"
WEIGHTS = "model.safetensors"
SAMPLES, SAMPLE_BYTES = 16, 4096  # bytes of tensor data a fingerprint reads per weight file
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; a file that is not a JSON object (corrupt, truncated, a list) is a TapeError."""
    with reading(path):
        data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise TapeError(f"{path} is not a JSON object ({{...}}) but a JSON {type(data).__name__}")
    return data


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a HF directory: the shards its index lists (all must exist), else *.safetensors."""
    index = directory / INDEX
    if not index.is_file():
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise TapeError(f"{directory} has no {WEIGHTS} (nor {INDEX} listing its shards)")
        return files
    weight_map = read_json_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(shard, str) for shard in weight_map.values()):
        raise TapeError(f"{index} has no weight_map of tensor names to shard files")
    shards = sorted(set(weight_map.values()))
    missing = [shard for shard in shards if not (directory / shard).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise TapeError(f"{index} lists the shard {missing[0]}{more}, which is not in {directory}; download the "
                        "missing shards again")
    return [directory / shard for shard in shards]


def fingerprint(directory: Path) -> dict[str, Any]:
    """What identifies a Hugging Face directory's weights, read in milliseconds whatever their size:
    {"revision": the hub commit when `directory` is a hub cache snapshot (.../snapshots/<commit>), else None,
     "files": {name: {"bytes": size, "sha256": of its safetensors header (every tensor's name, dtype, shape and
               offsets) and of SAMPLES x SAMPLE_BYTES bytes of tensor data spread evenly over the file}},
     "sha256": of all that, for messages}.
    Another model, revision, seed or fine-tune changes the sampled bytes; a change confined to bytes between the
    samples (a few weights edited by hand) is not seen."""
    files = {}
    for path in weight_files(directory):
        with reading(path), path.open("rb") as f:
            size = path.stat().st_size
            length = int.from_bytes(f.read(8), "little")
            if not 0 < length <= size - 8:
                raise ValueError(f"header length {length} does not fit the file")
            digest = hashlib.sha256(f.read(length))
            start = 8 + length
            span = max(0, size - start - SAMPLE_BYTES)
            for i in range(SAMPLES):
                f.seek(start + span * i // (SAMPLES - 1))
                digest.update(f.read(SAMPLE_BYTES))
        files[path.name] = {"bytes": size, "sha256": digest.hexdigest()}
    revision = directory.name if directory.parent.name == "snapshots" and _COMMIT.match(directory.name) else None
    whole = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"revision": revision, "files": files, "sha256": whole}


def read_weights(files: list[Path], dtype: torch.dtype, device: torch.device | str,
                 skip: set[str] = frozenset()) -> Iterator[tuple[str, torch.Tensor, Path]]:
    """Yield (name, tensor, file) one tensor at a time, cast to `dtype` on `device`. A tensor that is not floating
    point (an integer dtype: quantised or damaged) is a TapeError naming it: Llama weights are floats."""
    from safetensors import safe_open

    for file in files:
        with reading(file):  # a garbage, empty or truncated file fails here, on its header
            handle = safe_open(str(file), framework="pt", device="cpu")
            names = list(handle.keys())
        for name in names:
            if name in skip or name.endswith("rotary_emb.inv_freq"):
                continue
            with reading(file):
                tensor = handle.get_tensor(name)
            if not tensor.is_floating_point():
                raise TapeError(f"{file}: {name} is stored as {str(tensor.dtype).removeprefix('torch.')}; "
                                "tape imports floating-point weights only (no quantised checkpoints)")
            yield name, tensor.to(device=device, dtype=dtype), file
