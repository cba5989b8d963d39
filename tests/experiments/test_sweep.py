"""`tape sweep`: a 2 PEs x 2 seeds sweep of the selective-copy smoke recipe runs through the CLI, aggregates what the
cells' own results.json files say, trains each cell exactly as the equivalent `tape pretrain` would, resumes after
a SIGKILL to identical results, and gives the same results through worker processes and through submitit's local
executor (preempted with SIGUSR2 on the way: the engine checkpoints, submitit requeues, the cell resumes)."""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from train_helpers import REPO, assert_same_weights, cli, subprocess_env, weights, write_recipe
from typer.testing import CliRunner

from tapecli.cli import app

runner = CliRunner()
PES, SEEDS = ("rope", "tape"), (0, 1)
# 8 optimizer steps of 4 micro-batches, a checkpoint every 2: long enough to be killed in the middle of a cell.
OVERRIDES = ("train.max_steps=8", "train.save_every=2", "train.eval_every=4", "train.batch_size=16",
             "train.micro_batch_size=4", "train.log_every=1")
CELLS = [f"{pe}-seed{seed}" for seed in SEEDS for pe in PES]  # the order they run in: seed by seed


def sweep_args(out: Path, *extra: str, pes: tuple[str, ...] = PES, seeds: tuple[int, ...] = SEEDS) -> list[str]:
    return ["sweep", "--recipe", "selective-copy-smoke", "--pe", ",".join(pes), "--seeds", ",".join(map(str, seeds)),
            "--out", str(out), *extra, *OVERRIDES]


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def cells_of(out: Path) -> dict[str, dict]:
    return {cell["name"]: cell for cell in json.loads((out / "results.json").read_text())["cells"]}


def assert_same_cells(out: Path, reference: Path, names: list[str] = CELLS) -> None:
    """Same scores, losses and final weights, cell by cell (training time aside)."""
    got, want = cells_of(out), cells_of(reference)
    assert sorted(got) == sorted(names)
    for name in names:
        for key in ("scores", "pe", "seed"):
            assert got[name][key] == want[name][key], name
        for key in ("loss", "val_loss", "step", "parameters"):
            assert got[name]["train"][key] == want[name]["train"][key], (name, key)
        assert_same_weights(weights(out / name), weights(reference / name))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread, as in the subprocesses (subprocess_env) and the worker processes: the tiny models train faster
    that way on a shared CPU, and every run of a cell computes the same way."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sweep run once, uninterrupted, in this process: (its directory, what it printed)."""
    out = tmp_path_factory.mktemp("sweep") / "ref"
    return out, invoke(*sweep_args(out))


def test_sweep_trains_evaluates_and_aggregates_the_cells_own_results(reference):
    out, printed = reference
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")) == sorted(CELLS)
    assert "±" in printed and "rope" in printed and "tape" in printed and (out / "accuracy.png").is_file()
    results = json.loads((out / "results.json").read_text())
    assert results["missing"] == [] and results["evaluation"]["splits"] == ["iid", "ood-dense", "ood-sparse"]
    # Recompute every group's statistics from the cells' own evaluation files.
    for group in results["groups"]:
        own = [json.loads((out / f"{group['pe']}-seed{seed}" / "eval-synthetic" / "step-00000008" / "results.json")
                          .read_text()) for seed in SEEDS]
        assert group["seeds"] == list(SEEDS)
        for split in results["evaluation"]["splits"]:
            for metric in ("accuracy", "token_accuracy"):
                values = [r["splits"][split][metric] for r in own]
                got = group["scores"][split][metric]
                assert got["n"] == 2 and got["min"] == min(values) and got["max"] == max(values)
                assert math.isclose(got["mean"], sum(values) / 2, abs_tol=1e-12)
                assert math.isclose(got["std"], abs(values[0] - values[1]) / math.sqrt(2), abs_tol=1e-12)
        losses = [json.loads(line)["loss"] for seed in SEEDS for line in
                  (out / f"{group['pe']}-seed{seed}" / "metrics.jsonl").read_text().splitlines()
                  if '"loss"' in line and json.loads(line)["step"] == 8]
        assert math.isclose(group["train"]["loss"]["mean"], statistics.fmean(losses), abs_tol=1e-12)
    # The cells record the sweep command (it resumes them all); --report redoes the aggregation from the files.
    recorded = json.loads((out / "rope-seed1" / "run.json").read_text())["command"]
    assert recorded == shlex.join(["tape", *sweep_args(out)])
    before = (out / "results.json").read_text()
    (out / "results.json").unlink()
    assert "±" in invoke("sweep", "--report", str(out))
    assert (out / "results.json").read_text() == before


