"""A lower bound on the training step of the PEs that miss their time goal on the CPU: the least work their design
adds per (query, key) pair to RoPE's attention, each piece timed in isolation on one layer's pairs, next to RoPE's
own fused attention and RoPE's whole training step (docs/speed.md, "Goals at 4K on one thread").

    OMP_NUM_THREADS=1 python scripts/pe_floors.py [--seq-len 4096] [--repeats 3] [--window W]

The bench model's layer: batch 1, 4 heads of 64, T tokens, causal: P = 4 T (T + 1) / 2 visible pairs. Each piece
is one torch op over P elements in rows of keys (forward only: the backward needs at least as much again, left
out, so the bound stays a bound), the median of --repeats of this process's CPU time (one thread: on a shared
machine, wall time also counts the others), all in this process:

  rope   SDPA's fused causal kernel, forward + backward: the reference
  tape   the same kernel over [V | E]: values twice as wide, queries and keys zero-padded to that width (the fused
         CPU kernel wants equal widths; SDPA's math path takes unequal ones but materialises every score)
  fire   RoPE's attention, plus per pair: the value of the MLP's piecewise-linear line at the pair's normalised
         distance (one multiply-add; the segments are found per row of keys, not per pair) and one exp (the learned
         bias needs its score gradient dS = P (dP - rowsum(dO O)), so P is formed once more in the backward)
  cope   RoPE's attention, plus per pair: the gate sigmoid(q.k), the running sum of the gates (cumsum) and one exp
         (the softmax over logits that are not q.k plus a fixed bias, so materialised)

The lower bound of a PE's step, as a ratio to RoPE's: (RoPE step + layers x (PE pieces - RoPE attention)) / RoPE
step, RoPE's step measured here too (the bench model: 2 layers x 256; TAPE's second layer is plain attention).

With --window W, also the least work of a sliding window of W keys (every layer): the fused kernel over exactly the
pairs a window leaves visible, W (T - W) + W (W + 1) / 2 per head: T / W - 1 blocks of W queries over W keys with no
mask, and one causal block of W (forward + backward), in place of RoPE's causal attention over T. What the window
does not shorten (embedding, projections, MLPs, output layer over T tokens) stays as RoPE's step has it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def timed(fn, repeats: int) -> float:
    """Median CPU time of this process (one thread): what the op itself used, whatever else shares the machine."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=None, help="also bound a sliding window of this many keys")
    args = parser.parse_args()
    torch.manual_seed(0)
    T, H, d = args.seq_len, 4, 64
    P = H * T * (T + 1) // 2
    q, k, v = (torch.randn(1, H, T, d, requires_grad=True) for _ in range(3))
    wide = torch.randn(1, H, T, 2 * d, requires_grad=True)
    pad = lambda t: torch.nn.functional.pad(t, (0, d))  # noqa: E731

    def attention(q, k, v, **kw):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, **kw).sum().backward()

    rows = P // T  # the pairs as [rows, T]: a row of keys per query, as the chunked paths hold them
    distance = torch.linspace(0, 1, T).expand(rows, T).contiguous()  # sorted along each row, like FIRE's inputs
    slope, intercept = torch.randn(rows, 1), torch.randn(rows, 1)
    scores = torch.randn(rows, T)
    pieces = {
        "rope: attention (SDPA, fwd + bwd)": lambda: attention(q, k, v),
        "tape: attention over [V | E] (padded, fwd + bwd)": lambda: attention(pad(q), pad(k), wide, scale=d ** -0.5),
        "fire: a line's multiply-add per pair": lambda: torch.addcmul(intercept, slope, distance),
        "fire, cope: exp per pair": lambda: torch.exp(scores),
        "cope: sigmoid per pair": lambda: torch.sigmoid(scores),
        "cope: cumsum along the keys": lambda: torch.cumsum(scores, -1),
    }
    from tapecli.experiments.bench_step import make_variant, train_step

    spec = {"pe": "rope", "pe_args": {}, "n_layers": 2, "dim": 256, "n_heads": 4, "seq_len": T, "batch_size": 1,
            "precision": "fp32", "compile": False, "device": "cpu"}
    model, batch, dev = make_variant(spec)
    train_step(model, batch, "fp32", dev)

    def rope_step():
        train_step(model, batch, "fp32", dev)
        model.zero_grad(set_to_none=True)

    W = args.window
    if W is not None:
        if not 0 < W < T or T % W:
            parser.error(f"--window: must divide --seq-len {T} and be smaller, got {W}")
        blocks = [torch.randn(T // W - 1, H, W, d, requires_grad=True) for _ in range(3)]
        last = [torch.randn(1, H, W, d, requires_grad=True) for _ in range(3)]

        def windowed():
            torch.nn.functional.scaled_dot_product_attention(*blocks).sum().backward()
            attention(*last)

        pieces[f"window {W}: attention over the visible pairs (fwd + bwd)"] = windowed
    results = {name: timed(fn, args.repeats) for name, fn in pieces.items()}
    step = timed(rope_step, args.repeats)
    print(f"T = {T}, {P:,} pairs per layer, {torch.get_num_threads()} thread(s), torch {torch.__version__}; "
          f"CPU time, median of {args.repeats}")
    for name, seconds in results.items():
        print(f"  {name:<58} {1000 * seconds:9.1f} ms")
    print(f"  {'rope: the whole bench step (2 layers)':<58} {1000 * step:9.1f} ms")
    rope = results["rope: attention (SDPA, fwd + bwd)"]
    bounds = {"tape": (results["tape: attention over [V | E] (padded, fwd + bwd)"], 1),
              "fire": (rope + sum(v for n, v in results.items() if n.startswith("fire")), 2),
              "cope": (rope + sum(v for n, v in results.items() if "cope" in n), 2)}
    if W is not None:
        bounds[f"window {W}"] = (results[f"window {W}: attention over the visible pairs (fwd + bwd)"], 2)
    for pe, (seconds, layers) in bounds.items():
        print(f"lower bound of a {pe} step / rope's: {(step + layers * (seconds - rope)) / step:.2f}")


if __name__ == "__main__":
    main()
