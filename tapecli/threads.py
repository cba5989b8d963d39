"""How many CPU threads a command computes with, decided once, before torch loads.

    prepare()            at import of the CLI, before torch: OMP_WAIT_POLICY=PASSIVE unless the user set one
    configure(n)         `--threads N` (or TAPE_THREADS, or the user's OMP_NUM_THREADS, or the default below)
    describe()           "2 threads (of 2 cores; OMP_WAIT_POLICY=PASSIVE)", for a command's startup line
    busy()               (load, cores) when the machine is busier than it has cores, else None (`tape doctor`)

Why: PyTorch's CPU kernels run on OpenMP threads that, by default, spin while they wait for work. When another
process holds a core (a training in the background, a second evaluation), the spinning threads wait for it at every
op, and a small model pays that at every layer: on a 2-core machine under a load of about 6, a tiny model's
`tape eval perplexity` took 102.0 s with torch's default settings, 30.4 s with OMP_WAIT_POLICY=PASSIVE and 32.5 s on
one thread (docs/speed.md, "Threads on a busy CPU", scripts/threads_bench.py).
So the default is every core (torch's own choice) with passive waiting;
`--threads 1` (or TAPE_THREADS=1) is the fix `tape doctor` names on a busy machine. A thread count the user set
(`--threads`, TAPE_THREADS, OMP_NUM_THREADS) is kept, and so is an OMP_WAIT_POLICY of their own. Library use (torch
already imported by the caller) keeps the caller's settings unless `configure` is given a count.
"""

from __future__ import annotations

import os
import sys

ENV = "TAPE_THREADS"
_WAIT = "OMP_WAIT_POLICY"
_chosen: int | None = None  # what configure decided (None: torch's own count)


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def prepare() -> None:
    """Before torch loads: wait passively (OpenMP reads the policy once, when the library loads)."""
    if _WAIT not in os.environ and "torch" not in sys.modules:
        os.environ[_WAIT] = "PASSIVE"


def configure(requested: int | None) -> None:
    """Use `requested` threads (`--threads`), else TAPE_THREADS, else the user's OMP_NUM_THREADS, else torch's
    default (every core). Before torch loads this sets OMP_NUM_THREADS (children inherit it); after, it calls
    `torch.set_num_threads` only for a count the user gave."""
    global _chosen
    if requested is None and os.environ.get(ENV, "").strip():
        requested = _parse_env(os.environ[ENV])
    _chosen = requested
    if requested is None:
        return
    os.environ["OMP_NUM_THREADS"] = str(requested)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(requested)


def _parse_env(text: str) -> int:
    from tapecli.errors import TapeError

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise TapeError(f"{ENV}={text!r}: expected a positive number of threads (e.g. {ENV}=1)")
    return value


def count() -> int:
    """The threads torch computes with (torch is imported here)."""
    import torch

    return torch.get_num_threads()


def describe() -> str:
    """`2 threads (of 2 cores; OMP_WAIT_POLICY=PASSIVE)`: what a command's startup line says."""
    policy, n = os.environ.get(_WAIT, "unset"), count()
    return f"{n} thread{'s' * (n != 1)} (of {cores()} cores; {_WAIT}={policy})"


def busy() -> tuple[float, int] | None:
    """(1-minute load, cores) when the load exceeds the cores, else None (no load average here: None)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    n = cores()
    return (load, n) if load > n else None
