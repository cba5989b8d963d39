"""The training loop behind `tape pretrain`, `tape finetune` and `tape extend-context`.

    pretrain(recipe, out)   # claims `out`, then setup -> fit
    job = setup(recipe, out, resume, init_from, command, env)   # tapecli.train.setup: checks, model, data, resuming
    fit(job)   # per step: optimizer_step (micro-batches, one update), then log, validate, save, stop if asked

Exactness is the design goal. The examples of optimizer step s are a pure function of s
(`tapecli.data.text.global_indices`), every checkpoint stores the optimizer, scheduler and RNG states, and the loss
is normalised by the number of target tokens in the whole global batch. So an interrupted-and-resumed run ends with
the same weights as an uninterrupted one (bitwise on CPU fp32), and gradient accumulation or data parallelism give
the same update as one big batch (up to float summation order).
"""

from __future__ import annotations

import contextlib
import math
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from tapecli import stops
from tapecli.data.text import IGNORE_INDEX
from tapecli.errors import LossNotFinite
from tapecli.recipe import Recipe
from tapecli.runtime import rng_state
from tapecli.store.checkpoint import checkpoint_step, save_checkpoint
from tapecli.store.claim import claim
from tapecli.store.run import CHECKPOINTS, check_output, removed_on_failure
from tapecli.train import distributed, fsdp
from tapecli.train.distributed import DistEnv
from tapecli.train.health import check_finite_weights
from tapecli.train.loggers import open_loggers
from tapecli.train.preemption import stopped
from tapecli.train.progress import TrainProgress
from tapecli.train.setup import Job, setup


def pretrain(recipe: Recipe, out: str | Path, resume: str = "auto", command: list[str] | None = None,
             init_what: str = "train.init_from") -> Path:
    """Train a model from scratch (or from `train.init_from`) into run directory `out`; returns `out`. `init_what`
    names what set train.init_from in errors (`--base` for `tape extend-context`)."""
    return _run(recipe, Path(out), resume, recipe.train.init_from, command or [], init_what)


def finetune(recipe: Recipe, checkpoint: str | Path, out: str | Path, resume: str = "auto",
             command: list[str] | None = None, init_what: str = "--checkpoint") -> Path:
    """Fine-tune the model of `checkpoint` (a run or checkpoint directory) into run directory `out`."""
    return _run(recipe, Path(out), resume, str(checkpoint), command or [], init_what)


def _run(recipe: Recipe, out: Path, resume: str, init_from: str | None, command: list[str],
         init_what: str) -> Path:
    check_output(out, run=True)  # before the claim: not a run's checkpoints folder, nor a checkpoint
    env = distributed.setup()
    try:
        with contextlib.ExitStack() as held:
            with removed_on_failure(out):  # a failed setup leaves no run directory or cache behind
                if env.is_main:  # one writer per run directory; rank 0 holds it for every rank
                    held.enter_context(claim(out, command=shlex.join(command) if command else None))
                job = setup(recipe, out, resume, init_from, command, env, init_what)
            with job.stop:
                fit(job)
            distributed.barrier(env)
    finally:
        distributed.teardown()
    return out


def _train_state(job: Job, step: int, elapsed: float, optimizer_state: dict | None = None) -> dict[str, Any]:
    return {
        "step": step,
        "data_position": step,  # the next batch is global_indices(step, ...): the position is the step
        "optimizer": job.optimizer.state_dict() if optimizer_state is None else optimizer_state,
        "scheduler": job.scheduler.state_dict(),
        "scaler": job.scaler.state_dict() if job.scaler is not None else None,
        "rng": rng_state(),
        "recipe_hash": job.recipe_hash,
        "tokens": job.tokens,
        "elapsed": elapsed,
    }


# ---------------------------------------------------------------------------------------------------------------
# Fit


