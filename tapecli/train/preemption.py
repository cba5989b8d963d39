"""Stopping a training run on request: SIGTERM (what SLURM and Kubernetes send before the kill), SIGUSR2 (what
`sbatch --signal` and submitit send before a time limit or a preemption) or Ctrl-C.

While `with StopSignal() as stop:` is active, the first SIGTERM, SIGUSR2 or SIGINT only sets a flag and says so; the
training loop asks `stop.requested(env)` after each optimizer step, saves a checkpoint at that step and raises
`Stopped` with where it is and how to resume (exit code 128 + the signal number). The first signal also puts
the previous handlers back, so a second Ctrl-C stops at once (KeyboardInterrupt) and a second SIGTERM kills.
Resuming from that checkpoint is exact, like any other checkpoint. A signal after the command's one run saved its
last checkpoint (`tapecli.stops.finished`) is ignored: the run is done.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from tapecli import stops
from tapecli.errors import Stopped

_SIGNALS = (signal.SIGTERM, signal.SIGINT, *([signal.SIGUSR2] if hasattr(signal, "SIGUSR2") else []))


class StopSignal:
    def __init__(self) -> None:
        self.signal_number: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():  # Python only delivers signals there
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if stops.finished():  # the command's one run saved its last checkpoint: nothing to stop
            return
        self.signal_number = signum
        self._restore()
        print(f"\n{signal.Signals(signum).name}: stopping after this optimizer step to save a checkpoint "
              "(press Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def requested(self, env: Any) -> bool:
        """Whether any process got a stop signal; with several processes they agree (one all-reduce), so all
        stop after the same step."""
        if getattr(env, "world_size", 1) > 1:
            import torch

            from tapecli.train import distributed

            flag = torch.tensor(float(self.signal_number is not None), device=env.device)
            if distributed.all_sum(flag, env).item() > 0 and self.signal_number is None:
                self.signal_number = signal.SIGTERM  # another process was told to stop
        return self.signal_number is not None


def stopped(signal_number: int, step: int, checkpoint: Path, command: list[str]) -> Stopped:
    """The error a stopped run ends with: which signal, the checkpoint, and the command that resumes it."""
    resume = _resume_command(command)
    how = f"resume with: {resume}" if resume else "run the same command again with --resume auto to continue"
    return Stopped(f"{signal.Signals(signal_number).name} after step {step}; saved {checkpoint}; {how}",
                   signal_number)


def _resume_command(command: list[str]) -> str | None:
    if not command:
        return None
    if command[:2] in (["tape", "demo"], ["tape", "sweep"]):  # they resume their runs: the same command again
        return shlex.join(command)
    args = list(command)
    if "--resume" in args[:-1]:
        args[args.index("--resume") + 1] = "auto"
    else:
        args += ["--resume", "auto"]
    return shlex.join(args)
