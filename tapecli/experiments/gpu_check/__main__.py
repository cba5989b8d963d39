"""`python -m tapecli.experiments.gpu_check [--cpu] [--out DIR]` (what scripts/gpu-check.sh runs)."""

import argparse
import os
import sys
import time
from pathlib import Path

from tapecli.errors import TapeError
from tapecli.experiments.gpu_check import run_gpu_check

parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
parser.add_argument("--cpu", action="store_true", help="the same parts at toy sizes on the CPU (seconds)")
parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="where gpu-check.md and .json go")
parser.add_argument("--budget-scale", type=float, default=1.0,
                    help="multiply every part's time budget (a slower GPU, a loaded CPU); default 1")
args = parser.parse_args()
start = time.monotonic()


def log(text: str) -> None:
    """Each line with the seconds since the start: where the time went is read off the output."""
    for line in text.split("\n"):
        print(f"[{time.monotonic() - start:5.0f} s] {line}", flush=True)


try:
    report = run_gpu_check(args.cpu, args.out, args.budget_scale, log=log)
except TapeError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
# The page is written: leave at once (the interpreter's teardown with torch and transformers loaded takes seconds).
sys.stdout.flush()
sys.stderr.flush()
os._exit(0 if all(part["status"] == "done" for part in report["parts"].values()) else 1)
