"""`python -m tapecli ...`: the same as the `tape` command."""

from tapecli.cli import main

main()
