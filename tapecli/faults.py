"""Faults from files, the OS and the hardware, turned into one line naming the file and the problem.

The CLI runs every command inside `tapecli.stops.boundary()`, which prints what `explain` makes of an exception: a
`TapeError` as `error: <message>`, exiting with the error's code (2: bad input, 1: a failed run); so are click's usage
errors in a sub-command's arguments (a value out of its range, not a number, missing). Errors the OS or a library
raises for a *fault* rather than a bug -- an unreadable file, a full disk, a corrupt checkpoint, an out-of-memory
GPU -- become one line too. Anything else is a bug and keeps its traceback. `tape --debug ...` or `TAPE_DEBUG=1`
shows the traceback of every error. (Stop requests, Ctrl-C and SIGTERM, are `tapecli.stops`'.)

An error that a plugin PE's code raised, or a plugin's result that breaks the PE API, is one line naming the
plugin and its hook (`tapecli.model.pe.plugins.blame`).

Code that reads or writes a file wraps the call in `reading(path)` / `writing(path)`: the exceptions
libraries raise for a corrupt file (safetensors, sentencepiece, torch.load, json, yaml, UTF-8) or a failed write
(disk full) say nothing about which file it was, so these turn them into a `TapeError` that does.
`check_output_file` / `check_output_dir` test an `--out` before any work starts.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tapecli.errors import RunFailed, TapeError

_debug = False
_memory_context: tuple[str, str] | None = None  # (what is running, hint), see note_memory_use

# errno values that mean the storage, not the input, failed: the run failed (exit 1), the input was fine.
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def set_debug(enabled: bool) -> None:
    """Show tracebacks instead of one-line messages (`tape --debug`, `TAPE_DEBUG=1`)."""
    global _debug
    _debug = enabled or os.environ.get("TAPE_DEBUG", "") not in ("", "0")


def debugging() -> bool:
    """Whether errors keep their tracebacks (`set_debug`, or TAPE_DEBUG set now)."""
    return _debug or os.environ.get("TAPE_DEBUG", "") not in ("", "0")


def forget_memory_use() -> None:
    """A new command starts: what the last one ran no longer explains running out of memory."""
    global _memory_context
    _memory_context = None


def note_memory_use(what: str, hint: str) -> None:
    """What the process is running (e.g. "a 124,000,000-parameter model") and what to lower when memory runs out;
    used in the out-of-memory message."""
    global _memory_context
    _memory_context = (what, hint)


def explain(e: BaseException) -> tuple[str, int, str] | None:
    """(one-line message, exit code, prefix) for a fault, None for an exception that is a bug."""
    if isinstance(e, TapeError):
        return str(e), e.exit_code, e.prefix
    if _is_usage_error(e):  # a bad command line (a value out of range, not a number, missing): one line, not a box
        ctx = getattr(e, "ctx", None)
        where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        return " ".join(e.format_message().split()) + where, e.exit_code, "error"
    if _is_out_of_memory(e):
        return out_of_memory_message(e), 1, "error"
    plugins = sys.modules.get("tapecli.model.pe.plugins")  # loaded only where a model was built
    blamed = plugins.blame(e) if plugins is not None else None
    if blamed is not None:  # a plugin PE's own code raised it, or broke the PE API: its author's to fix
        return blamed, 2, "error"
    if isinstance(e, OSError) and e.errno is not None:
        return _os_message(e), (1 if e.errno in _STORAGE_ERRNOS else 2), "error"
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({e.reason} at byte {e.start})", 2, "error"
    code = re.search(r"\(os error (\d+)\)", str(e))  # an OS error inside a Rust library (safetensors, tokenizers)
    if code:
        number = int(code.group(1))
        return f"{os.strerror(number).lower()} ({_short(e)})", (1 if number in _STORAGE_ERRNOS else 2), "error"
    return None


def _is_usage_error(e: BaseException) -> bool:
    """click's (or Typer's vendored click's) ClickException, except the "no arguments: show the help" one."""
    if type(e).__name__ == "NoArgsIsHelpError":
        return False
    bases = [sys.modules.get(name) for name in ("typer._click.exceptions", "click.exceptions")]
    return any(base is not None and isinstance(e, base.ClickException) for base in bases)


def _os_message(e: OSError) -> str:
    problem = (e.strerror or os.strerror(e.errno or 0)).lower()
    if e.filename is None:
        return problem
    if e.errno in _STORAGE_ERRNOS:
        return f"{problem} while writing {e.filename}"
    if e.errno in (errno.EEXIST, errno.ENOTDIR):  # a directory was wanted where a file is (an --out, a parent)
        path = Path(e.filename)
        blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            where = "" if blocking == path else f"{e.filename}: "
            return f"{where}{blocking} is a file, not a directory"
    return f"{e.filename}: {problem}"


# ---------------------------------------------------------------------------------------------------------------
# Reading and writing files


def _is_corrupt_file_error(e: BaseException) -> bool:
    """Exceptions libraries raise for a malformed file (never raised for a missing or unreadable one)."""
    import pickle

    if isinstance(e, (ValueError, EOFError, KeyError, TypeError, AttributeError, pickle.UnpicklingError)):
        return True
    name = type(e).__name__
    if name in ("SafetensorError", "YAMLError") or any(c.__name__ == "YAMLError" for c in type(e).__mro__):
        return True
    # torch.load ("PytorchStreamReader failed ...") and sentencepiece ("could not parse ModelProto") raise these.
    return isinstance(e, RuntimeError) and not _is_out_of_memory(e)


