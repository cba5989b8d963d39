"""Stop requests and the CLI's boundary: every command runs inside `boundary()`.

A stop request is one line: Ctrl-C (SIGINT) or SIGTERM ends any command with `stopped: ...` and exit code
128 + the signal (130, 143). Inside the boundary SIGTERM raises `Terminated` where Python would otherwise die
silently; training loops install their own handler (`tapecli.train.preemption.StopSignal`: save a checkpoint
first) and restore this one after. Every file tape writes is whole or absent at any instant (atomic renames,
flushed JSON lines), so the same command started again continues from what was finished. Any other exception is
reported as `tapecli.faults.explain` makes it: a fault in one line with its exit code, a bug with its traceback.

A command that is one training run says so (`single_run()`); once that run has saved its last checkpoint
(`run_finished()`), the command's work is done and a stop request has nothing left to stop: it is ignored, the
command ends as it would have (exit 0, no traceback), and the `tape` entry point (`main`, `keep_ignoring_stops`)
keeps ignoring it until the process exits. (A sweep or a demo runs several trainings: a stop between two of them
stops the command.)

A closed stdout (`tape ... | head`) ends the command quietly with exit code 1 (no "broken pipe" line).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tapecli import faults

_single_run = False  # the command running is one training run (single_run)
_finished = False  # ... and that run has saved its last checkpoint (run_finished)
_ignore_after = False  # the process is the `tape` entry point: stops stay ignored after the boundary


def single_run() -> None:
    """The command running is one training run: its `run_finished()` ends the command's work."""
    global _single_run
    _single_run = True


def run_finished() -> None:
    """A training run saved its last checkpoint: if it is the command's one run, a stop request from now on is
    ignored (the command's work is done)."""
    global _finished
    _finished = _finished or _single_run


def finished() -> bool:
    """Whether the command's work is done (`run_finished`): a stop request now has nothing to stop."""
    return _finished


def keep_ignoring_stops() -> None:
    """The process is the `tape` entry point: once the command's work is done, stop requests stay ignored until
    the process exits (a SIGTERM during the interpreter's shutdown must not turn exit 0 into -15)."""
    global _ignore_after
    _ignore_after = True


class Terminated(BaseException):
    """SIGTERM arrived (raised by the boundary's handler, like KeyboardInterrupt for SIGINT)."""


def _terminate(signum: int, frame: object) -> None:
    if not _finished:
        raise Terminated


def _interrupt(signum: int, frame: object) -> None:
    if not _finished:
        raise KeyboardInterrupt


STOP_MESSAGE = ("{name}; the work finished so far is saved: run the same command again to continue (evaluations "
                "and training resume where they stopped, other commands start over)")


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate),
                signal.SIGINT: signal.signal(signal.SIGINT, _interrupt)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_IGN if _finished and _ignore_after else handler)


@contextmanager
def boundary() -> Iterator[None]:
    """Report faults as `error: <one line>` and exit with their code; let real bugs through with a traceback;
    a stop request (Ctrl-C, SIGTERM) is `stopped: <one line>`."""
    import signal

    import typer

    global _single_run, _finished
    faults.forget_memory_use()  # set again by whatever this command runs (note_memory_use)
    _single_run = _finished = False
    try:
        with _sigterm_raises():
            yield
    except (KeyboardInterrupt, Terminated) as e:
        number = signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM
        name = "Ctrl-C (SIGINT)" if number == signal.SIGINT else "SIGTERM"
        typer.secho(f"\nstopped: {STOP_MESSAGE.format(name=name)}", fg=typer.colors.RED, err=True)
        raise typer.Exit(128 + number) from None
    except BrokenPipeError:  # the reader of stdout went away (`tape ... | head`): exit quietly, as Unix tools do
        _quiet_stdout()
        raise typer.Exit(1) from None
    except Exception as e:
        if faults.debugging():
            raise
        explained = faults.explain(e)
        if explained is None:
            raise
        message, code, prefix = explained
        typer.secho(f"{prefix}: {message}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code) from None
    finally:  # in one process running several commands (tests, a notebook), the next one starts afresh
        _single_run = _finished = False


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is left in its buffer does not raise (and
    print) the broken pipe again at exit."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test runner's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
