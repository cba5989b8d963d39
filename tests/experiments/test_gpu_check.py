"""scripts/gpu-check.sh: its --cpu mode runs every part at toy sizes and writes the page (each part's section, its
budget and status, what was skipped); the pieces the GPU run relies on (which forced attention paths a variant
may take, what a stopped part lists as skipped, each part in a process of its own: a stuck one killed with all it
started, a crash, a soft stop) are checked directly, the processes on tiny fake parts."""

from __future__ import annotations

import functools
import gc
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_helpers import REPO, subprocess_env

from tapecli.experiments import gpu_check
from tapecli.experiments.bench import forced_applies
from tapecli.experiments.gpu_check import isolate, page
from tapecli.experiments.gpu_check.__main__ import main
from tapecli.model import PE_NAMES

CPU = torch.device("cpu")


def test_cpu_mode_writes_the_page(tmp_path) -> None:
    """The script's `main` in this process (which has imported torch and transformers already, as the suite's
    other tests do; the script itself is run below): the parts still run in processes of their own."""
    lines, threads, columns = [], torch.get_num_threads(), os.environ.get("COLUMNS")
    torch.set_num_threads(2)  # (a value the CPU mode's one thread differs from)
    try:
        code = main(["--cpu", "--out", str(tmp_path)], lines.append)
        # This process is left as it was found: threads, COLUMNS, no objects frozen out of the collector.
        assert (torch.get_num_threads(), os.environ.get("COLUMNS"), gc.get_freeze_count()) == (2, columns, 0)
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    statuses = {name: part["status"] for name, part in report["parts"].items()}
    assert list(statuses) == ["doctor", "bench", "train", "extend"]
    # A part stopped at its budget (a loaded machine) is a skip the page names, and the exit code says so.
    assert code == (0 if set(statuses.values()) == {"done"} else 1), statuses
    assert report["mode"] == "cpu (toy sizes)" and report["pes"] == list(PE_NAMES)
    text = (tmp_path / "gpu-check.md").read_text()
    for title in page.TITLES.values():
        assert f"## {title}" in text
    assert "## Skipped" in text and lines[-1].split(" s] ", 1)[1].startswith("skipped: ")
    assert any(line.endswith("] == train (budget 8 s)") for line in lines)
    doctor = report["parts"]["doctor"]
    if doctor["status"] == "done":
        assert doctor["result"]["failed"] == [] and "rope:" in doctor["result"]["text"]
    rows = report["parts"]["train"]["result"].get("rows", {})
    if "rope" in rows:
        assert rows["rope"]["tokens_per_s"] > 0 and rows["rope"]["mfu"] is None  # no peak FLOP/s for a CPU
    extend = report["parts"]["extend"]
    if extend["status"] == "done":
        row = extend["result"]
        assert row["tokens"] == 64 and row["peak_bytes"] > 0 and row["step_s"] > 0
        assert "predicted for a 7B base" in text


