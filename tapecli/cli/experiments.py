"""`tape sweep`, `tape demo`, `tape bench` and `tape doctor`: the packaged experiments (tapecli.experiments)."""

from __future__ import annotations

from pathlib import Path

import typer

from tapecli import commas, trust
from tapecli.cli.options import integer, numbers
from tapecli.cli.pe_names import builtin_pes
from tapecli.errors import TapeError


class Seeds(tuple):
    """Comma-separated seeds, e.g. 0,1,2 (parsed by `_seeds`)."""


def _seeds(text: str) -> Seeds:
    try:
        parts = commas.split(text, "seeds")  # no empty or repeated entry
    except TapeError as e:
        raise typer.BadParameter(str(e).removeprefix("seeds").lstrip(": ")) from None
    try:
        seeds = [int(part) for part in parts]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers (e.g. 0,1,2), got {text!r}") from None
    if not seeds or min(seeds) < 0:
        raise typer.BadParameter(f"expected comma-separated integers >= 0 (e.g. 0,1,2), got {text!r}")
    return Seeds(dict.fromkeys(seeds))


def sweep(
    overrides: list[str] | None = typer.Argument(None, help="Recipe overrides for every cell, as key=value (e.g. train.max_steps=500).", show_default=False),
    recipe: str | None = typer.Option(None, "--recipe", help="A shipped recipe name or a YAML file.", show_default=False),
    pe: str | None = typer.Option(None, "--pe", help="PEs to compare, comma-separated (e.g. rope,tape,alibi; a plugin's name or FILE.py:CLASS too); a PE may carry pe_args as name:key=value[:key=value] (e.g. rope:hope=true).", show_default=False),
    seeds: Seeds = typer.Option("0", "--seeds", parser=_seeds, metavar="N,N,...", help="Seeds (train.seed), comma-separated, e.g. 0,1,2."),
    grid: list[str] | None = typer.Option(None, "--grid", help="Also vary a recipe key: key=value1,value2 (repeatable; every combination is a cell).", show_default=False),
    out: Path | None = typer.Option(None, "--out", help="Sweep directory: one run directory per cell, sweep.json, results.json, the chart.", show_default=False),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the cells, their state and their equivalent tape pretrain / tape eval commands; run nothing."),
    report: Path | None = typer.Option(None, "--report", help="Aggregate the finished cells of this sweep directory again (table, results.json, chart); train nothing.", show_default=False),
    executor: str = typer.Option("local", "--executor", help="local (this machine), slurm (one submitit job per cell) or submitit-local (the same jobs as local processes, to try a cluster sweep here)."),
    jobs: int = integer(1, "--jobs", min=1, help="local: cells run at once, each in its own process (output in DIR/logs/)."),
    slurm_partition: str | None = typer.Option(None, "--slurm-partition", help="slurm: the partition.", show_default=False),
    gpus_per_job: int = integer(1, "--gpus-per-job", min=0, help="slurm: GPUs per cell; more than 1 trains with one process per GPU (DDP); 0 for CPU nodes."),
    cpus_per_job: int | None = integer(None, "--cpus-per-job", min=1, help="slurm: CPUs per process (default: the cluster's).", show_default=False),
    time_limit: int = integer(240, "--time-limit", min=1, help="slurm: minutes per job; a job that reaches it saves a checkpoint and is requeued."),
    slurm_arg: list[str] | None = typer.Option(None, "--slurm-arg", help="slurm: an extra sbatch option as key=value, e.g. account=myproject, qos=high, constraint=a100 (repeatable).", show_default=False),
) -> None:
    """Train and evaluate a grid of PEs x seeds (x --grid values) and report mean ± std over seeds.

    Each cell DIR/<pe>-seed<k> (plus -key=value per --grid key) is trained exactly as `tape pretrain --recipe R --out DIR/<cell> OVERRIDES model.pe=<pe> train.seed=<k>` (plus the grid's key=value) would train it, then evaluated by the recipe's data kind: synthetic tasks as `tape eval synthetic` (whole-sequence / per-token accuracy per split), addition as `tape eval addition` (grid, inside / outside the training box), babilong as `tape eval babilong` (the accuracy per length, on the recipe's eval keys), text and pairs by the validation perplexity exp(val_loss) the engine logged at the last step.

    Then one table (mean ± std and min-max over seeds per PE and split), DIR/results.json and a bar chart with min-max whiskers; `--report DIR` redoes this from the cells' files.

    Interrupted or killed? Run the same command again: finished cells are skipped, partly trained ones continue exactly where their last checkpoint left them.

    Examples: tape sweep --recipe selective-copy-smoke --pe rope,tape --seeds 0,1 --out runs/sweep ; tape sweep --recipe selective-copy --pe rope,tape,cope --seeds 0,1,2 --out runs/sc --executor slurm --slurm-partition gpu --gpus-per-job 1 ; tape sweep --report runs/sc
    """
    from tapecli.experiments.sweep import SweepSpec, parse_grid, parse_list, report_sweep, run_sweep

    if report is not None:
        if recipe or pe or out or overrides or grid:
            raise TapeError("--report DIR aggregates DIR/sweep.json's cells; it takes no --recipe, --pe, --grid, "
                            "--out or overrides")
        report_sweep(report)
        return
    for name, value in (("--recipe", recipe), ("--pe", pe), ("--out", out)):
        if not value:
            raise TapeError(f"{name} is required (or --report DIR to aggregate a finished sweep)")
    spec = SweepSpec(recipe, tuple(overrides or ()), parse_list(pe, "--pe"), tuple(seeds), parse_grid(grid or []), out)
    trust.allow_named([*spec.overrides, *spec.pes])  # plugin PEs named here may be imported, by the cells too
    runs_on = _executor(executor, jobs, slurm_partition, gpus_per_job, cpus_per_job, time_limit, slurm_arg)
    # What resumes the sweep (recorded in each cell's run.json, printed when it is stopped): this command, with the
    # options that differ from their defaults.
    options = [("--executor", executor, "local"), ("--jobs", jobs, 1), ("--slurm-partition", slurm_partition, None),
               ("--gpus-per-job", gpus_per_job, 1), ("--cpus-per-job", cpus_per_job, None),
               ("--time-limit", time_limit, 240), *(("--slurm-arg", entry, None) for entry in slurm_arg or [])]
    command = ["tape", "sweep", "--recipe", recipe, "--pe", pe, "--seeds", ",".join(map(str, seeds)),
               *(arg for entry in grid or [] for arg in ("--grid", entry)), "--out", str(out),
               *(arg for name, value, default in options if value != default for arg in (name, str(value))),
               *(overrides or [])]
    run_sweep(spec, runs_on, command, dry_run=dry_run)


