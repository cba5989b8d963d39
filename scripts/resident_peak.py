"""Peak resident memory of one forward of a one-layer tape model (dim 256, 4 heads, vocabulary 256), gradients
recorded or not: what a plain process holds, glibc's heap included (`tape bench --memory` measures in a child
started with MALLOC_MMAP_THRESHOLD_=65536, which returns freed memory at once).

    python scripts/resident_peak.py SEQ_LEN PE [grad|nograd]
    MALLOC_MMAP_THRESHOLD_=65536 python scripts/resident_peak.py 8192 grape-ap grad
"""

from __future__ import annotations

import argparse
import resource

import torch

from tapecli.model.config import ModelConfig
from tapecli.model.transformer import Transformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seq_len", type=int)
    parser.add_argument("pe")
    parser.add_argument("grad", choices=("grad", "nograd"), nargs="?", default="grad")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = Transformer(ModelConfig(vocab_size=256, n_layers=1, dim=256, n_heads=4, max_seq_len=args.seq_len,
                                    pe=args.pe))
    tokens = torch.randint(0, 256, (1, args.seq_len))
    with torch.set_grad_enabled(args.grad == "grad"):
        model(tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    print(f"{args.pe} {args.seq_len} {args.grad}: peak resident {peak:.2f} GB")


if __name__ == "__main__":
    main()