def _short(e: BaseException) -> str:
    """A library's message, first sentence only, without C++ source locations."""
    text = " ".join(str(e).split()) or type(e).__name__
    text = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", text)
    text = re.sub(r"^(INTERNAL|Internal): ", "", text)
    text = text.split(". ", 1)[0]
    return text if len(text) <= 160 else text[:157] + "..."


def failure_line(e: BaseException) -> str:
    """Any exception as one short line, for a report that goes on after it (`tape bench`, `tape doctor`): the type
    and the first sentence of its message (out of memory: the memory line)."""
    if _is_out_of_memory(e):
        return out_of_memory_message(e)
    return f"{type(e).__name__}: {_short(e)}"


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Turn a parse error while reading `path` into `TapeError("<path> is corrupt or truncated (<reason>)")`.

    Keep the block to the read itself: every non-OS error inside it is taken to mean the file is bad. OS errors
    (permission denied, not found) pass through; the boundary names their file. An OSError without errno (raised by a
    Rust library, e.g. safetensors for a dangling symlink) becomes `TapeError("<path>: <problem>")` here.
    """
    try:
        yield
    except TapeError:
        raise
    except OSError as e:
        if e.errno is None:  # Rust libraries (safetensors) raise OSErrors that name neither errno nor file
            raise TapeError(f"{path}: {_rust_os_problem(e)}") from e
        raise
    except Exception as e:
        if isinstance(e, UnicodeDecodeError):
            raise TapeError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from e
        if not _is_corrupt_file_error(e):
            raise
        raise TapeError(f"{path} is corrupt or truncated ({_short(e)})") from e


def _rust_os_problem(e: OSError) -> str:
    """"no such file or directory" from "No such file or directory: /x" or "... (os error 2)"."""
    code = re.search(r"\(os error (\d+)\)", str(e))
    return os.strerror(int(code.group(1))).lower() if code else str(e).split(":")[0].strip().lower()


def _write_problem(e: BaseException, path: Path) -> str | None:
    """What went wrong while writing `path`, or None if `e` is not a write fault."""
    if isinstance(e, OSError) and e.errno is not None:
        return (e.strerror or os.strerror(e.errno)).lower()
    text = str(e)
    match = re.search(r"\(os error (\d+)\)", text)  # Rust (safetensors): "I/O error: ... (os error 28)"
    if match:
        return os.strerror(int(match.group(1))).lower()
    if isinstance(e, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text):
        # torch.save reports a short write as "unexpected pos ..."; the usual cause is a full disk.
        return "no space left on device" if _disk_full(path) else f"write failed ({_short(e)})"
    return None


def _disk_full(path: Path) -> bool:
    for folder in (path.parent, *path.parents):
        if folder.exists():
            stat = os.statvfs(folder)
            return stat.f_bavail * stat.f_frsize < 1 << 20
    return False


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn a failed write inside the block (disk full, read-only, ...) into
    `RunFailed("<problem> while writing <path>")`; cleaning up the partial file is the caller's job."""
    try:
        yield
    except TapeError:
        raise
    except Exception as e:
        problem = _write_problem(e, Path(path))
        if problem is None:
            raise
        raise RunFailed(f"{problem} while writing {path}") from e


def _existing_parent(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path(".")


def _check_creatable(path: Path, option: str, inside: Path) -> None:
    """Whether files can be created in `inside` (or its nearest existing parent); writes nothing lasting."""
    folder = _existing_parent(inside)
    if not folder.is_dir():
        raise TapeError(f"{option} {path}: {folder} is a file, not a directory")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise TapeError(f"{option} {path}: cannot write in {folder} ({(e.strerror or str(e)).lower()})") from None


def check_output_file(path: str | Path, option: str = "--out") -> None:
    """Fail now, not after the work, if the file `path` cannot be written (a directory, a read-only place...)."""
    path = Path(path)
    if path.is_dir():
        raise TapeError(f"{option} {path} is a directory; give a file path")
    _check_creatable(path, option, path.parent)


def check_output_dir(path: str | Path, option: str = "--out") -> None:
    """Fail now if the directory `path` cannot be created or written into (an existing file, read-only...)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise TapeError(f"{option} {path} is a file; give a directory")
    _check_creatable(path, option, path)


# ---------------------------------------------------------------------------------------------------------------
# Out of memory


def _is_out_of_memory(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(e, RuntimeError) and ("out of memory" in str(e) or "can't allocate memory" in str(e))


def out_of_memory_message(e: BaseException) -> str:
    """One line: what was being allocated, on which device, what is running, and what to lower."""
    text = str(e)
    size = re.search(r"[Tt]ried to allocate ([\d.]+ [KMGT]i?B)", text)
    cpu_bytes = re.search(r"you tried to allocate (\d+) bytes", text)
    if size:
        wanted = f" allocating {size.group(1)}"
    elif cpu_bytes:
        wanted = f" allocating {int(cpu_bytes.group(1)) / 2**30:,.2f} GiB"
    else:
        wanted = ""
    device = "GPU" if ("CUDA" in text or "GPU" in text) else "CPU" if ("CPU" in text or isinstance(e, MemoryError)) \
        else "device"
    what, hint = _memory_context or ("", "use smaller batches or shorter sequences")
    running = f" for {what}" if what else ""
    return f"out of {device} memory{wanted}{running}; {hint}"