def _executor(name: str, jobs: int, partition: str | None, gpus: int, cpus: int | None, time_limit: int,
              slurm_args: list[str] | None):
    """The --executor and its options, checked (their ranges are checked where they are parsed)."""
    from tapecli.experiments.sweep.executors import Processes, Sequential, Submitit

    if name == "local":
        if partition or slurm_args:
            raise TapeError("--slurm-partition and --slurm-arg apply to --executor slurm")
        return Processes(jobs) if jobs > 1 else Sequential()
    if name not in ("slurm", "submitit-local"):
        raise TapeError(f"--executor: expected local, slurm or submitit-local, got {name!r}")
    if jobs != 1:
        raise TapeError("--jobs applies to --executor local (a cluster runs every cell's job at once)")
    sbatch = {}
    for entry in slurm_args or []:
        key, sep, value = entry.partition("=")
        if not sep or not key.strip():
            raise TapeError(f"--slurm-arg {entry!r} must look like key=value (e.g. account=myproject)")
        sbatch[key.strip()] = value
    return Submitit("slurm" if name == "slurm" else "local", partition, gpus, cpus, time_limit, sbatch)


def demo(
    pe: str = typer.Option("", "--pe", help="More PEs to compare, comma-separated (e.g. nope,fire, or with pe_args: "
                                            "rope:hope=true); the task's default PEs always run."),
    quick: bool = typer.Option(False, "--quick", help="A ~2-minute version for a first look (smaller everything)."),
    out: str = typer.Option(None, help="Output directory (default: runs/demo-<task>, plus -quick, -abacus, "
                                       "-seedN)."),
    seed: Seeds = typer.Option("0", "--seed", parser=_seeds, metavar="N,N,...",
                               help="Seeds model init and the training problems (the same for every PE); several, "
                                    "comma-separated (0,1,2), give mean ± std."),
    abacus: bool = typer.Option(False, "--abacus", help="Give every PE the Abacus digit embedding (McLeish et al.)."),
    task: str = typer.Option("selective-copy", "--task", help="selective-copy (MapFormer's synthetic task: rope, "
                                                              "tape and alibi), flip-flop or counting (rope, tape "
                                                              "and cope), or addition (rope and tape)."),
) -> None:
    """Train small models with different PEs under one budget and compare them beyond their training distribution.

    Every PE gets the same recipe (a shipped recipe shrunk to a CPU budget), steps, batch, learning rate and seed: a preset of `tape sweep` (one run per PE and seed in OUT/<pe>-seed<k>/, OUT/results.json).

    --task selective-copy (default, about 3 minutes on a 2-core CPU): MapFormer's selective copy, 16 symbols among 16 blanks, tested with 14 and 18 blanks; RoPE, TAPE and ALiBi; prints whole-sequence / per-token accuracy per split and writes OUT/accuracy.png.

    --task flip-flop, --task counting: flip-flop language modelling (Liu et al.) at 64 tokens, and CoPE's counting task with one variable under CoPE's protocol (a fixed set, 10 epochs, a constant rate); RoPE, TAPE and CoPE.

    --task addition (about 10 minutes, --quick about 2): reversed-digit addition, tested on every pair of operand lengths up to twice the training length (greedy, exact match); RoPE and TAPE; prints grid accuracy and inside/outside the training box; heat-maps: OUT/heatmaps.png.

    Re-running reuses finished work; --seed N repeats with another seed, --seed 0,1,2 reports mean ± std over three.

    Example: tape demo --pe nope ; tape demo --seed 0,1,2 ; tape demo --task addition --quick
    """
    extra = commas.split(pe, "--pe") if pe.strip() else []
    trust.allow_named(extra)
    seeds = tuple(seed)
    # One directory per setting, so a re-run reuses finished work and never mixes settings.
    suffix = "" if seeds == (0,) else f"-seed{','.join(map(str, seeds))}"
    if out is not None:
        from tapecli.store.run import check_output

        check_output(out)  # not a run directory or its checkpoints: the demo trains its runs inside OUT
    if task != "addition":
        from tapecli.experiments.demo_synthetic import BUDGETS, run_synthetic_demo

        if task not in BUDGETS:
            raise TapeError(f"--task: unknown demo task '{task}'; allowed: addition, {', '.join(BUDGETS)}")
        if abacus or quick:
            raise TapeError(f"--{'abacus' if abacus else 'quick'} applies to the addition demo only, not --task {task}")
        run_synthetic_demo(list(dict.fromkeys([*BUDGETS[task].pes, *extra])), BUDGETS[task],
                           out or f"runs/demo-{task}{suffix}", seeds=seeds)
        return
    from tapecli.experiments.demo import DEFAULT_PES, FULL, QUICK, run_demo

    default_out = "runs/demo" + "-quick" * quick + "-abacus" * abacus + suffix
    run_demo(list(dict.fromkeys([*DEFAULT_PES, *extra])), QUICK if quick else FULL, out or default_out, seeds=seeds,
             abacus=abacus)


