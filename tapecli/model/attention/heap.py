"""Give the C library's freed heap pages back while attention runs in many chunks (glibc only; a no-op elsewhere).

    fn = trimming(fn)      # a call of fn starts with glibc's malloc_trim(0) when INTERVAL seconds have passed

Chunked attention allocates a few chunk-sized temporaries per chunk, frees them, and keeps small tensors (the
chunk's output, autograd's records) between them. On glibc the small survivors pin the freed blocks below them,
each later chunk asks for a little more than the holes left, and the heap grows with the number of chunks: a
DAPE step at 16K tokens on the CPU held 13 GB and grew until stopped, of a few hundred MB of live tensors.
`malloc_trim(0)` hands every free page of the heap back to the system (the holes included, not only the top), so
the resident memory stays near the live tensors. Each trim costs the page faults of the freed pages reused next,
so it runs at most every INTERVAL seconds: a chunk's growth is in proportion to its work, and that bounds both the
growth between trims and the time they cost. The other
remedy, `MALLOC_MMAP_THRESHOLD_=65536` in the environment, bounds memory too but page-faults every temporary in
anew and doubled DAPE's time at 4K. No library offers this for PyTorch's CPU allocator, so it is written here
through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from time import monotonic

INTERVAL = 0.5  # seconds between two trims at least
_released = float("-inf")  # time.monotonic() of the last release by `trimming`


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (macOS, musl, Windows)."""
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own symbols: the C library Python runs on
    except (OSError, AttributeError, TypeError):
        return None


def release() -> bool:
    """Return the heap's free pages to the system now; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def trimming(fn: Callable) -> Callable:
    """fn, releasing the heap's free pages before a call when INTERVAL seconds have passed since the last release
    (one clock for every chunked call of the process: a forward's layers, and the recomputation in the backward;
    before the call, not after: checkpoint's recomputation stops inside fn once it has what the backward needs)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        global _released
        now = monotonic()
        if now - _released >= INTERVAL:
            release()
            _released = now
        return fn(*args, **kwargs)

    return wrapped
