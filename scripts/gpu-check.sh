#!/usr/bin/env bash
# Speed and memory evidence for one GPU, within eight minutes: `tape doctor`, `tape bench --precision bf16` for every
# PE at 1K / 8K / 32K on each attention path it can take, training tokens/s and MFU of the c4 recipe's 162M model
# (RoPE, TAPE, ALiBi, FIRE, eager and compiled) beside transformers' Llama, and one `tape extend-context` LoRA step
# on a random ~1.1B Llama at 8K. Each part runs in a process of its own with a time budget
# (tapecli/experiments/gpu_check/__init__.py: BUDGETS): stopped at its budget, it keeps what it finished; one that
# does not answer 20 s after its budget is killed with everything it started (compile workers), so a stuck compile
# cannot hold up the parts after it. What did not fit is printed at the end and listed on the page.
#
#   scripts/gpu-check.sh [--cpu] [--out DIR] [--budget-scale X] [--parts P,..] [--pe PE,..]   # DIR/gpu-check.md, .json
#
# --budget-scale multiplies every part's budget (default 1: an H100 or H200; 2 for a slower GPU or a loaded CPU).
# --parts runs some parts (doctor, bench, train, extend), --pe some PEs (RoPE stays as the bench's and training's
# reference): a second run for what the first left out. --cpu runs the same parts at toy sizes in seconds (the test
# suite runs it). Needs tape installed from this tree (`pip install --no-deps --no-build-isolation -e .` next to a
# preinstalled torch); no network. PYTHON picks the interpreter (default: python).
set -euo pipefail
exec "${PYTHON:-python}" -m tapecli.experiments.gpu_check "$@"
