"""Where a sweep's cells run. Each executor runs `cells.run_cell` on a list of cells and returns the failures
({cell name: one line}); a cell that fails does not stop the others. A stop request (Ctrl-C, SIGTERM) stops all.

    Sequential()           in this process, one cell after another (the default; output on the console)
    Processes(jobs)        `jobs` worker processes on this machine, each with cpu_count / jobs threads; each cell's
                           output goes to DIR/logs/<cell>.log
    Submitit(cluster, ...) one submitit job per cell: cluster "slurm" (sbatch; partition, GPUs, time limit, extra
                           sbatch options) or "local" (submitit's local executor: the same jobs as processes on
                           this machine, to try a cluster sweep without a cluster). Job files and logs go to
                           DIR/submitit/. A job with more than one GPU trains with one process per GPU (DDP).

Preemption and time limits on SLURM: submitit asks sbatch for a signal (SIGUSR2) shortly before the job is killed.
The training engine stops at the next optimizer step on it and saves a checkpoint (tapecli.train.preemption), then
`CellJob` hands the job back to submitit, which requeues it; the requeued job resumes the cell (`--resume auto`).
A cell stopped by SIGTERM or Ctrl-C (scancel, a user) is not requeued.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tapecli.errors import Stopped, TapeError
from tapecli.experiments.sweep.cells import Cell, run_cell


def _failure(error: BaseException) -> str:
    return str(error) if isinstance(error, TapeError) else f"{type(error).__name__}: {error}"


class Sequential:
    """Cells one after another in this process."""

    def run(self, cells: list[Cell]) -> dict[str, str]:
        from rich.console import Console

        console, failures = Console(), {}
        for n, cell in enumerate(cells, start=1):
            console.rule(f"{cell.name} ({n}/{len(cells)})")
            try:
                run_cell(cell)
            except Stopped:
                raise
            except TapeError as error:  # bugs keep their traceback (the CLI's error boundary decides)
                console.print(f"{cell.name} failed: {error}", style="red", markup=False, highlight=False)
                failures[cell.name] = str(error)
        return failures


def _run_logged(cell: Cell, log: Path, threads: int) -> None:
    """A worker process: this cell, its output into `log`."""
    import torch

    torch.set_num_threads(threads)
    with open(log, "a", buffering=1) as handle:
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            run_cell(cell)
        except TapeError as error:  # one line, as the CLI would print it; the parent reports it too
            print(f"{error.prefix}: {error}", file=sys.stderr, flush=True)
            raise
        except BaseException:
            traceback.print_exc()
            raise


@dataclass
class Processes:
    """Cells in `jobs` worker processes at once."""

    jobs: int

    def run(self, cells: list[Cell]) -> dict[str, str]:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        if not cells:
            return {}
        logs = cells[0].run_dir.parent / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        threads = max(1, (os.cpu_count() or 1) // self.jobs)
        failures: dict[str, str] = {}
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited torch threads or locks
        with ProcessPoolExecutor(self.jobs, mp_context=context, max_tasks_per_child=1) as pool:
            futures = {pool.submit(_run_logged, cell, logs / f"{cell.name}.log", threads): cell for cell in cells}
            print(f"{len(cells)} cells, {self.jobs} at a time ({threads} threads each); logs: {logs}/<cell>.log",
                  flush=True)
            interrupted = False
            try:
                for done, future in enumerate(as_completed(futures), start=1):
                    cell, error = futures[future], None if future.cancelled() else future.exception()
                    if isinstance(error, Stopped):  # a cell was asked to stop (SIGTERM): so is the sweep
                        pool.shutdown(wait=True, cancel_futures=True)
                        break
                    if error is not None:
                        failures[cell.name] = _failure(error)
                    status = f"failed: {failures[cell.name]}" if error is not None else "done"
                    print(f"[{done}/{len(cells)}] {cell.name} {status}", flush=True)
            except KeyboardInterrupt:  # Ctrl-C reached the workers too: each saves a checkpoint at its next step
                interrupted = True
                pool.shutdown(wait=True, cancel_futures=True)
        stops = [f.exception() for f in futures if f.done() and not f.cancelled()
                 and isinstance(f.exception(), Stopped)]
        if stops:
            raise stops[0]  # says which signal, and that the same command resumes the sweep
        if interrupted:
            raise KeyboardInterrupt
        return failures


class CellJob:
    """A cell as a submitit job (picklable); requeued by submitit when preempted or out of time."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell

    def __call__(self) -> str:
        import submitit

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # one process per GPU: torchrun's variables, which the engine reads
            submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        preempt = getattr(signal, f"SIG{submitit.JobEnvironment.USR_SIG}")
        requeue = signal.getsignal(preempt)  # submitit's handler: checkpoint this job, requeue it, exit
        try:
            run_cell(self.cell)
        except Stopped as stop:
            # The engine saved a checkpoint on the preemption signal; now let submitit requeue the job.
            if stop.exit_code == 128 + preempt and callable(requeue):
                requeue(preempt, None)
            raise
        return self.cell.name

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(CellJob(self.cell))  # resumes with --resume auto


@dataclass
class Submitit:
    """One submitit job per cell; waits for all of them."""

    cluster: str  # "slurm" or "local"
    partition: str | None = None
    gpus_per_job: int = 1
    cpus_per_job: int | None = None
    time_limit: int = 240  # minutes
    sbatch: dict[str, str] = field(default_factory=dict)  # extra sbatch options (account, qos, constraint, ...)

    def run(self, cells: list[Cell]) -> dict[str, str]:
        try:
            import submitit
        except ImportError:
            raise TapeError("--executor slurm needs submitit: pip install 'tapecli[slurm]'") from None
        if not cells:
            return {}
        if self.cluster == "slurm" and shutil.which("sbatch") is None:
            raise TapeError("--executor slurm: sbatch not found; run the sweep on a SLURM login node (or try the "
                            "jobs on this machine with --executor submitit-local)")
        folder = cells[0].run_dir.parent / "submitit"
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster=self.cluster)
        tasks = max(1, self.gpus_per_job)
        executor.update_parameters(
            name="tape-sweep", timeout_min=self.time_limit, nodes=1, tasks_per_node=tasks,
            gpus_per_node=self.gpus_per_job, **({"cpus_per_task": self.cpus_per_job} if self.cpus_per_job else {}),
            slurm_partition=self.partition, slurm_additional_parameters=dict(self.sbatch))
        jobs = [(cell, executor.submit(CellJob(cell))) for cell in cells]
        print(f"submitted {len(jobs)} jobs ({self.cluster}): "
              + ", ".join(f"{cell.name}={job.job_id}" for cell, job in jobs) + f"; logs: {folder}/<job id>/",
              flush=True)
        failures: dict[str, str] = {}
        for done, (cell, job) in enumerate(jobs, start=1):
            try:
                job.result()
                status = "done"
            except Exception as error:  # the job's traceback is in its log
                last = (str(error).strip().splitlines() or [type(error).__name__])[-1]
                failures[cell.name] = f"job {job.job_id}: {last} (log: {folder / str(job.job_id)}/)"
                status = f"failed: {failures[cell.name]}"
            print(f"[{done}/{len(jobs)}] {cell.name} {status}", flush=True, file=sys.stdout)
        return failures
