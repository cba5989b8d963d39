"""Data parallelism under torchrun: process-group setup, this rank's share of a batch, sums across ranks.

Without torchrun (no WORLD_SIZE in the environment) everything here degrades to a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: rank among world_size processes, and the device it trains on."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes files and prints."""
        return self.rank == 0


def setup() -> DistEnv:
    """Join the torchrun process group (nccl on CUDA, gloo on CPU) and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistEnv(rank=rank, world_size=world_size, device=device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_share(indices: list[int], env: DistEnv) -> list[int]:
    """This rank's contiguous slice of a step's global example indices (the length divides evenly)."""
    per_rank = len(indices) // env.world_size
    return indices[env.rank * per_rank : (env.rank + 1) * per_rank]


def all_sum(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The sum of `value` over all ranks (the value itself in a single process)."""
    if env.world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def barrier(env: DistEnv) -> None:
    if env.world_size > 1:
        dist.barrier()
