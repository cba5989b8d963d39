"""Setting up a training run: every check before anything is written, the model, data and optimizer, and resuming.

    job = setup(recipe, out, resume, init_from, command, env)   # a Job, which `tapecli.train.engine.fit` runs

`setup` checks what can be wrong (the output directory, loggers, hardware and precision, the checkpoint to resume
from, the data files), builds the model (`tapecli.train.build`), checks that a resumed run continues the same
training (`tapecli.train.continuation`), builds the optimizer, schedule and datasets, restores the optimizer,
scheduler and RNG states of the checkpoint it resumes from, and only then writes the run's files and prints its
opening lines.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from tapecli import faults
from tapecli.data.build import build_datasets
from tapecli.errors import TapeError
from tapecli.recipe import Recipe
from tapecli.recipe.legacy import legacy_hash
from tapecli.runtime import resolve_precision, seed_everything, set_rng_state, startup_line
from tapecli.store.checkpoint import list_checkpoints, load_train_state, remove_temp_dirs, resolve_checkpoint
from tapecli.store.run import CHECKPOINTS, check_no_links, check_output, run_entries, run_recipe_path, write_run_files
from tapecli.train import fsdp, memory
from tapecli.train.build import build_model
from tapecli.train.continuation import check_continuation
from tapecli.train.distributed import DistEnv
from tapecli.train.loggers import check_loggers
from tapecli.train.optim import build_optimizer, build_scheduler
from tapecli.train.preemption import StopSignal

if TYPE_CHECKING:
    from tapecli.model import ModelConfig


@dataclass
class Job:
    """Everything `fit` needs, built by `setup`."""

    recipe: Recipe
    env: DistEnv
    model: nn.Module
    tokenizer: Any
    train_data: Dataset
    val_data: Dataset | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None
    out: Path
    recipe_hash: str
    start_step: int = 0
    tokens: int = 0  # training tokens seen before start_step
    elapsed: float = 0.0  # training seconds before this process
    last_checkpoint: Path | None = None
    command: list[str] = field(default_factory=list)  # the command line, for the "resume with" message
    stop: StopSignal = field(default_factory=StopSignal)  # SIGTERM / Ctrl-C: save after this step, then stop



def setup(recipe: Recipe, out: Path, resume: str, init_from: str | None, command: list[str], env: DistEnv,
          init_what: str = "train.init_from") -> Job:
    """Check everything that can be wrong before writing anything, then create the run directory.

    The caller's recipe is left as it is: the job holds a resolved copy (`resolve_recipe`), which RUN/recipe.yaml
    records. `init_what` is the option or recipe key that gave `init_from`, for messages."""
    precision, resume_from = _check(recipe, out, resume, env)
    seed_everything(recipe.train.seed)
    model, tokenizer, origin = build_model(recipe, resume_from, init_from, env.device, precision, init_what)
    if resume_from is not None:
        check_continuation(recipe, resume_from, tokenizer, model.config)
    recipe = resolve_recipe(recipe, precision, model.config)
    job = _build(recipe, out, command, env, model, tokenizer)
    if resume_from is not None:
        _restore(job, resume_from)
    if env.is_main:
        remove_temp_dirs(out / CHECKPOINTS)
        write_run_files(out, recipe.to_yaml(), recipe.train.seed, command, resume_from)
        _announce(job, origin, resume_from)
    return job


def _check(recipe: Recipe, out: Path, resume: str, env: DistEnv) -> tuple[str, Path | None]:
    """(the resolved train.precision, the checkpoint to resume from), once nothing the recipe or the hardware asks
    for is wrong: the output directory, loggers, precision and batch split, the data files."""
    check_output(out, run=True)
    check_no_links(out, run_entries(out), "a run directory")
    check_loggers(recipe.train.loggers)
    precision = _check_hardware(recipe, env)
    resume_from = find_resume(out, resume)
    recipe.data.check_files()  # a missing data.source fails now, before a model is opened
    return precision, resume_from


def _build(recipe: Recipe, out: Path, command: list[str], env: DistEnv, model: nn.Module, tokenizer: Any) -> Job:
    """The job around `model`: on its device (sharded under FSDP), with its optimizer, schedule and data."""
    from tapecli.model import count_parameters

    t = recipe.train
    counts = count_parameters(model)
    faults.note_memory_use(f"a {counts['total']:,}-parameter model ({t.micro_batch_size} x {recipe.data.seq_len} "
                           "tokens per micro-batch)", "lower train.micro_batch_size or data.seq_len")
    if counts["trainable"] == 0:
        raise TapeError("train.freeze: every parameter is frozen; unfreeze some with train.unfreeze")
    model.to(env.device)
    model.gradient_checkpointing = t.activation_checkpointing
    if t.parallel == "fsdp" and env.world_size > 1:
        fsdp.shard(model, env, t.precision)  # before the optimizer: it must hold the sharded parameters

    optimizer = build_optimizer(model, t.lr, t.weight_decay, (t.betas[0], t.betas[1]))
    scheduler = build_scheduler(optimizer, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps,
                                max_steps=t.max_steps, schedule=t.schedule)
    scaler = torch.amp.GradScaler("cuda") if t.precision == "fp16" else None
    train_data, val_data = build_datasets(recipe, tokenizer, out / "cache")
    train_data[0]  # read one example now, so unreadable data (e.g. an offline hub stream) fails before any writing
    recipe_hash = hashlib.sha256(recipe.to_yaml().encode()).hexdigest()[:16]
    return Job(recipe=recipe, env=env, model=model, tokenizer=tokenizer, train_data=train_data, val_data=val_data,
               optimizer=optimizer, scheduler=scheduler, scaler=scaler, out=out, recipe_hash=recipe_hash,
               command=command)


def _announce(job: Job, origin: str | None, resume_from: Path | None) -> None:
    """The run's opening lines: device, where the weights came from, parameters, layers, memory, resumption."""
    from tapecli.model import count_parameters

    model, recipe = job.model, job.recipe
    counts = count_parameters(model)
    print(startup_line(job.env.device))
    if job.val_data is None and recipe.data.evaluation == "validation":
        reason = recipe.data.no_validation() or f"data.kind {recipe.data.kind} has none"
        print(f"note: no validation split, so no validation loss is logged: {reason}")
    if origin is not None:
        print(origin)
    print(f"parameters: {counts['total']:,} total, {counts['trainable']:,} trainable "
          f"({counts['pe']:,} in the positional encoding)")
    if model.config.attention_keys():  # windows, temperatures, length scales or a schedule: say what each is
        from tapecli.model.schedule import describe

        print(f"layers: {describe(model.config.layers())}")
    print(memory.describe(memory.estimate_memory(model, recipe, job.env.world_size, fsdp.is_sharded(model))))
    if resume_from is not None:
        print(f"resuming from {resume_from} (step {job.start_step} of {recipe.train.max_steps})")


