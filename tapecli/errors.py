"""The exception types the CLI reports as one line, without a traceback."""


class TapeError(Exception):
    """Bad input (a recipe key, a file, a value). The message must name the problem in one line."""

    exit_code = 2


class LossNotFinite(TapeError):
    """The training loss became nan or inf; the bad update was not applied and nothing was saved."""

    exit_code = 1  # the input was fine; the run failed
