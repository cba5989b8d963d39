"""`python -m tapecli.cli ...` and `torchrun --nproc_per_node N -m tapecli.cli pretrain ...`."""

from tapecli.cli import main

main()
