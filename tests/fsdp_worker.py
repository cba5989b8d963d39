"""Run under torchrun (or call `gradients` in one process): build a run through the engine's own `setup`
(FSDP2-sharded when train.parallel=fsdp and there are several processes), compute the gradients of optimizer step 0
with the engine's loss normalisation (mean over the global batch's target tokens; DDP and FSDP average over ranks,
hence x world size), and let rank 0 save the full gradients to argv[3]."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from tapecli.data.text import IGNORE_INDEX, global_indices
from tapecli.recipe import load_recipe
from tapecli.train import distributed, engine, fsdp


def gradients(recipe_path: str, out: str, overrides: list[str]) -> dict[str, Any] | None:
    """{"sharded": whether the model was sharded, "grads": {name: full gradient}} on rank 0, None on the others."""
    env = distributed.setup()
    job = engine.setup(load_recipe(recipe_path, overrides), Path(out), "never", None, [], env)
    t = job.recipe.train
    indices = distributed.rank_share(global_indices(0, t.batch_size, engine._num_examples(job.train_data), t.seed),
                                     env)
    batches = [engine._batch(job.train_data, indices[i : i + t.micro_batch_size], env.device)
               for i in range(0, len(indices), t.micro_batch_size)]
    targets = distributed.all_sum(torch.tensor(float(sum(int((y != IGNORE_INDEX).sum()) for _, y in batches))), env)
    job.model.train()
    for inputs, labels in batches:
        (engine._loss_sum(job.model, inputs, labels) * (env.world_size / targets)).backward()
    grads = fsdp.full_gradients(job.model)
    found = {"sharded": fsdp.is_sharded(job.model), "grads": grads} if env.is_main else None
    distributed.teardown()
    return found


if __name__ == "__main__":
    recipe_path, out, grads_file, *overrides = sys.argv[1:]
    result = gradients(recipe_path, out, overrides)
    if result is not None:
        torch.save(result, grads_file)
