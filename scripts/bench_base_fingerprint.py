"""How long checking an extension run's base takes (`tapecli.model.hf.files.fingerprint`, docs/context-extension.md),
read from the disk (each weight file's pages dropped from the page cache first) and from memory.

    python scripts/bench_base_fingerprint.py HF_DIR [HF_DIR ...]      # Hugging Face model directories
    python scripts/bench_base_fingerprint.py --make-7b DIR            # writes DIR laid out as Llama-2-7B's (two
                                                                      # safetensors shards, 13.5 GB) once, times it
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tapecli.model.hf.files import fingerprint  # noqa: E402

LAYERS, DIM, FFN, VOCAB = 32, 4096, 11008, 32000  # Llama-2-7B


def tensors() -> list[tuple[str, tuple[int, ...]]]:
    names = [("model.embed_tokens.weight", (VOCAB, DIM))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        names += [(p + f"self_attn.{x}_proj.weight", (DIM, DIM)) for x in "qkvo"]
        names += [(p + "mlp.gate_proj.weight", (FFN, DIM)), (p + "mlp.up_proj.weight", (FFN, DIM)),
                  (p + "mlp.down_proj.weight", (DIM, FFN)), (p + "input_layernorm.weight", (DIM,)),
                  (p + "post_attention_layernorm.weight", (DIM,))]
    return names + [("model.norm.weight", (DIM,)), ("lm_head.weight", (VOCAB, DIM))]


def write_shard(path: Path, entries: list[tuple[str, tuple[int, ...]]]) -> None:
    header, offset = {}, 0
    for name, shape in entries:
        size = 2 * int(__import__("math").prod(shape))
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    chunk = os.urandom(1 << 24)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        left = offset
        while left:
            f.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
        f.flush()
        os.fsync(f.fileno())


def make(directory: Path) -> None:
    if (directory / "model.safetensors.index.json").is_file():
        return
    directory.mkdir(parents=True, exist_ok=True)
    entries = tensors()
    cut = next(i for i in range(len(entries)) if entries[i][0].startswith("model.layers.24."))
    shards = {"model-00001-of-00002.safetensors": entries[:cut], "model-00002-of-00002.safetensors": entries[cut:]}
    for name, part in shards.items():
        write_shard(directory / name, part)
    weight_map = {tensor: name for name, part in shards.items() for tensor, _ in part}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def drop_cache(directory: Path) -> None:
    for path in directory.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def timed(directory: Path, cold: bool) -> float:
    if cold:
        drop_cache(directory)
    started = time.perf_counter()
    fingerprint(directory)
    return time.perf_counter() - started


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--make-7b"]:
        make(Path(args[1]))
        args = args[1:]
    for directory in map(Path, args):
        size = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
        cold = sorted(timed(directory, True) for _ in range(5))
        warm = sorted(timed(directory, False) for _ in range(5))
        print(f"{directory}: {size / 1e6:,.1f} MB in {len(list(directory.glob('*.safetensors')))} files; "
              f"from disk {cold[2] * 1000:.1f} ms, from memory {warm[2] * 1000:.1f} ms (median of 5)")


if __name__ == "__main__":
    main()
