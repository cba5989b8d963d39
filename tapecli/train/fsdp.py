"""FSDP2 for `train.parallel: fsdp` under torchrun: PyTorch's per-parameter sharding
(`torch.distributed.fsdp.fully_shard`), for models whose weights, gradients and optimizer states do not fit one
device (a 7B model at 8192 tokens). DDP stays the default for small models.

    shard(model, env)                       # every decoder block one FSDP unit, the root holds the rest
    model_state, optim_state = full_state(model, optimizer)    # collective: every rank calls it
    load_optimizer_state(model, optimizer, optim_state)        # collective

Each block is all-gathered for its forward and backward and resharded after; gradients are reduce-scattered and
averaged over ranks, like DDP's all-reduce, so the engine's loss scaling is the same for both. The device mesh is
always explicit (`init_device_mesh(device type, (world,))`): without one, a machine with CUDA moves the model there
(pytorch #132471), and with one FSDP2 runs on CPU with gloo. Checkpoints keep tape's single-file format: every
rank takes part in gathering full tensors, rank 0 writes them; a resumed run loads them into the unsharded model
before sharding it again, and the optimizer state with `set_optimizer_state_dict`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tapecli.train.distributed import DistEnv


def shard(model: nn.Module, env: DistEnv, precision: str = "fp32") -> None:
    """Shard `model` in place over all ranks (parameters become DTensors); build the optimizer afterwards.

    FSDP2 keeps one parameter dtype per unit, so a frozen bf16 base under fp32 trained weights is stored in fp32
    (sharded, so 4 bytes / world size per parameter); with `precision` bf16 the blocks are all-gathered and computed
    in bf16 and gradients reduced in fp32 (MixedPrecisionPolicy)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if len({p.dtype for p in model.parameters()}) > 1:
        model.float()
    policy = MixedPrecisionPolicy()
    if precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.sharded = True


def is_sharded(model: nn.Module) -> bool:
    return getattr(model, "sharded", False)


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full model state dict, full optimizer state dict keyed by parameter name), on the CPU. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full optimizer state dict written by `full_state` into the sharded optimizer. Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def full_gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable parameter's full gradient (DTensor shards gathered). Collective; for tests and debugging."""
    grads = {}
    for name, param in model.named_parameters():
        if param.grad is not None:
            grad = param.grad
            grads[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().cpu()
    return grads
