"""`python -m tapecli.experiments.gpu_check [--cpu] [--out DIR] [--budget-scale X] [--parts P,..] [--pe PE,..]`
(what scripts/gpu-check.sh runs): main(argv) runs the parts and returns the exit code (0: every part done; 1: a part
stopped at its budget or failed; 2: bad arguments), each output line prefixed with the seconds since the start."""

import argparse
import os
import sys
import time
from pathlib import Path

from tapecli.errors import TapeError
from tapecli.experiments.gpu_check import run_gpu_check


def main(argv: list[str] | None = None, print_line=print) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__)
    parser.add_argument("--cpu", action="store_true", help="the same parts at toy sizes on the CPU (seconds)")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="where gpu-check.md and .json go")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every part's time budget (a slower GPU, a loaded CPU); default 1")
    parser.add_argument("--parts", help="comma-separated parts to run (doctor, bench, train, extend); default all")
    parser.add_argument("--pe", help="comma-separated PEs for the doctor, bench and training parts (RoPE stays in the "
                        "last two as their reference); default every registered PE")
    args = parser.parse_args(argv)
    start = time.monotonic()

    def log(text: str) -> None:
        """Each line with the seconds since the start: where the time went is read off the output."""
        for line in text.split("\n"):
            print_line(f"[{time.monotonic() - start:5.0f} s] {line}")

    try:
        report = run_gpu_check(args.cpu, args.out, args.budget_scale, log=log, parts=args.parts, pes=args.pe)
    except TapeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if all(part["status"] == "done" for part in report["parts"].values()) else 1


if __name__ == "__main__":
    code = main(print_line=lambda line: print(line, flush=True))
    # The page is written: leave at once (the interpreter's teardown with torch and transformers loaded takes seconds).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
