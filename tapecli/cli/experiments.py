"""`tape demo`, `tape bench` and `tape doctor`: the packaged experiments (tapecli.experiments)."""

from __future__ import annotations

from pathlib import Path

import typer

from tapecli.errors import TapeError


def demo(
    pe: str = typer.Option("", "--pe", help="More PEs to compare, comma-separated (e.g. nope,fire); rope and tape "
                                            "always run."),
    quick: bool = typer.Option(False, "--quick", help="A ~2-minute version for a first look (smaller everything)."),
    out: str = typer.Option(None, help="Output directory (default: runs/demo, plus -quick, -abacus, -seedN)."),
    seed: int = typer.Option(0, help="Seeds model init and the training problems (the same for every PE)."),
    abacus: bool = typer.Option(False, "--abacus", help="Give every PE the Abacus digit embedding (McLeish et al.)."),
    task: str = typer.Option("selective-copy", "--task", help="selective-copy (MapFormer's synthetic task: rope, "
                                                              "tape and alibi) or addition (rope and tape)."),
) -> None:
    """Train small models with different PEs under one budget and compare them beyond their training distribution.

    Every PE gets the same recipe (a shipped recipe shrunk to a CPU budget), steps, batch, learning rate and seed.

    --task selective-copy (default, about 3 minutes on a 2-core CPU): MapFormer's selective copy, 16 symbols among 16 blanks, tested with 14 and 18 blanks; RoPE, TAPE and ALiBi; prints whole-sequence / per-token accuracy per split and writes OUT/accuracy.png.

    --task addition (about 10 minutes, --quick about 2): reversed-digit addition, tested on every pair of operand lengths up to twice the training length (greedy, exact match); RoPE and TAPE; prints grid accuracy and inside/outside the training box; heat-maps: OUT/heatmaps.png.

    Re-running reuses finished work; --seed N repeats with another seed.

    Example: tape demo --pe nope ; tape demo --task addition --quick
    """
    from tapecli.experiments.demo import DEFAULT_PES, FULL, QUICK, run_demo

    extra = [p.strip() for p in pe.split(",") if p.strip()]
    if task != "addition":
        _synthetic_demo(task, extra, quick, abacus, out, seed)
        return
    pes = list(dict.fromkeys([*DEFAULT_PES, *extra]))  # keep order, drop repeats
    # One directory per setting, so a re-run reuses finished work and never mixes settings.
    default_out = "runs/demo" + "-quick" * quick + "-abacus" * abacus + (f"-seed{seed}" if seed else "")
    run_demo(pes, QUICK if quick else FULL, out or default_out, seed=seed, abacus=abacus)


def _synthetic_demo(task: str, extra: list[str], quick: bool, abacus: bool, out: str | None, seed: int) -> None:
    """`tape demo --task <synthetic task>` (see tapecli.experiments.demo_synthetic)."""
    from tapecli.experiments.demo_synthetic import BUDGETS, DEFAULT_PES, run_synthetic_demo

    if task not in BUDGETS:
        raise TapeError(f"--task: unknown demo task '{task}'; allowed: addition, {', '.join(BUDGETS)}")
    if abacus or quick:
        raise TapeError(f"--{'abacus' if abacus else 'quick'} applies to the addition demo only, not --task {task}")
    default_out = f"runs/demo-{task}" + (f"-seed{seed}" if seed else "")
    run_synthetic_demo(list(dict.fromkeys([*DEFAULT_PES, *extra])), BUDGETS[task], out or default_out, seed=seed)



