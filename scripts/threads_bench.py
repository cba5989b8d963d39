"""How long a tiny model's `tape eval perplexity` (and `tape bench`'s model) takes under each thread setting, on an
idle machine and on one busy with another PyTorch process (docs/speed.md, "Threads on a busy CPU").

    python scripts/threads_bench.py [--repeats 3] [--tokens 40000] [--conditions idle,busy] [--bench] [--out F.json]

Settings, each a fresh `tape` process:
    torch's default    torch imported before tape, so tape leaves OpenMP as it is (every core, spin-waiting: what
                       tape did before it set a wait policy)
    tape's default     every core, OMP_WAIT_POLICY=PASSIVE (what `tape` does unless told otherwise)
    --threads 1        one thread
Idle: nothing else started (on a shared machine, the load printed says how idle it was). Busy: one other process
multiplies 1024 x 1024 matrices on every core with torch's default threads for the whole measurement. Prints the
median wall time of `--repeats` runs per setting, the 1-minute load average before and after each condition, and
the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_FIRST = ("import sys, torch; sys.argv = ['tape', *sys.argv[1:]]; from tapecli.cli import main; main()")
SETTINGS = {"torch's default": ([sys.executable, "-c", TORCH_FIRST], []),
            "tape's default": ([sys.executable, "-m", "tapecli"], []),
            "--threads 1": ([sys.executable, "-m", "tapecli"], ["--threads", "1"])}
LOAD = ("import torch\na = torch.randn(1024, 1024)\nwhile True:\n    a = torch.tanh(a @ a)\n")


def run(prefix: list[str], args: list[str], extra: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run([*prefix, *args, *extra], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--conditions", default="idle,busy", help="idle, busy or both (comma-separated)")
    parser.add_argument("--tokens", type=int, default=40000, help="tokens evaluated (--max-tokens)")
    parser.add_argument("--bench", action="store_true", help="also time `tape bench`'s model (idle only)")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "TAPE_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    tmp = Path(tempfile.mkdtemp(prefix="tape-threads-"))
    words = "the model reads a long sequence of tokens and learns where each one sits relative to the others"
    (tmp / "corpus.txt").write_text("\n".join(f"{words} {i} {words[::-1]}." for i in range(600)))
    subprocess.run([sys.executable, "-m", "tapecli", "pretrain", "--recipe", "c4-smoke", "--out", str(tmp / "run"),
                    f"data.source={tmp / 'corpus.txt'}", "train.max_steps=1", "train.warmup=0"], cwd=REPO, env=env,
                   check=True, capture_output=True)
    evaluation = ["eval", "perplexity", "--model", str(tmp / "run"), "--data", str(tmp / "corpus.txt"),
                  "--seq-len", "32", "--stride", "32", "--max-tokens", str(options.tokens), "--device", "cpu"]
    results: dict = {"cores": len(os.sched_getaffinity(0)), "command": "tape " + " ".join(evaluation)}
    for condition in [c for c in options.conditions.split(",") if c]:
        load = None
        if condition == "busy":
            load = subprocess.Popen([sys.executable, "-c", LOAD], env=env)
            time.sleep(5)
        results[f"{condition} load before"] = os.getloadavg()[0]
        try:
            for name, (prefix, extra) in SETTINGS.items():
                times = []
                for _ in range(options.repeats):
                    out = ["--out", str(tmp / f"eval-{condition}-{len(times)}-{name.replace(' ', '_')}")]
                    times.append(run(prefix, [*evaluation, *out], extra, env))
                results[f"{condition}: {name}"] = round(statistics.median(times), 2)
                print(f"{condition:5} {name:16} {statistics.median(times):7.2f} s  (runs: "
                      f"{', '.join(f'{t:.1f}' for t in times)})", flush=True)
        finally:
            if load is not None:
                load.kill()
                load.wait()
            results[f"{condition} load after"] = os.getloadavg()[0]
    if options.bench:
        bench = ["bench", "--pe", "rope,tape", "--seq-len", "1024", "--steps", "3", "--rounds", "2", "--no-memory",
                 "--device", "cpu"]
        results["bench command"] = "tape " + " ".join(bench)
        for name, (prefix, extra) in SETTINGS.items():
            out = tmp / f"bench-{name.replace(' ', '_')}.json"
            run(prefix, [*bench, "--out", str(out)], extra, env)
            timings = json.loads(out.read_text())["lengths"]["1024"]["median_step_s"]
            results[f"bench idle: {name}"] = timings
            print(f"bench {name:16} " + ", ".join(f"{pe} {s * 1000:.0f} ms" for pe, s in timings.items()), flush=True)
    print(json.dumps(results, indent=1))
    if options.out:
        options.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
