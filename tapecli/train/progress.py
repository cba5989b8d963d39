"""What a training run shows while it runs: a Rich progress bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

ETA_LIMIT_S = 100 * 365 * 86400  # longer than this: "over 100 years"


class TrainProgress:
    """Step, loss, learning rate, tokens/s and ETA. Silent when `enabled` is False (ranks other than 0)."""

    def __init__(self, start_step: int, max_steps: int, log_every: int, enabled: bool) -> None:
        self.start_step, self.max_steps, self.log_every, self.enabled = start_step, max_steps, log_every, enabled
        self.console = Console()
        self._t0 = time.perf_counter()
        self._bar: Progress | None = None
        if enabled and sys.stdout.isatty():
            self._bar = Progress(
                TextColumn("step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("loss {task.fields[loss]:.4f}  lr {task.fields[lr]:.2e}  {task.fields[tps]:,.0f} tok/s"),
                TextColumn("eta"), TimeRemainingColumn(), console=self.console,
            )
            self._task = self._bar.add_task("train", total=max_steps, completed=start_step, loss=float("nan"),
                                            lr=0.0, tps=0.0)

    def __enter__(self) -> TrainProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()

    def step(self, step: int, loss: float, lr: float, tokens_per_s: float) -> None:
        """Report optimizer step `step` (1-based count of steps done)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=step, loss=loss, lr=lr, tps=tokens_per_s)
        elif step % self.log_every == 0 or step == self.max_steps:
            seconds_per_step = (time.perf_counter() - self._t0) / max(1, step - self.start_step)
            remaining = seconds_per_step * (self.max_steps - step)
            # timedelta holds under a billion days: a step count no run reaches (train.max_steps=1e18) has no ETA
            eta = timedelta(seconds=round(remaining)) if remaining < ETA_LIMIT_S else "over 100 years"
            self.print(f"step {step}/{self.max_steps} | loss {loss:.4f} | lr {lr:.2e} | "
                       f"{tokens_per_s:,.0f} tok/s | eta {eta}")

    def print(self, message: str) -> None:
        """A line above the bar (or plain), on rank 0 only."""
        if self.enabled:
            self.console.print(message, markup=False, highlight=False, soft_wrap=True)