def test_a_cell_is_exactly_what_its_tape_pretrain_command_trains(reference, tmp_path):
    out, _ = reference
    listed = invoke(*sweep_args(out, "--dry-run"))
    assert "(finished)" in listed and "(new)" not in listed
    command = next(line.strip() for line in listed.splitlines() if line.strip().startswith("tape pretrain")
                   and "/tape-seed1 " in line)
    assert command.endswith(" ".join([*OVERRIDES, "model.pe=tape", "train.seed=1"]))
    args = shlex.split(command.replace(str(out / "tape-seed1"), str(tmp_path / "alone")))
    invoke(*args[1:])
    assert (tmp_path / "alone" / "recipe.yaml").read_text() == (out / "tape-seed1" / "recipe.yaml").read_text()
    assert_same_weights(weights(tmp_path / "alone"), weights(out / "tape-seed1"))


@pytest.mark.slow
def test_a_killed_sweep_resumes_to_identical_results(reference, tmp_path):
    out = tmp_path / "killed"
    proc = subprocess.Popen(cli(*sweep_args(out)), cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    second = False
    for line in proc.stdout:  # the engine's plain log lines: "step 3/8 | loss ..."
        second = second or "tape-seed0 (2/4)" in line
        if second and line.startswith("step 3/8"):
            proc.send_signal(signal.SIGKILL)  # in the middle of the second cell, after its step-2 checkpoint
            break
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL and not (out / "results.json").exists()

    printed = invoke(*sweep_args(out))  # the same command
    assert "1 finished" in printed and "1 to continue" in printed and "2 new" in printed
    assert "resuming from" in printed
    assert_same_cells(out, reference[0])


@pytest.mark.slow
def test_worker_processes_stop_on_ctrl_c_and_resume_to_the_same_results(reference, tmp_path):
    out = tmp_path / "jobs"
    args = sweep_args(out, "--jobs", "2", pes=("rope",))
    proc = subprocess.Popen(cli(*args), cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    checkpoints = [out / f"rope-seed{seed}" / "checkpoints" / "step-00000002" for seed in SEEDS]
    deadline = time.time() + 300
    while not any(p.exists() for p in checkpoints) and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole process group
    printed, _ = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGINT and "stopped: SIGINT after step" in printed, printed
    assert f"resume with: {shlex.join(['tape', *args])}" in printed and "Traceback" not in printed

    printed = invoke(*args)  # the same command
    assert "2 at a time" in printed and "resuming from" in (out / "logs" / "rope-seed0.log").read_text() + \
        (out / "logs" / "rope-seed1.log").read_text()
    assert_same_cells(out, reference[0], ["rope-seed0", "rope-seed1"])


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_submitit_local_executor_runs_requeues_a_preempted_cell_and_gives_the_same_results(reference, tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "submitit"
    cells = ["rope-seed0", "tape-seed0"]  # two jobs (seed 0 of each PE): each cell is one job, whatever their number
    proc = subprocess.Popen(cli(*sweep_args(out, "--executor", "submitit-local", seeds=(0,))), cwd=REPO,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    submitted = next(line for line in proc.stdout if line.startswith("submitted 2 jobs"))
    jobs = dict(pair.split("=") for pair in submitted.split(": ", 1)[1].split(";")[0].split(", "))
    assert sorted(jobs) == cells
    # Preempt the rope-seed0 job once it has a checkpoint: SIGUSR2, as sbatch --signal would send before a kill.
    first = out / "rope-seed0" / "checkpoints" / "step-00000002"
    deadline = time.time() + 300
    while not first.exists() and time.time() < deadline:
        time.sleep(0.02)
    for task in _children(int(jobs["rope-seed0"])):
        os.kill(task, signal.SIGUSR2)
    rest, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, submitted + rest
    log = "\n".join(p.read_text() for p in (out / "submitit" / jobs["rope-seed0"]).glob("*_log.*"))
    assert "Requeued job" in log and "resuming from" in log, log
    assert_same_cells(out, reference[0], cells)


def test_sweep_refuses_bad_input_before_training(reference, tmp_path):
    out, _ = reference
    cases = [
        (sweep_args(tmp_path / "a", pes=("rope", "bogus")), "bogus"),
        ([*sweep_args(tmp_path / "a"), "model.pe=alibi"], "--pe"),
        ([*sweep_args(tmp_path / "a", "--grid", "train.lr=1e-3,2e-3"), "train.lr=1e-3"], "--grid"),
        (sweep_args(tmp_path / "a", "--grid", "train.seed=1,2"), "--seeds"),
        (sweep_args(tmp_path / "a", "--grid", "data.source=a/b"), "directory"),
        (sweep_args(tmp_path / "a", "--seeds", "one"), "--seeds"),
        (sweep_args(tmp_path / "a", "--executor", "bogus"), "--executor"),
        (sweep_args(tmp_path / "a", "--executor", "slurm", "--jobs", "2"), "--jobs"),
        (["sweep", "--report", str(tmp_path)], "not a sweep directory"),
        (["sweep", "--pe", "rope", "--out", str(tmp_path / "a")], "--recipe"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    assert not (tmp_path / "a").exists()
    # A trained cell with another recipe: one line naming the key; nothing is touched.
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    args = [a.replace(str(out), str(copy)) for a in sweep_args(out)]
    result = runner.invoke(app, [*args[:-1], "train.log_every=2"])
    assert result.exit_code == 2 and "train.log_every=1" in result.output and "another --out" in result.output
    assert (copy / "results.json").read_text() == (out / "results.json").read_text()


def test_grid_cells_are_named_and_overridden_in_order(tmp_path):
    printed = invoke("sweep", "--recipe", "selective-copy-smoke", "--pe", "rope", "--seeds", "3", "--grid",
                     "train.lr=1e-3,2e-3", "--grid", "model.n_layers=1", "--out", str(tmp_path / "g"), "--dry-run",
                     "train.max_steps=2")
    assert not (tmp_path / "g").exists()
    for lr in ("1e-3", "2e-3"):
        name = f"rope-seed3-train.lr={lr}-model.n_layers=1"
        assert f"{name} (new)" in printed
        assert (f"tape pretrain --recipe selective-copy-smoke --out {tmp_path / 'g' / name} train.max_steps=2 "
                f"model.pe=rope train.seed=3 train.lr={lr} model.n_layers=1") in printed
        assert f"tape eval synthetic --model {tmp_path / 'g' / name}" in printed


def test_pe_specs_carry_pe_args_into_their_cells(tmp_path):
    """--pe rope:hope=true is the recipe with model.pe=rope and model.pe_args.hope=true; its cell directory spells
    `:` as `+`; an unknown pe_args key is one line."""
    printed = invoke("sweep", "--recipe", "selective-copy-smoke", "--pe", "rope,rope:hope=true:frequency_fraction=0.5",
                     "--out", str(tmp_path / "s"), "--dry-run")
    name = "rope+hope=true+frequency_fraction=0.5-seed0"
    assert f"{name} (new)" in printed and "rope-seed0 (new)" in printed
    assert (f"tape pretrain --recipe selective-copy-smoke --out {tmp_path / 's' / name} model.pe=rope "
            "model.pe_args.hope=true model.pe_args.frequency_fraction=0.5 train.seed=0") in printed
    from tapecli.experiments.sweep.cells import SweepSpec, plan

    cell = plan(SweepSpec("selective-copy-smoke", (), ("rope:hope=true",), (0,), (), tmp_path / "s"), [])[0]
    assert cell.load_recipe().model.pe_args == {"hope": True} and cell.label == "rope:hope=true"
    result = runner.invoke(app, ["sweep", "--recipe", "selective-copy-smoke", "--pe", "rope:hop=true", "--out",
                                 str(tmp_path / "t"), "--dry-run"])
    assert result.exit_code == 2 and "model.pe_args.hop: not an argument of pe 'rope'" in result.output
    assert result.output.count("\n") == 1


def test_a_text_recipe_is_judged_by_its_validation_perplexity(tiny_corpus, tmp_path):
    recipe = write_recipe(tmp_path / "text.yaml", tiny_corpus)
    out = tmp_path / "text"
    printed = invoke("sweep", "--recipe", str(recipe), "--pe", "rope,alibi", "--out", str(out))
    assert "perplexity" in printed and (out / "perplexity.png").is_file()
    for cell in json.loads((out / "results.json").read_text())["cells"]:
        rows = [json.loads(line) for line in (out / cell["name"] / "metrics.jsonl").read_text().splitlines()]
        val_loss = [row["val_loss"] for row in rows if "val_loss" in row and row["step"] == 4][-1]
        assert cell["scores"] == {"validation": {"perplexity": math.exp(val_loss)}}


def test_a_grid_over_layer_layouts(tmp_path):
    """`--grid model.schedule.pattern=rope,rope+nope`: an all-RoPE and a hybrid cell, trained, evaluated by the
    synthetic task (cached generation through the hybrid's layers) and recorded with their layouts."""
    out = tmp_path / "layouts"
    invoke("sweep", "--recipe", "selective-copy-smoke", "--pe", "rope", "--grid",
           "model.schedule.pattern=rope,rope+nope", "--out", str(out), "train.max_steps=2")
    cells = {cell["name"]: cell for cell in json.loads((out / "results.json").read_text())["cells"]}
    assert set(cells) == {"rope-seed0-model.schedule.pattern=rope", "rope-seed0-model.schedule.pattern=rope+nope"}
    hybrid = out / "rope-seed0-model.schedule.pattern=rope+nope"
    config = json.loads(next((hybrid / "checkpoints").glob("step-*/model_config.json")).read_text())
    assert config["schedule"] == {"pattern": "rope+nope"}
    assert all(cell["scores"] for cell in cells.values())
