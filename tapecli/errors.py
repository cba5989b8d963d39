"""The exception types the CLI reports as one line, without a traceback (see `tapecli.faults`), and `how_to_set`,
the fix half of a message about a value that came from a recipe key or a command-line option."""


class TapeError(Exception):
    """Bad input (a recipe key, a file, a value). The message must name the problem in one line."""

    exit_code = 2
    prefix = "error"  # the CLI prints `<prefix>: <message>`


class RunFailed(TapeError):
    """The input was fine but the run failed (a full disk, a file that could not be written)."""

    exit_code = 1


class LossNotFinite(RunFailed):
    """The training loss or the weights became nan or inf; the bad update was not saved."""


class Stopped(TapeError):
    """A run stopped on request (SIGTERM, Ctrl-C) after saving a checkpoint; exits 128 + the signal number."""

    prefix = "stopped"

    def __init__(self, message: str, signal_number: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + signal_number

    def __reduce__(self) -> tuple:  # picklable, so a worker process can report it (tape sweep --jobs)
        return type(self), (str(self), self.exit_code - 128)


def how_to_set(what: str, value: str = "PATH") -> str:
    """How to give `what` another value: `pass data.source=PATH` for a recipe key, `pass --model PATH` for an
    option (anything starting with `-`)."""
    return f"pass {what} {value}" if what.startswith("-") else f"pass {what}={value}"
