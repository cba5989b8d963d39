"""`tape demo --task addition`: a small but real addition length-generalisation experiment, RoPE vs TAPE (plus any
other PEs): a preset of `tape sweep` (tapecli.experiments.sweep).

Every PE gets exactly the same recipe (the shipped `arithmetic` recipe, shrunk to a CPU budget by overrides):
same model size, same data stream, same steps, batch and learning rate. Each model is then evaluated on the
full grid of operand lengths up to twice the training length (`tape eval addition`), and the demo prints the
sweep's table and writes the heat-maps side by side (OUT/heatmaps.png). Re-running the same command reuses
finished runs and evaluation cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PES = ("rope", "tape")


@dataclass(frozen=True)
class DemoBudget:
    """What every PE gets, identically: one model size, one training setting, one evaluation grid."""

    max_digits: int  # training operands have 1..max_digits digits
    eval_len: int  # the grid covers 1..eval_len digits per operand
    samples: int  # problems per grid cell
    steps: int
    batch_size: int
    lr: float
    n_layers: int
    dim: int
    n_heads: int

    def overrides(self, abacus: bool = False) -> list[str]:
        """`key=value` overrides that turn the shipped `arithmetic` recipe into this budget (the sweep adds the PE
        and the seed)."""
        return [
            f"model.abacus={str(abacus).lower()}", f"model.n_layers={self.n_layers}",
            f"model.dim={self.dim}", f"model.n_heads={self.n_heads}", "model.ffn_dim=null",
            f"model.max_seq_len={3 * self.eval_len + 4}",
            f"data.max_digits={self.max_digits}", f"data.seq_len={3 * self.max_digits + 4}",
            f"train.batch_size={self.batch_size}", f"train.micro_batch_size={self.batch_size}",
            f"train.max_steps={self.steps}", f"train.lr={self.lr}", "train.warmup=0.05",
            "train.precision=fp32",  # CPU: bf16 autocast is slow on most CPUs
            f"train.save_every={self.steps}", "train.eval_every=0", f"train.log_every={max(1, self.steps // 20)}",
            f"eval.max_len={self.eval_len}", f"eval.samples={self.samples}",
        ]


# Sized on the project's 2-core CPU. Small models learn addition in a sudden drop of the loss whose timing varies
# a lot with the seed and learning rate (seen between steps ~700 and ~1,800 at 6 digits); FULL leaves a wide margin,
# so that what the grid shows beyond the training box is length generalisation, not under-training. QUICK is too
# short for that: it shows the pipeline and the shape of the result, not a comparison to quote.
FULL = DemoBudget(max_digits=5, eval_len=10, samples=100, steps=3000, batch_size=64, lr=1e-3, n_layers=4, dim=128,
                  n_heads=4)
QUICK = DemoBudget(max_digits=3, eval_len=6, samples=20, steps=1200, batch_size=32, lr=2e-3, n_layers=4, dim=128,
                   n_heads=4)


def run_demo(pes: list[str], budget: DemoBudget, out: str | Path, seeds: tuple[int, ...] = (0,),
             abacus: bool = False) -> dict[str, Any]:
    """Train and evaluate one model per PE and seed under `budget` into `out/<pe>-seed<k>/`; print the table, write
    the heat-maps; returns the sweep's results.json content.

    `abacus` gives every PE the Abacus digit embedding (McLeish et al.), so they are still compared like with like.
    """
    from tapecli.experiments.sweep import SweepSpec, run_sweep
    from tapecli.experiments.sweep.executors import Sequential

    seed_list = ",".join(map(str, seeds))
    spec = SweepSpec("arithmetic", tuple(budget.overrides(abacus)), tuple(pes), tuple(seeds), (), Path(out))
    command = ["tape", "demo", "--task", "addition", *["--quick"] * (budget == QUICK), *["--abacus"] * abacus,
               "--pe", ",".join(pes), "--seed", seed_list, "--out", str(out)]
    which = ("one seed: at this scale, when the loss drops is partly luck (compare with --seed N)" if len(seeds) == 1
             else f"seeds {', '.join(map(str, seeds))}")
    caption = (f"same budget for every PE: {budget.n_layers} layers x {budget.dim} wide, {budget.steps} steps x "
               f"{budget.batch_size} problems, AdamW lr {budget.lr:g}{', Abacus digit embedding' if abacus else ''}; "
               f"{budget.samples} problems per grid cell; {which}")
    title = f"Addition: train on 1-{budget.max_digits} digits, test on 1-{budget.eval_len} (greedy, exact match)"
    return run_sweep(spec, Sequential(), command, title=title, caption=caption)
