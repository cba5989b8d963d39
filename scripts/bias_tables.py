"""Whether a distance table's values change what the chunked path costs: one layer's chunked attention at T tokens
(forward + backward, batch 1, 4 heads of 64, causal), its bias a table of ALiBi's slopes times the distance, a table
of zeros, or a small clamped table like T5's buckets, with 1 and 2 threads, with and without flushing denormal
floats to zero (docs/speed.md, "The ALiBi anomaly").

    python scripts/bias_tables.py [--seq-len 4096] [--threads 1,2]

Each line: the wall time and this process's CPU time of the second of two runs (the first warms up).
OpenMP waits passively (OMP_WAIT_POLICY=PASSIVE, as tape sets it), so waiting threads cost no CPU time.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from tapecli.model.attention import chunked  # noqa: E402
from tapecli.model.attention.needs import ScoreBias  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args()
    torch.manual_seed(0)
    T, H, d = args.seq_len, 4, 64
    q, k, v = (torch.randn(1, H, T, d, requires_grad=True) for _ in range(3))
    positions = torch.arange(T)[None]
    slopes = torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)])
    tables = {"alibi": -slopes[:, None] * torch.arange(T)[None].float(), "zeros": torch.zeros(H, T),
              "t5-like": torch.randn(H, 32).clamp(-3, 3)}

    def run(table: torch.Tensor) -> None:
        bias = ScoreBias(pairs=lambda q_pos, k_pos: None, table=lambda n: table[:, :n])
        chunked.chunked_attention(q, k, v, bias, positions, positions, None, d ** -0.5).sum().backward()

    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            for name, table in tables.items():
                run(table)
                wall, cpu = time.perf_counter(), time.process_time()
                run(table)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                print(f"threads {threads}  flush denormals {flush!s:5}  {name:8}  wall {wall:6.2f} s  CPU {cpu:6.2f} s",
                      flush=True)


if __name__ == "__main__":
    main()
