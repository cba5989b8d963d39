"""One gpu-check part in a child process of its own, under its time budget.

    entry = run_part(name, budget, fn, log, method)   # fn(soft_deadline, result, log); method "spawn" or "fork"
    # entry: {"budget_s", "status", "seconds", "result"}, JSON-able

The child makes itself a process-group leader and runs fn with two stops:
- soft, in the child: SIGALRM at `budget` seconds raises OverBudget in fn, and again every ALARM_AGAIN_S seconds
  should fn swallow it (dynamo does, raised while it compiles a frame: it runs the frame eagerly); the part is
  "stopped at its budget of N s" and keeps what it had filled into `result`. An exception in fn is "failed: <one line>".
- hard, in the parent: a child that sent no entry `GRACE_S` seconds after its budget ran out (stuck in a compile,
  in C code that SIGALRM does not interrupt) is killed with its whole process group: "killed: no answer N s after
  its budget", an empty result. The budget counts from the child's start message, sent once a spawned child has
  imported what unpickling its part needs (until then, from its launch). A child that ends without an entry (a
  crash, the OOM killer, os._exit) is "failed: the process ended with signal X" (or "with exit code X").
The child sends its log lines (as they come) and its entry through a pipe, and leaves with os._exit: no atexit
joins of worker pools. Whatever it started (inductor's compile workers) is killed with its process group after
every part, so nothing of one part outlives it. The parent stops the child also when it is stopped itself
(Ctrl-C, SIGTERM). "spawn" gives the child a fresh CUDA and inductor state; "fork" (CPU only, no CUDA involved)
spares it importing torch again.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import traceback
from contextlib import suppress
from multiprocessing.connection import wait

GRACE_S = 20.0  # how long after its budget a part may take to answer before it is killed
ALARM_AGAIN_S = 1.0  # SIGALRM again this often past the budget, until the part has stopped


class OverBudget(BaseException):
    """SIGALRM: the part ran to its budget (a BaseException, so that no `except Exception` inside a part, e.g. one
    variant's failure row, swallows it)."""


def run_soft(budget: float, fn, log) -> dict:
    """fn(soft_deadline, result, log) fills the dict `result` as it goes, under a SIGALRM at `budget` seconds (80 %
    of it is the soft deadline); a part stopped at its budget keeps what it had filled in."""
    def alarm(*_):
        signal.setitimer(signal.ITIMER_REAL, ALARM_AGAIN_S)  # should the part swallow this one (dynamo's compile)
        raise OverBudget

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, budget)
    start = time.monotonic()
    entry: dict = {"budget_s": budget, "status": "done", "result": {}}
    try:
        fn(start + 0.8 * budget, entry["result"], log)
    except OverBudget:
        entry["status"] = f"stopped at its budget of {budget:.0f} s"
    except Exception as e:  # noqa: BLE001 - one part's failure is its section; the others still run
        from tapecli.faults import failure_line

        entry["status"] = f"failed: {failure_line(e)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    entry["seconds"] = time.monotonic() - start
    return entry


def child(budget: float, fn, pipe) -> None:
    """The child process: its own process group, fn under run_soft, the entry through `pipe`, then os._exit."""
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked child inherits the parent's handler

    def send(message) -> None:  # whole messages only: SIGALRM waits until one is written
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            pipe.send(message)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})

    code = 1
    try:
        send(("start", None))  # the budget starts now, after the imports of a spawned child
        send(("entry", run_soft(budget, fn, lambda text: send(("log", text)))))
        code = 0
    except BaseException:  # noqa: BLE001 - whatever escaped run_soft: say it, the parent reports the exit code
        traceback.print_exc()
    finally:
        with suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def ended(code: int | None) -> str:
    return f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"


def kill_group(process) -> None:
    """SIGKILL the child's process group (the child and all it started), or the child alone before it had one."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with suppress(ProcessLookupError):
            process.kill()


def run_part(name: str, budget: float, fn, log, method: str) -> dict:
    """Run fn in a child process started by `method` (module docstring); print its log lines with `log` as they
    come and return its entry, or the parent's own one for a child killed or ended without answering."""
    def stop(*_):
        sys.exit(128 + signal.SIGTERM)  # leaves through the `finally` below, which kills the child's group

    context = multiprocessing.get_context(method)
    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(budget, fn, writer), name=f"gpu-check {name}")
    start = time.monotonic()
    process.start()
    writer.close()
    previous = signal.signal(signal.SIGTERM, stop)
    entry = None
    try:
        hard = start + budget + GRACE_S  # until the child says it started
        while entry is None:
            ready = wait([reader, process.sentinel], max(0.0, hard - time.monotonic()))
            if reader not in ready:  # past the hard deadline, or the child ended and every line is read
                break
            try:
                kind, value = reader.recv()
            except EOFError:
                break
            if kind == "start":
                hard = time.monotonic() + budget + GRACE_S
            elif kind == "log":
                log(value)
            else:
                entry = value
        process.join(max(0.0, hard - time.monotonic()))
        ended_itself = not process.is_alive()
    finally:
        kill_group(process)  # also what it left running (compile workers), however it ended
        process.join(GRACE_S)  # (a process stuck in the kernel, a hung driver, dies only when it leaves it)
        reader.close()
        signal.signal(signal.SIGTERM, previous)
    if entry is None:
        status = (f"failed: the process ended with {ended(process.exitcode)}" if ended_itself
                  else f"killed: no answer {GRACE_S:g} s after its budget")
        entry = {"budget_s": budget, "status": status, "result": {}, "seconds": time.monotonic() - start}
    log(f"{name}: {entry['status']} ({entry['seconds']:.1f} s of {budget:.0f})")
    return entry