def _autocast(recipe: Recipe, device: torch.device) -> contextlib.AbstractContextManager:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(recipe.train.precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def _num_examples(data: Dataset) -> int | None:
    """Size for the epoch permutation, or None for a stream read in order (hub streams, generated problems)."""
    return getattr(data, "num_examples", None)


def _batch(data: Dataset, indices: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    items = [data[i] for i in indices]
    inputs = torch.stack([x for x, _ in items]).to(device, non_blocking=True)
    labels = torch.stack([y for _, y in items]).to(device, non_blocking=True)
    return inputs, labels


def _loss_sum(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy over the non-ignored labels (labels are already shifted: labels[t] follows inputs[:t+1])."""
    return _summed_loss(model(inputs, start_pos=0), labels)


def _summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")


@dataclass
class _Loop:
    """What `fit` keeps between optimizer steps."""

    train_model: nn.Module  # the model as trained: wrapped in DDP and/or torch.compile where asked
    ddp: nn.Module  # the model or its DDP wrapper (whose no_sync skips the all-reduce of early micro-batches)
    sharded: bool  # FSDP2: it reduce-scatters (and averages) gradients itself
    n_train: int | None  # examples for the epoch permutation (None: a stream read in order)
    metrics: Any  # the loggers (rank 0 only, else None)
    t0: float  # when this process started training
    last_time: float  # when the last metrics row was logged (tokens/s is measured between rows)
    last_tokens: int

    def elapsed(self, job: Job) -> float:
        """Training seconds, this run's earlier processes included."""
        return job.elapsed + time.perf_counter() - self.t0


def fit(job: Job) -> None:
    """Run optimizer steps start_step..max_steps; after each: log, validate, save, and stop if asked to."""
    t, env = job.recipe.train, job.env
    if job.start_step >= t.max_steps:
        stops.run_finished()
        if env.is_main:
            print(f"nothing to do: {job.last_checkpoint} is already at train.max_steps={t.max_steps}; "
                  f"run directory {job.out}")
        return
    loop = _start(job)
    with TrainProgress(job.start_step, t.max_steps, t.log_every, enabled=env.is_main) as progress:
        for step in range(job.start_step, t.max_steps):
            done = step + 1
            loss, lr, grad_norm = optimizer_step(job, loop, step)
            _log(job, loop, progress, done, loss, lr, grad_norm)
            if job.val_data is not None and ((t.eval_every and done % t.eval_every == 0) or done == t.max_steps):
                _validate(job, loop, progress, done)
            if done % t.save_every == 0 or done == t.max_steps:
                job.last_checkpoint = save(job, done, loop.elapsed(job))
                if done == t.max_steps:
                    stops.run_finished()  # a stop request from now on has nothing to stop
            if done < t.max_steps and job.stop.requested(env):
                _stop(job, loop, done)
    if loop.metrics is not None:
        loop.metrics.close()
        print(f"done: {t.max_steps} steps; run directory {job.out}, newest checkpoint {job.last_checkpoint}")


def _start(job: Job) -> _Loop:
    """Wrap the model for training (DDP when data parallel and not sharded, torch.compile when asked), open the
    loggers, switch to training mode and start the clock."""
    env, t, model = job.env, job.recipe.train, job.model
    train_model: nn.Module = model
    sharded = fsdp.is_sharded(model)
    if env.world_size > 1 and not sharded:
        train_model = nn.parallel.DistributedDataParallel(model, device_ids=[env.device] if env.device.type == "cuda"
                                                          else None)
    ddp = train_model
    if t.compile:
        train_model = torch.compile(train_model)
    n_train = _num_examples(job.train_data)
    metrics = open_loggers(t.loggers, job.out, job.start_step, job.recipe.to_dict()) if env.is_main else None
    model.train()
    t0 = time.perf_counter()
    return _Loop(train_model=train_model, ddp=ddp, sharded=sharded, n_train=n_train, metrics=metrics, t0=t0,
                 last_time=t0, last_tokens=job.tokens)


def optimizer_step(job: Job, loop: _Loop, step: int) -> tuple[float, float, torch.Tensor]:
    """Optimizer step `step` (0-based): gradients of the global batch, accumulated over micro-batches, then the
    update. Returns (the batch's mean loss, the learning rate used, the gradient norm before clipping)."""
    from tapecli.data.text import global_indices

    t, env = job.recipe.train, job.env
    indices = distributed.rank_share(global_indices(step, t.batch_size, loop.n_train, t.seed), env)
    batches = [_batch(job.train_data, indices[i : i + t.micro_batch_size], env.device)
               for i in range(0, len(indices), t.micro_batch_size)]
    loss = _accumulate_gradients(job, loop, batches)
    if not math.isfinite(loss):
        where = job.last_checkpoint if job.last_checkpoint is not None else "none (no checkpoint saved yet)"
        raise LossNotFinite(f"loss is {loss} at step {step + 1}; the last good checkpoint is {where}")
    lr, grad_norm = _apply_gradients(job)
    job.tokens += t.batch_size * job.recipe.data.seq_len
    return loss, lr, grad_norm


def _accumulate_gradients(job: Job, loop: _Loop, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Backward every micro-batch; the loss is a mean over the target tokens of the whole global batch, whatever the
    split into micro-batches and processes. Returns that mean."""
    env = job.env
    local_targets = sum(int((labels != IGNORE_INDEX).sum()) for _, labels in batches)
    targets = distributed.all_sum(torch.tensor(float(local_targets), device=env.device), env).clamp(min=1)
    loss_sum = torch.zeros((), device=env.device)
    for i, (inputs, labels) in enumerate(batches):
        # DDP all-reduces gradients on the last micro-batch only; it averages over ranks, hence * world_size.
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or env.world_size == 1 or loop.sharded else loop.ddp.no_sync()
        with sync:
            with _autocast(job.recipe, env.device):
                micro_loss = _loss_sum(loop.train_model, inputs, labels)
            scaled = micro_loss * (env.world_size / targets)
            (job.scaler.scale(scaled) if job.scaler is not None else scaled).backward()
        loss_sum += micro_loss.detach()
    return (distributed.all_sum(loss_sum, env) / targets).item()


def _apply_gradients(job: Job) -> tuple[float, torch.Tensor]:
    """Clip (or just measure) the gradient norm, step the optimizer (through the fp16 loss scaler if any) and the
    scheduler. Returns (the learning rate used, the gradient norm)."""
    t, model = job.recipe.train, job.model
    if job.scaler is not None:
        job.scaler.unscale_(job.optimizer)
    grad_norm = (nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip) if t.grad_clip > 0 else
                 nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    lr = job.optimizer.param_groups[0]["lr"]
    if job.scaler is not None:
        job.scaler.step(job.optimizer)
        job.scaler.update()
    else:
        job.optimizer.step()
    job.optimizer.zero_grad(set_to_none=True)
    job.scheduler.step()
    return lr, grad_norm


def _log(job: Job, loop: _Loop, progress: TrainProgress, done: int, loss: float, lr: float,
         grad_norm: torch.Tensor) -> None:
    """Show the step; every train.log_every steps (and at the last) log a metrics row."""
    t = job.recipe.train
    now = time.perf_counter()
    tokens_per_s = (job.tokens - loop.last_tokens) / max(now - loop.last_time, 1e-9)
    progress.step(done, loss, lr, tokens_per_s)
    if loop.metrics is not None and (done % t.log_every == 0 or done == t.max_steps):
        loop.metrics.log({"step": done, "loss": loss, "lr": lr, "tokens": job.tokens,
                          "tokens_per_s": round(tokens_per_s, 1), "elapsed": round(job.elapsed + now - loop.t0, 3),
                          "grad_norm": float(grad_norm)})
        loop.last_time, loop.last_tokens = now, job.tokens


def _validate(job: Job, loop: _Loop, progress: TrainProgress, done: int) -> None:
    values = validate(job.model, job.val_data, job.recipe, job.env)
    progress.print(f"step {done}: " + ", ".join(f"{key} {value:.4f}" for key, value in values.items()))
    if loop.metrics is not None:
        loop.metrics.log({"step": done, **values})


def _stop(job: Job, loop: _Loop, done: int) -> None:
    """SIGTERM / Ctrl-C arrived: save step `done` unless just saved, close the loggers, raise `Stopped`."""
    if job.last_checkpoint is None or checkpoint_step(job.last_checkpoint) != done:
        job.last_checkpoint = save(job, done, loop.elapsed(job))
    if loop.metrics is not None:
        loop.metrics.close()
    raise stopped(job.stop.signal_number, done, job.last_checkpoint, job.command)


@torch.no_grad()
def validate(model: nn.Module, data: Dataset, recipe: Recipe, env: DistEnv) -> dict[str, float]:
    """{"val_loss": mean cross-entropy over the target tokens} of the first `train.eval_batches` x micro_batch_size
    x processes examples of `data` (each rank takes every world_size-th of them). A dataset that says which positions
    its task scores (`scored_mask`, the generated tasks) adds the argmax accuracy over them, from the same forward
    passes: "val_token_accuracy" (scored tokens right / scored tokens) and "val_accuracy" (sequences with every
    scored token right / sequences with one), the learning curve of `tape eval synthetic`'s metrics on IID data."""
    t = recipe.train
    limit = t.eval_batches * t.micro_batch_size * env.world_size
    size = _num_examples(data)
    if size is None and hasattr(data, "__len__"):
        with contextlib.suppress(TypeError):  # a hub stream has no length
            size = len(data)
    indices = list(range(limit if size is None else min(limit, size)))[env.rank :: env.world_size]
    scoring = hasattr(data, "scored_mask")
    model.eval()
    # summed loss, target count; then (scoring) scored tokens right, scored tokens, sequences right, scored sequences
    total = torch.zeros(6 if scoring else 2, device=env.device)
    for i in range(0, len(indices), t.micro_batch_size):
        chunk = indices[i : i + t.micro_batch_size]
        try:
            inputs, labels = _batch(data, chunk, env.device)
        except IndexError:  # a validation stream shorter than eval_batches
            break
        with _autocast(recipe, env.device):
            logits = model(inputs, start_pos=0)
            total[0] += _summed_loss(logits, labels)
        total[1] += (labels != IGNORE_INDEX).sum()
        if scoring:
            scored = data.scored_mask(chunk).to(env.device)
            right = (logits.argmax(-1) == labels) & scored
            per_sequence = scored.sum(1)
            total[2:] += torch.stack([right.sum(), scored.sum(), ((right.sum(1) == per_sequence) & (per_sequence > 0))
                                      .sum(), (per_sequence > 0).sum()]).to(total.dtype)
    model.train()
    total = distributed.all_sum(total, env)
    values = {"val_loss": (total[0] / total[1].clamp(min=1)).item()}
    if scoring:
        values |= {"val_token_accuracy": (total[2] / total[3].clamp(min=1)).item(),
                   "val_accuracy": (total[4] / total[5].clamp(min=1)).item()}
    return values


def save(job: Job, step: int, elapsed: float) -> Path:
    """Write checkpoint `step` (rank 0 writes; every rank returns its path)."""
    t = job.recipe.train
    root = job.out / CHECKPOINTS
    check_finite_weights(job.model, step, job.last_checkpoint)
    weights = optimizer_state = None
    if fsdp.is_sharded(job.model):  # every rank takes part in gathering the full tensors
        weights, optimizer_state = fsdp.full_state(job.model, job.optimizer)
    if job.env.is_main:
        return save_checkpoint(root, step, job.model, job.tokenizer, _train_state(job, step, elapsed, optimizer_state),
                               keep_last=t.keep_last, weights=weights)
    return root / f"step-{step:08d}"
