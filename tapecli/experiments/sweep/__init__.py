"""`tape sweep`: a grid of PEs x seeds (x --grid values) trained with `tape pretrain` semantics, evaluated by the
recipe's data kind, aggregated over seeds.

    cells.py        the cells: naming, overrides, state (finished / to evaluate / to continue / new), running one
    evaluations.py  data kind -> evaluation (the one table)
    executors.py    where cells run: in this process, in worker processes, as submitit jobs (SLURM or local)
    report.py       DIR/results.json, the table (mean ± std, min-max over seeds) and the charts
    runner.py       the command: plan, check, run, aggregate; --report
"""

from tapecli.experiments.sweep.cells import SweepSpec, parse_grid, parse_list
from tapecli.experiments.sweep.runner import report_sweep, run_sweep

__all__ = ["SweepSpec", "parse_grid", "parse_list", "report_sweep", "run_sweep"]