def resolve_recipe(recipe: Recipe, precision: str, config: ModelConfig) -> Recipe:
    """A copy of `recipe` that says what the run does: the resolved train.precision, and the model actually trained
    (the vocabulary size from the tokenizer, a checkpoint's or base model's shape)."""
    resolved = copy.deepcopy(recipe)
    resolved.train.precision = precision
    trained = config.to_dict()
    for f in dataclasses.fields(resolved.model):
        setattr(resolved.model, f.name, trained[f.name])
    return resolved


def _check_hardware(recipe: Recipe, env: DistEnv) -> str:
    """The resolved train.precision (tapecli.runtime), once this hardware can run it and the batch splits evenly."""
    t = recipe.train
    precision = resolve_precision(t.precision, env.device)
    if precision == "fp16" and env.device.type != "cuda":
        raise TapeError("train.precision: fp16 needs a CUDA GPU (loss scaling); use bf16 or fp32 on CPU")
    if precision == "bf16" and env.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TapeError("train.precision: this GPU does not support bf16; use fp16 or fp32")
    per_step = t.micro_batch_size * env.world_size
    if t.batch_size % per_step:
        raise TapeError(f"train.batch_size: {t.batch_size} is not divisible by train.micro_batch_size x processes "
                        f"= {t.micro_batch_size} x {env.world_size}")
    return precision


def find_resume(out: Path, resume: str) -> Path | None:
    """The checkpoint to continue from: `auto` = the newest in `out` if any, `never` = none, else a path."""
    existing = list_checkpoints(out / CHECKPOINTS)
    if resume == "auto":
        return existing[-1] if existing else None
    if resume == "never":
        if existing:
            raise TapeError(f"{out} already holds checkpoints up to {existing[-1].name}; use --resume auto to "
                            "continue that run, or another --out")
        return None
    if not Path(resume).expanduser().exists():
        raise TapeError(f"--resume: {resume} does not exist; pass --resume auto (continue --out if it holds a "
                        "checkpoint), never, or a run or checkpoint directory")
    return resolve_checkpoint(resume)


def _restore(job: Job, checkpoint: Path) -> None:
    state = load_train_state(checkpoint)
    if fsdp.is_sharded(job.model):
        fsdp.load_optimizer_state(job.model, job.optimizer, state["optimizer"])
    else:
        job.optimizer.load_state_dict(state["optimizer"])
    job.scheduler.load_state_dict(state["scheduler"])
    if job.scaler is not None and state["scaler"] is not None:
        job.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    job.start_step, job.tokens, job.elapsed = state["step"], state["tokens"], state["elapsed"]
    job.last_checkpoint = checkpoint
    unchanged = state["recipe_hash"] in (job.recipe_hash, legacy_hash(job.recipe, run_recipe_path(checkpoint)))
    if not unchanged and job.env.is_main:
        print(f"note: the recipe differs from the one that wrote {checkpoint}; continuing with the new one")
