"""A measured floor for the PEs whose training step misses its goal on the CPU: the work their design needs per
(query, key) pair beyond RoPE's attention, each piece timed in isolation on one layer's pairs, next to RoPE's own
fused attention and RoPE's whole training step (docs/speed.md, "Where the goals are not met: measured floors").

    OMP_NUM_THREADS=1 python scripts/pe_floors.py [--seq-len 4096] [--repeats 3]

The bench model's layer: batch 1, 4 heads of 64, T tokens, causal: P = 4 T (T + 1) / 2 visible pairs. Each piece is
one torch op over P elements (or the matmuls it names), forward and backward where the design needs both, the
median of --repeats of this process's CPU time (one thread: on a shared machine, wall time measures the others
too), all in this process. What each PE needs at least (its own path may do more):

  rope   SDPA's fused causal kernel, forward + backward (the reference every ratio divides by)
  tape   the same kernel over [V | E]: values twice as wide, queries and keys zero-padded to that width (the fused
         CPU kernel wants equal widths; SDPA's math path takes unequal ones but materialises every score)
  fire   a learned bias of the pair's normalised distance (a piecewise-linear MLP: the segment of each pair
         (searchsorted), its slope and intercept (one row lookup), a multiply-add) and, because the bias is learned,
         dS = P (dP - rowsum(dO O)) materialised in the backward (P recomputed: one exp per pair, two matmuls), then
         the bias's gradient summed per segment (scatter_add)
  cope   per pair: a gate sigmoid(q.k), the running sum of the gates (cumsum), floor and interpolation weight, two
         lookups of q.e[n] and a multiply-add; the softmax over materialised logits (exp); backward: the sigmoid's
         and the cumsum's (a reverse cumsum), two scatter_adds (the lookups' gradient), the softmax's
Floor of a PE's step, as a ratio to RoPE's: (RoPE step + layers x (PE pieces - RoPE attention)) / RoPE step, with
RoPE's step measured here too (the bench model: 2 layers x 256, the second TAPE layer plain attention).
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
    args = parser.parse_args()
    torch.manual_seed(0)
    T, H, d = args.seq_len, 4, 64
    P = H * T * (T + 1) // 2
    q, k, v = (torch.randn(1, H, T, d, requires_grad=True) for _ in range(3))
    wide = torch.randn(1, H, T, 2 * d, requires_grad=True)
    pad = lambda t: torch.nn.functional.pad(t, (0, d))  # noqa: E731

    def attention(q, k, v, **kw):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, **kw).sum().backward()

    x = torch.rand(P)  # a pair's input (FIRE: normalised distance; CoPE: a logit), one flat tensor of P
    g = torch.rand(P)
    breaks = torch.linspace(0, 1, 33)
    lines = torch.randn(33, 2)
    rows_c = 64  # CoPE's pairs as rows of keys: [P / T, T] so the running sum runs along the keys
    logits = torch.randn(P // T, T, requires_grad=True)
    table = torch.randn(P // T, rows_c + 1, requires_grad=True)
    pieces = {
        "rope attention (SDPA, fwd + bwd)": lambda: attention(q, k, v),
        "tape attention over [V | E] (padded, fwd + bwd)": lambda: attention(pad(q), pad(k), wide, scale=d ** -0.5),
        "fire: searchsorted": lambda: torch.searchsorted(breaks, x),
        "fire: row lookup (embedding)": lambda: torch.nn.functional.embedding(
            (x * 32).long(), lines),
        "fire: multiply-add": lambda: torch.addcmul(g, x, g),
        "fire/cope: exp per pair (P recomputed)": lambda: torch.exp(x),
        "fire: scatter_add per segment": lambda: torch.zeros(33).scatter_add_(0, (x * 32).long(), g),
        "cope: sigmoid + cumsum + floor (fwd + bwd)": lambda: cope_gates(logits),
        "cope: two lookups + multiply-add (fwd + bwd)": lambda: cope_lookups(logits, table, rows_c),
        "cope: softmax over materialised logits (fwd + bwd)": lambda: logits.softmax(-1).sum().backward(),
    }
    from tapecli.experiments.bench_step import make_variant, train_step

    spec = {"pe": "rope", "pe_args": {}, "n_layers": 2, "dim": 256, "n_heads": 4, "seq_len": T, "batch_size": 1,
            "precision": "fp32", "compile": False, "device": "cpu"}
    model, batch, dev = make_variant(spec)
    train_step(model, batch, "fp32", dev)

    def rope_step():
        train_step(model, batch, "fp32", dev)
        model.zero_grad(set_to_none=True)

    results = {name: timed(fn, args.repeats) for name, fn in pieces.items()}
    step = timed(rope_step, args.repeats)
    print(f"T = {T}, {P:,} pairs per layer, {torch.get_num_threads()} thread(s), torch {torch.__version__}; "
          f"CPU time, median of {args.repeats}")
    for name, seconds in results.items():
        print(f"  {name:<52} {1000 * seconds:9.1f} ms")
    print(f"  {'rope: the whole bench step (2 layers)':<52} {1000 * step:9.1f} ms")
    rope = results["rope attention (SDPA, fwd + bwd)"]
    fire = sum(results[n] for n in results if n.startswith("fire")) + rope
    exp = results["fire/cope: exp per pair (P recomputed)"]
    cope = sum(results[n] for n in results if n.startswith("cope")) + exp + rope
    tape = results["tape attention over [V | E] (padded, fwd + bwd)"]
    for pe, seconds, layers in (("tape", tape, 1), ("fire", fire, 2), ("cope", cope, 2)):
        print(f"floor of a {pe} step / rope's: {(step + layers * (seconds - rope)) / step:.2f}")


def cope_gates(logits: torch.Tensor) -> None:
    gates = torch.sigmoid(logits)
    positions = gates.cumsum(-1)
    weight = positions - positions.detach().floor()
    weight.sum().backward()


def cope_lookups(logits: torch.Tensor, table: torch.Tensor, n: int) -> None:
    with torch.no_grad():
        index = (logits.detach().abs() * 8).long().clamp(max=n - 1)
    weight = torch.sigmoid(logits)
    out = torch.addcmul(table.gather(-1, index), weight, table.gather(-1, index + 1))
    out.sum().backward()


if __name__ == "__main__":
    main()