def test_the_script_runs_the_module_and_refuses_bad_arguments_in_one_line(tmp_path) -> None:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "--cpu", "--budget-scale", "0", "--out",
                           str(tmp_path / "page")], cwd=REPO, env=subprocess_env() | {"PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "error: --budget-scale must be a positive number, got 0.0\n"
    assert not (tmp_path / "page").exists()


def test_parts_and_pes_chosen_run_alone_with_rope_as_the_reference(tmp_path, capsys) -> None:
    """--parts bench --pe alibi: the bench part alone, ALiBi beside RoPE (the ratios' reference); unknown names are
    refused in one line naming the choices."""
    lines = []
    main(["--cpu", "--parts", "bench", "--pe", "alibi", "--out", str(tmp_path)], lines.append)
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert list(report["parts"]) == ["bench"] and report["pes"] == ["alibi"]
    lengths = report["parts"]["bench"]["result"]["lengths"]
    assert {label for entry in lengths.values() for label in entry["median_step_s"]} == {
        "rope", "rope on chunked", "alibi", "alibi on dense"}
    assert not any("== doctor" in line or "== train" in line for line in lines)
    assert gpu_check.train_pes(["alibi", "cope"]) == ("rope", "alibi")  # RoPE: the one compared with the Llama
    assert gpu_check.train_pes(None) == gpu_check.TRAIN_PES == ("rope", "tape", "alibi", "fire")
    assert main(["--cpu", "--parts", "bench,fast", "--out", str(tmp_path / "x")], lines.append) == 2
    assert main(["--cpu", "--pe", "alibi,kerple", "--out", str(tmp_path / "y")], lines.append) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --parts 'bench,fast': unknown fast; choose from doctor, bench, train, extend",
        f"error: --pe 'alibi,kerple': unknown kerple; choose from {', '.join(PE_NAMES)}"]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_forced_paths_a_variant_may_take() -> None:
    assert forced_applies("dense", {"chunked"}, CPU)  # ALiBi: its bias materialised
    assert forced_applies("chunked", {"sdpa"}, CPU)  # RoPE through the chunked kernel
    assert not forced_applies("dense", {"sdpa"}, CPU)  # without a bias, dense is SDPA's causal call again
    assert not forced_applies("sdpa", {"chunked"}, CPU)  # a bias PE on plain SDPA would be `dense`
    assert not forced_applies("chunked", {"chunked"}, CPU)  # the path it takes anyway
    assert not forced_applies("dense", {"cope-recompute"}, CPU)  # attention of its own ignores a forced path
    assert not forced_applies("flex", {"sdpa"}, CPU)  # FlexAttention trains on CUDA only
    assert not forced_applies("flash-attn", {"sdpa"}, CPU)
    assert not forced_applies("sdpa-concat", {"sdpa"}, CPU)  # TAPE's own paths are chosen by its pe_args


def test_a_stopped_part_names_what_it_left_out() -> None:
    report = {"parts": {
        "bench": {"status": "stopped at its budget of 180 s",
                  "result": {"lengths": {"1024": {}}, "skipped": {"1024": ["cope", "path on dense"]}}},
        "train": {"status": "done", "result": {"variants": ["rope", "tape", "rope, compiled", "tape, compiled"],
                                               "rows": {"rope": {}}, "failed": {"tape": "boom"}}}}}
    assert page.skipped(report, {"bench": [1024, 8192]}) == [
        "bench: stopped at its budget of 180 s", "bench at T = 1024: cope; path on dense",
        "bench at T = 8192: every PE", "train: rope, compiled; tape, compiled"]


def test_the_training_section_says_what_was_compiled_ahead_above_its_table() -> None:
    row = {"attention": "sdpa", "step_s": 0.0266, "tokens_per_s": 307411.0, "mfu": 0.275, "params": 162_400_000}
    train = {"warm_line": "compiled ahead in 8 processes (61 s): 9 ok, 1 not finished", "shape": "12 layers",
             "rows": {"rope, compiled": row}, "failed": {}}
    report = {"hardware": "H200", "mode": "gpu", "commit": "abc", "torch": "2.11", "date": "today", "pes": ["rope"],
              "lengths": {"bench": []}, "parts": {"train": {"status": "done", "budget_s": 150, "seconds": 140,
                                                            "result": train}}}
    text = page.render(report)
    assert ("## Training throughput: the `c4` model (tape) beside transformers' Llama\n\n"
            "compiled ahead in 8 processes (61 s): 9 ok, 1 not finished\n\n12 layers\n\n"
            "| model | attention | ms / step | tokens / s | MFU | parameters |\n|---|---|---|---|---|---|\n"
            "| rope, compiled | sdpa | 26.6 | 307,411 | 27.5 % | 162.4M |\n") in text


