"""One writer per output directory: a command claims the directory it writes, and a second writer is refused.

    with claim(out, what="--out"):      # TapeError while another live process holds `out`; reentrant per process
        ... write into out ...
    with claim(out, beside=True):       # the claim's files beside `out` (.NAME.tape-claim.*), for a directory that
        ...                             # must stay empty until it is renamed into place (tape export)

A claim is two files in the directory: `.tape-claim.lock`, an empty file the owner holds an exclusive `flock` on for
as long as it runs, and `.tape-claim.json`, who the owner is (host, pid, command, since when), written atomically.
The kernel drops a flock when its process ends in any way (exit, exception, SIGKILL, OOM kill), so on one host a
held lock means a live owner and a free lock means a dead one: the next command takes the directory over with a
note and continues (a training run resumes from its newest checkpoint).

Across hosts on a shared filesystem: where the filesystem passes flock through to the server (NFSv4, Lustre and
GPFS do; NFSv3 with its lock daemon does), the same rule holds. Where it does not (a `nolock` mount, some FUSE
filesystems), a claim from another host counts as live while its owner keeps it fresh: the owner touches
`.tape-claim.json` every `HEARTBEAT` seconds, and a claim from another host untouched for `STALE_AFTER` seconds is
taken over. What is assumed: the hosts' clocks agree to well within `STALE_AFTER`, and the filesystem updates a
file's mtime on `utime`.

Readers are never blocked: evaluating a run while it trains reads its newest complete checkpoint and writes into
a directory of its own (RUN/eval-<name>/...), which that evaluation claims. Under torchrun, rank 0 claims the run
for every rank.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from tapecli.errors import TapeError
from tapecli.faults import check_output_dir, writing
from tapecli.files import write_atomic

LOCK = ".tape-claim.lock"
INFO = ".tape-claim.json"
HEARTBEAT = 30.0  # seconds between the owner's touches of INFO
STALE_AFTER = 300.0  # a claim from another host untouched this long is dead

_held: dict[Path, int] = {}  # directories this process holds: resolved path -> nesting depth


def claim_files(directory: Path, beside: bool = False) -> tuple[Path, Path]:
    """(lock file, info file) of a claim on `directory`: inside it, or beside it (.NAME.tape-claim.lock, ...)."""
    if beside:
        return directory.parent / f".{directory.name}{LOCK}", directory.parent / f".{directory.name}{INFO}"
    return directory / LOCK, directory / INFO


class _Held:
    """A held claim: the locked file descriptor and the heartbeat thread that keeps the info file fresh."""

    def __init__(self, info: Path, fd: int) -> None:
        self.info, self.fd = info, fd
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"tape-claim {info}", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            with contextlib.suppress(OSError):
                os.utime(self.info)

    def release(self) -> None:
        """Drop the info file, then the lock (the lock file stays: removing it would let two processes lock two
        different files of one name)."""
        self.stop.set()
        self.thread.join(timeout=1.0)
        with contextlib.suppress(OSError):
            self.info.unlink()
        with contextlib.suppress(OSError):
            os.close(self.fd)  # drops the flock


def read_owner(info: Path) -> dict | None:
    """Who holds a claim according to its info file (None when there is no readable one)."""
    try:
        owner = json.loads(info.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def owner_text(owner: dict | None) -> str:
    if not owner:
        return "another process"
    return (f"{owner.get('command') or 'a tape command'} (pid {owner.get('pid', '?')} on {owner.get('host', '?')}, "
            f"since {owner.get('since', '?')})")


def _fresh(info: Path) -> bool:
    try:
        return time.time() - info.stat().st_mtime < STALE_AFTER
    except OSError:
        return False


def _refused(directory: Path, what: str, owner: dict | None) -> TapeError:
    return TapeError(f"{what} {directory}: in use by {owner_text(owner)}; wait for it to finish or stop it, "
                     f"or pass another {what}")


def _acquire(directory: Path, what: str, command: str, beside: bool) -> _Held:
    check_output_dir(directory, what)
    lock, info = claim_files(directory, beside)
    with writing(lock):
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        host = socket.gethostname()
        previous = read_owner(info)
        if previous is not None:
            if previous.get("host") != host and _fresh(info):
                raise _refused(directory, what, previous)  # another host's live claim, its lock not visible here
            print(f"note: {what} {directory} was held by {owner_text(previous)}, which is no longer running; "
                  "taking it over", file=sys.stderr)
        owner = {"host": host, "pid": os.getpid(), "command": command,
                 "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        with writing(info):
            write_atomic(info, json.dumps(owner) + "\n")
    except BlockingIOError:
        os.close(fd)
        raise _refused(directory, what, read_owner(info)) from None
    except BaseException:
        os.close(fd)
        raise
    return _Held(info, fd)


@contextlib.contextmanager
def claim(directory: str | Path, what: str = "--out", command: str | None = None,
          beside: bool = False) -> Iterator[Path]:
    """Hold `directory` for this process while the block runs (created if missing, unless `beside`); a second live
    writer is refused with one line naming the directory, the owner and what to do. Nested claims of one directory
    in one process are one claim. `what` names where the directory came from (an option, a recipe key); `command`
    is recorded for the message (default: this process's command line); `beside` keeps the claim's files in the
    parent directory."""
    directory = Path(directory).resolve()
    if directory in _held:
        _held[directory] += 1
        try:
            yield directory
        finally:
            _held[directory] -= 1
        return
    held = _acquire(directory, what, command or shlex.join(["tape", *sys.argv[1:]]), beside)
    _held[directory] = 1
    try:
        yield directory
    finally:
        del _held[directory]
        held.release()
