"""The one exception type for user mistakes: the CLI prints its message as one line and exits with code 2."""


class TapeError(Exception):
    """Bad input (a recipe key, a file, a value). The message must name the problem in one line."""