def bench(
    pes: str = typer.Option("nope,rope,randpe,alibi,fire,xpos,t5,tape,cope,path", "--pe",
                            help="Comma-separated PEs to time."),
    n_layers: int = typer.Option(None, help="Decoder layers (default 2; 4 with --decode)."),
    dim: int = typer.Option(256, help="Hidden width."),
    n_heads: int = typer.Option(4, help="Attention heads."),
    seq_len: str = typer.Option("1024,4096", help="Tokens per sequence; comma-separated lengths give one table "
                                                  "each, e.g. 1024,4096,16384."),
    batch_size: int = typer.Option(1, help="Sequences per step."),
    steps: int = typer.Option(3, help="Timed steps per PE and round (after warm-up)."),
    warmup: int = typer.Option(1, help="Untimed warm-up steps per PE (at least one: it also names the attention "
                                       "path)."),
    rounds: int = typer.Option(2, help="Interleaved rounds; each PE's time is the median over all timed steps."),
    precision: str = typer.Option("fp32", help="fp32, or bf16 (autocast, like training with precision: bf16)."),
    compile: bool = typer.Option(False, "--compile", help="torch.compile every model (as train.compile: true); "
                                                          "the warm-up compiles."),
    memory: bool = typer.Option(True, help="Also measure each PE's peak memory for one step, in a child process."),
    tape_paths: bool = typer.Option(True, help="Also time both TAPE aggregation paths (separate vs concatenated)."),
    device: str = typer.Option("auto", help="cpu, cuda or auto."),
    out: Path | None = typer.Option(None, help="Also write the timings, memory and ratios as JSON to this file."),
    decode: bool = typer.Option(False, "--decode", help="Time greedy decoding after a long prompt instead: ms per "
                                                         "new token and prefill time."),
    prompt_len: int = typer.Option(4096, help="--decode: prompt tokens."),
    new_tokens: int = typer.Option(32, help="--decode: greedy tokens decoded with the KV cache."),
    uncached_tokens: int = typer.Option(4, help="--decode: tokens TAPE decodes without cache (0: skip)."),
    prefill_chunk: int | None = typer.Option(512, help="--decode: prefill the prompt this many tokens at a time."),
) -> None:
    """Time a training step (forward + backward) for each PE on the same model, with its peak memory, as ratios to RoPE, at each --seq-len (one table per length).

    Times come from one process, the PEs interleaved round by round, so the ratios compare like with like; peak memory from one child process per PE and length. The attention column names the path each PE took (`tape doctor` explains them).

    With --decode: greedy decoding after a --prompt-len prompt instead, per PE: ms per new token (KV cache) and prefill time, as ratios to RoPE; TAPE also without cache.

    Example: `tape bench --pe rope,alibi,fire,tape --seq-len 1024,4096,16384 --out bench.json`; `tape bench --decode --out decode.json`.
    """
    pe_list = [p.strip() for p in pes.split(",") if p.strip()]
    if decode:
        from tapecli.experiments.bench_decode import run_decode_bench

        run_decode_bench(pes=pe_list, n_layers=4 if n_layers is None else n_layers, dim=dim, n_heads=n_heads,
                         prompt_len=prompt_len, new_tokens=new_tokens, uncached_tokens=uncached_tokens,
                         prefill_chunk=prefill_chunk, rounds=rounds, tape_paths=tape_paths, device=device, out=out)
        return
    from tapecli.experiments.bench import parse_lengths, run_bench

    run_bench(pes=pe_list, n_layers=2 if n_layers is None else n_layers, dim=dim, n_heads=n_heads,
              seq_lens=parse_lengths(seq_len), batch_size=batch_size, steps=steps, warmup=warmup, rounds=rounds,
              tape_paths=tape_paths, device=device, precision=precision, compile=compile, memory=memory, out=out)


def doctor(
    device: str = typer.Option("auto", help="cpu, cuda or auto (the GPU when there is one)."),
    pes: str = typer.Option("nope,rope,randpe,alibi,fire,xpos,t5,tape,cope,path", "--pe",
                            help="Comma-separated PEs to check."),
) -> None:
    """Check this machine: torch, CUDA, GPU, bf16, flash-attn, fla, triton, torch.compile; then, per PE, the attention path it takes here and a self-check on the device (logits vs an fp64 CPU reference, cached == uncached greedy decoding, finite bf16 gradients).

    Exits with 1 when a check fails. It is how a user with a GPU verifies an install.

    Example: `tape doctor --device cuda` after installing on a GPU machine.
    """
    from tapecli.experiments.doctor import run_doctor
    from tapecli.model import PE_NAMES

    chosen = [p.strip() for p in pes.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PE_NAMES]
    if unknown:
        raise TapeError(f"--pe: unknown positional encoding {unknown[0]!r}; allowed: {', '.join(PE_NAMES)}")
    if run_doctor(device, chosen)["failed"]:
        raise typer.Exit(1)