# Fake parts, fn(deadline, result, log) as isolate.run_part calls them in the child.
def stuck(pids: Path, _deadline, result, log) -> None:
    """Stuck where SIGALRM does not reach (as in a compile), with a process of its own started."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    grandchild = subprocess.Popen(["sleep", "60"])
    pids.write_text(f"{os.getpid()} {grandchild.pid}")
    result["partial"] = 1
    log("started")
    time.sleep(60)


def raises(_deadline, _result, _log) -> None:
    raise ValueError("boom")


def ends(how: str, _deadline, _result, _log) -> None:
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def slow(_deadline, result, log) -> None:
    result["rows"] = ["first"]
    log("first row")
    time.sleep(60)


def swallows(_deadline, result, _log) -> None:
    """Catches the first OverBudget, as dynamo does when it arrives mid-compile (and runs the frame eagerly)."""
    try:
        time.sleep(60)
    except BaseException:  # noqa: BLE001 - the point of this fake part
        result["swallowed"] = True
    time.sleep(60)


def gone(pid: int) -> bool:
    """No such process, or only its zombie (a grandchild waits for whoever adopted it to reap it)."""
    for _ in range(50):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_a_stuck_part_is_killed_with_what_it_started(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(isolate, "GRACE_S", 0.5)
    lines = []
    start = time.monotonic()
    entry = isolate.run_part("stuck", 0.3, functools.partial(stuck, tmp_path / "pids"), lines.append, "fork")
    assert time.monotonic() - start < 10
    assert entry["status"] == "killed: no answer 0.5 s after its budget" and entry["result"] == {}
    assert lines == ["started", "stuck: killed: no answer 0.5 s after its budget (" + f"{entry['seconds']:.1f} s of 0)"]
    assert all(gone(int(pid)) for pid in (tmp_path / "pids").read_text().split())


def test_a_parent_stopped_by_sigterm_stops_its_part_first() -> None:
    script = """if True:
        import os, subprocess, time
        from tapecli.experiments.gpu_check import isolate

        def part(_deadline, _result, log):
            log(f"{os.getpid()} {subprocess.Popen(['sleep', '60']).pid}")
            time.sleep(60)

        isolate.run_part("part", 60, part, lambda line: print(line, flush=True), "fork")
    """
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env())
    pids = parent.stdout.readline().split()
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) == 128 + signal.SIGTERM
    assert len(pids) == 2 and all(gone(int(pid)) for pid in pids)


@pytest.mark.parametrize(("fn", "status"), [
    (raises, "failed: ValueError: boom"),
    (functools.partial(ends, "exit"), "failed: the process ended with exit code 3"),
    (functools.partial(ends, "kill"), "failed: the process ended with signal SIGKILL"),
])
def test_a_part_that_fails_or_dies_says_how(fn, status) -> None:
    entry = isolate.run_part("part", 5, fn, lambda _: None, "fork")
    assert entry["status"] == status and entry["result"] == {}


def test_a_part_stopped_at_its_budget_keeps_its_partial_result() -> None:
    lines = []
    entry = isolate.run_part("slow", 0.4, slow, lines.append, "fork")
    assert entry["status"] == "stopped at its budget of 0 s" and entry["result"] == {"rows": ["first"]}
    assert lines[0] == "first row" and 0.4 <= entry["seconds"] < 5


def test_a_part_that_swallows_the_alarm_is_stopped_by_the_next(monkeypatch) -> None:
    monkeypatch.setattr(isolate, "ALARM_AGAIN_S", 0.1)
    monkeypatch.setattr(isolate, "GRACE_S", 1.0)
    entry = isolate.run_part("part", 0.2, swallows, lambda _: None, "fork")
    assert entry["status"] == "stopped at its budget of 0 s" and entry["result"] == {"swallowed": True}


def test_the_gpu_parts_reach_a_spawned_child(capfd) -> None:
    """On the GPU the parts are pickled into a fresh interpreter: each must pickle as run_gpu_check builds it, and
    a spawned child runs one (here print: it prints its three arguments) and answers."""
    for part in gpu_check.PARTS.values():
        fn = functools.partial(part, False, gpu_check.GPU, torch.device("cuda"))
        assert pickle.loads(pickle.dumps(fn)).args == fn.args
    entry = isolate.run_part("print", 30, print, lambda _: None, "spawn")
    assert entry["status"] == "done" and entry["result"] == {}
    assert "{} <function" in capfd.readouterr().out


def test_a_parts_output_reaches_the_log_line_by_line_as_it_is_written() -> None:
    seen, result = [], {}

    def part():
        print("one")
        print("two", end="")
        assert seen == ["one"]  # the first line was logged while the part ran
        raise KeyError("stopped")

    with pytest.raises(KeyError):
        gpu_check.captured(part, seen.append, result)
    assert seen == ["one", "two"] and result["text"] == "one\ntwo"


def test_kernels_are_compiled_ahead_by_parallel_workers_that_end_before_the_bench() -> None:
    """warm.py (the GPU bench's first half): one worker per PE takes it through every length, on its own path and
    forced onto each other path that applies; a failing step is named, a worker still running at the deadline is
    killed, and a PE never reached says so. On the CPU nothing compiles: the workers' steps are what is checked."""
    from tapecli.experiments.bench import bench_variants
    from tapecli.experiments.gpu_check import warm

    sizes = {**gpu_check.CPU["bench"], "precision": gpu_check.PRECISION}
    variants = bench_variants(["alibi"], tape_paths=False)[1:] + [("broken", "alibi", {"slope": 2}, {})]
    jobs = warm.bench_jobs(variants, sizes, "cpu")
    statuses = warm.warm(jobs, time.monotonic() + 60, processes=2)
    assert statuses["alibi"] == "ok: 3 steps"  # 32 tokens on the chunked path, then forced on dense; 64 tokens
    assert statuses["broken"].startswith("failed: broken at 32: ") and "slope" in statuses["broken"]
    assert warm.summary(statuses, 2, 4.2) == f"compiled ahead in 2 processes (4 s): 1 ok, 1 failed; broken: " \
                                              f"{statuses['broken']}"
    start = time.monotonic()
    stopped = warm.warm(jobs, time.monotonic() + 0.3, processes=1)
    assert stopped == {"alibi": "not finished", "broken": "not started"} and time.monotonic() - start < 5


def test_the_training_variants_are_compiled_ahead_as_they_are_timed() -> None:
    """The training part's compile-ahead jobs: every variant it times, the compiled ones first; a worker runs one
    variant's first step as train_speed takes it (on the CPU through dynamo's eager backend), a failing one is
    named."""
    from tapecli.experiments.gpu_check import train_speed, warm

    sizes = {**gpu_check.CPU["train"], "compile_others": True}
    jobs = train_speed.warm_jobs(("rope", "alibi"), sizes, "cpu")
    assert list(jobs) == ["rope, compiled", "transformers Llama, compiled", "alibi, compiled", "rope",
                          "transformers Llama", "alibi"]
    assert jobs["alibi, compiled"]["variant"] == ["alibi, compiled", "alibi", True]
    assert [label for label, _, _ in train_speed.variants(("rope", "alibi"), sizes)] == [
        "rope", "transformers Llama", "rope, compiled", "transformers Llama, compiled", "alibi", "alibi, compiled"]
    broken = {**jobs["alibi"], "variant": ["broken", "no-such-pe", False]}
    statuses = warm.warm({"alibi, compiled": jobs["alibi, compiled"], "broken": broken}, time.monotonic() + 60, 2)
    assert statuses["alibi, compiled"] == "ok: 1 steps"
    assert statuses["broken"].startswith("failed: broken: ") and "no-such-pe" in statuses["broken"]


def test_the_doctor_checks_in_worker_processes_as_it_checks_alone(capsys) -> None:
    """gpu-check's doctor on a GPU: its rows checked in spawned worker processes at once (each compiling its own
    kernels) give the report the doctor gives alone, in the same order, a failing row included."""
    from tapecli.experiments import doctor

    def report(processes: int) -> tuple:
        r = doctor.run_doctor("cpu", ["rope", "alibi", "no-such-pe"], hybrids=False, compile_check=False,
                              processes=processes)
        lines = [line.rsplit("  ", 1)[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
        return r["failed"], {name: (c["ok"], c.get("paths"), c.get("error"), [(o.name, o.ok, o.number)
                                                                              for o in c.get("checks", {}).values()])
                             for name, c in r["checks"].items()}, lines[-3:]

    alone, together = report(1), report(2)
    assert together == alone and alone[0] == ["no-such-pe"] and list(alone[1]) == ["rope", "alibi", "no-such-pe"]
    assert alone[1]["alibi"][0] and alone[1]["alibi"][3][0][0] == "dense"
