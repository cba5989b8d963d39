"""Give the C library's freed heap pages back while attention runs in many chunks (glibc on Linux; a no-op
elsewhere).

    fn = trimming(fn)      # a call of fn starts with glibc's malloc_trim(0) once the process grew by GROWTH bytes

Chunked attention allocates a few chunk-sized temporaries per chunk and frees them, and whatever small it keeps
between them pins the freed blocks: on glibc, each later chunk then asks for a little more than the holes left
and the heap grows with the number of chunks (GRAPE-AP's step at 16K tokens on the CPU ran out of 22 GB of a few
hundred MB of live tensors; `by_query_chunks` writes each chunk's output into one buffer so that the outputs at
least pin nothing, which was all of DAPE's growth). `malloc_trim(0)` hands every free page of the heap back to the
system, the holes included, not only the top. A trim costs the page faults of the freed pages reused next (trimming
every half second cost GRAPE-AP half its time again at 4K, every GiB of growth 17 to 37 % in two runs), so it runs
only once the process's resident memory (/proc/self/statm) has grown by GROWTH since the last one: a step that
fits in that slack never pays for it, and a long one's memory stays within it of its live tensors. The other
remedy, `MALLOC_MMAP_THRESHOLD_=65536` in the environment, page-faults every temporary in anew and doubled DAPE's
time at 4K. No library offers this for PyTorch's CPU allocator, so it is written here through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

GROWTH = 4 << 30  # bytes of resident growth between two trims
_baseline: int | None = None  # the resident bytes after the last trim (or the least seen since)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own symbols: the C library Python runs on
    except (OSError, AttributeError, TypeError):
        return None


def resident() -> int | None:
    """The process's resident memory in bytes (Linux's /proc/self/statm), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release() -> bool:
    """Return the heap's free pages to the system now; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def trimming(fn: Callable) -> Callable:
    """fn, releasing the heap's free pages before a call once the resident memory has grown by GROWTH bytes since
    the last release (one baseline for the process: a forward's layers and the recomputation in the backward alike;
    before the call, not after: checkpoint's recomputation stops inside fn once it has what the backward needs)."""
    if _malloc_trim() is None:
        return fn

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        global _baseline
        now = resident()
        if now is not None:
            if _baseline is None or now < _baseline:
                _baseline = now
            elif now - _baseline >= GROWTH:
                release()
                _baseline = resident()
        return fn(*args, **kwargs)

    return wrapped