def bench(
    pes: str = typer.Option(",".join(builtin_pes()), "--pe",
                            help="Comma-separated PEs to time (default: every built-in); a PE may carry pe_args as "
                                 "name:key=value[:key=value] (e.g. rope:hope=true)."),
    n_layers: int = integer(None, "--n-layers", min=1, help="Decoder layers (default 2; 4 with --decode)."),
    dim: int = integer(256, "--dim", min=1, help="Hidden width."),
    n_heads: int = integer(4, "--n-heads", min=1, help="Attention heads."),
    seq_len: str = typer.Option("1024,4096", help="Tokens per sequence; comma-separated lengths give one table "
                                                  "each, e.g. 1024,4096,16384."),
    batch_size: int = integer(1, "--batch-size", min=1, help="Sequences per step."),
    steps: int = integer(3, "--steps", min=1, help="Timed steps per PE and round (after warm-up)."),
    warmup: int = integer(1, "--warmup", min=0, help="Untimed warm-up steps per PE (at least one: it also names the attention "
                                       "path)."),
    rounds: int = integer(2, "--rounds", min=1, help="Interleaved rounds; each PE's time is the median over all timed steps."),
    precision: str = typer.Option("fp32", help="fp32, or bf16 (autocast, like training with precision: bf16)."),
    compile: bool = typer.Option(False, "--compile", help="torch.compile every model (as train.compile: true); "
                                                          "the warm-up compiles."),
    memory: bool = typer.Option(True, help="Also measure each PE's peak memory for one step, in a child process."),
    tape_paths: bool = typer.Option(True, help="Also time both TAPE aggregation paths (separate vs concatenated)."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    out: Path | None = typer.Option(None, help="Also write the timings, memory and ratios as JSON to this file."),
    decode: bool = typer.Option(False, "--decode", help="Time greedy decoding after a long prompt instead: ms per "
                                                         "new token and prefill time."),
    prompt_len: int = integer(4096, "--prompt-len", min=1, help="--decode: prompt tokens."),
    new_tokens: int = integer(32, "--new-tokens", min=1, help="--decode: greedy tokens decoded with the KV cache."),
    uncached_tokens: int = integer(4, "--uncached-tokens", min=0, help="--decode: tokens TAPE decodes without cache "
                                                                      "(0: skip)."),
    prefill_chunk: int | None = integer(512, "--prefill-chunk", min=1, help="--decode: prefill the prompt this many "
                                                                           "tokens at a time."),
    window: int | None = integer(None, "--window", min=1, help="Also time each PE with every layer local: a sliding "
                                 "window of this many keys (rows 'rope, window N'); the --hybrid layouts' window "
                                 "(default 1024).", show_default=False),
    hybrid: str = typer.Option("", "--hybrid", help="Also time hybrid layouts, comma-separated: irope (3 local RoPE "
                                                    "+ 1 global NoPE with Llama 4's length scale), rnope-swa (3 "
                                                    "local RoPE + 1 global NoPE), gemma3 (5 local RoPE theta 1e4 + 1 "
                                                    "global theta 1e6); use --n-layers 4 or 6 to see whole patterns."),
) -> None:
    """Time a training step (forward + backward) for each PE on the same model, with its peak memory, as ratios to RoPE, at each --seq-len (one table per length).

    Times come from one process, the PEs interleaved round by round, so the ratios compare like with like; peak memory from one child process per PE and length. The attention column names the path each PE took (`tape doctor` explains them). A PE that fails gets a row saying why, the others still run, and the command exits with 1.

    With --decode: greedy decoding after a --prompt-len prompt instead, per PE: ms per new token (KV cache), prefill time and what the KV cache holds, as ratios to RoPE; TAPE also without cache.

    --window N adds every PE with sliding-window layers (time and memory grow as T x N, not T^2), --hybrid adds layouts that mix local and global layers and PEs.

    Example: `tape bench --pe rope,alibi,fire,tape --seq-len 1024,4096,16384 --out bench.json`; `tape bench --pe rope --window 1024 --seq-len 16384`; `tape bench --decode --window 1024 --hybrid irope --out decode.json`.
    """
    from tapecli.experiments.hybrids import parse_hybrids

    pe_list = commas.split(pes, "--pe")
    trust.allow_named(pe_list)
    hybrids = tuple(parse_hybrids(hybrid))
    if decode:
        from tapecli.experiments.bench_decode import run_decode_bench

        result = run_decode_bench(pes=pe_list, n_layers=4 if n_layers is None else n_layers, dim=dim,
                                  n_heads=n_heads, prompt_len=prompt_len, new_tokens=new_tokens,
                                  uncached_tokens=uncached_tokens, prefill_chunk=prefill_chunk, rounds=rounds,
                                  tape_paths=tape_paths, device=device, out=out, window=window, hybrids=hybrids)
        if result["failed"]:
            raise typer.Exit(1)
        return
    from tapecli.experiments.bench import run_bench

    result = run_bench(pes=pe_list, n_layers=2 if n_layers is None else n_layers, dim=dim, n_heads=n_heads,
                       seq_lens=numbers(seq_len, "--seq-len", min=1), batch_size=batch_size, steps=steps, warmup=warmup,
                       rounds=rounds, tape_paths=tape_paths, device=device, precision=precision, compile=compile,
                       memory=memory, out=out, window=window, hybrids=hybrids)
    if result["failed"]:
        raise typer.Exit(1)


def doctor(
    device: str = typer.Option("auto", help="cpu, cuda or auto (the GPU when there is one)."),
    pes: str = typer.Option(",".join(builtin_pes()), "--pe",
                            help="Comma-separated PEs to check (default: every built-in); a PE may carry pe_args as "
                                 "name:key=value (e.g. rope:fope=true)."),
    hybrids: bool = typer.Option(True, help="Also check hybrid models (sliding windows, temperatures, length "
                                            "scales, several PEs per model)."),
    jobs: int = integer(1, "--jobs", min=1, help="Check this many PEs at once, each in a worker process of its own "
                                                 "with one thread (on a GPU machine their kernels compile in "
                                                 "parallel); the lines still come in order. 1: one after another, "
                                                 "in this process."),
) -> None:
    """Check this machine: torch, CUDA, GPU, bf16, flash-attn, fla, triton, torch.compile; then, per PE and per hybrid layout, the attention paths it takes here and four checks of `tape pe check` on the device (dense: outputs and training gradients vs an fp64 CPU reference; kv-cache and chunked-prefill decoding == the full forward; finite fp32 and bf16 training steps).

    Exits with 1 when a check fails. It is how a user with a GPU verifies an install.

    Example: `tape doctor --device cuda` after installing on a GPU machine.
    """
    from tapecli.experiments.doctor import run_doctor
    from tapecli.experiments.pe_specs import parse_pe_specs

    raw = commas.split(pes, "--pe")
    trust.allow_named(raw)  # (in the environment: the workers inherit it)
    chosen = [spec.text for spec in parse_pe_specs(raw)]
    if run_doctor(device, chosen, hybrids, processes=jobs)["failed"]:
        raise typer.Exit(1)
