"""Checkpoints: save, find and read them (shared by training and evaluation; tapecli.store.door opens them).

A checkpoint is a directory `RUN/checkpoints/step-XXXXXXXX/` holding
    model.safetensors   the weights (a tied `lm_head.weight` is stored once, as the embedding)
    model_config.json   `ModelConfig.to_dict()`, enough to rebuild the model
    tokenizer/          what `tok.save` writes
    train_state.pt      optimizer, scheduler, step, RNG states, data position, recipe hash (training only)
    base_model.json     only for models trained on a frozen Hugging Face base (`tape extend-context`): where the
                        base was imported from, the fingerprint of its weights and the LoRA settings;
                        model.safetensors then holds only the new and trained tensors, and opening assigns the rest
                        from the base (tapecli.store.door), once the base's fingerprint matches
It is written into a `.tmp-*` directory next to it and renamed into place, so a directory named `step-*` is
always complete; a save killed half-way leaves only a `.tmp-*` directory, which is ignored and later removed, and
a save that fails (a full disk) removes its `.tmp-*` directory itself. Pruning renames a checkpoint out of the
`step-*` namespace before deleting it. A corrupt or truncated file is reported as one line naming it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapecli.errors import TapeError
from tapecli.faults import reading, writing
from tapecli.store.run import CHECKPOINTS, MODEL_CONFIG

if TYPE_CHECKING:
    import torch

    from tapecli.data.tokenizer import Tokenizer
    from tapecli.model import Transformer

WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer"
TRAIN_STATE = "train_state.pt"
BASE_MODEL = "base_model.json"
TEMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_step(path: Path) -> int:
    """The step number in a `step-XXXXXXXX` directory name."""
    match = _STEP_DIR.match(Path(path).name)
    if match is None:
        raise TapeError(f"{path} is not a step-XXXXXXXX checkpoint directory")
    return int(match.group(1))


def is_checkpoint(path: Path) -> bool:
    """True for a directory holding loadable weights (a training checkpoint or a `save_model` export)."""
    return (path / WEIGHTS).is_file() and (path / MODEL_CONFIG).is_file()


def list_checkpoints(root: Path) -> list[Path]:
    """Complete `step-*` checkpoints under `root` (a run's checkpoints/ folder), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and is_checkpoint(p)]
    return sorted(found, key=checkpoint_step)


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory as given, or the newest complete checkpoint of a run directory."""
    path = Path(path).expanduser()
    if not path.exists():
        raise TapeError(f"checkpoint {path} does not exist")
    if is_checkpoint(path):
        return path
    for root in (path / CHECKPOINTS, path):
        found = list_checkpoints(root)
        if found:
            return found[-1]
    if (path / "config.json").is_file():
        raise TapeError(f"{path} is a Hugging Face model directory, not a tape checkpoint; `tape eval --model` opens "
                        "it as it is and `tape extend-context --base` trains on it")
    raise TapeError(f"{path} holds no checkpoint (expected {WEIGHTS} + {MODEL_CONFIG}, or {CHECKPOINTS}/step-*/)")


# ---------------------------------------------------------------------------------------------------------------
# Weights


def own_parameter_names(model: Transformer) -> set[str] | None:
    """For a model on a frozen base: the tensors a checkpoint must store (new or trainable); None otherwise."""
    if getattr(model, "base_model", None) is None:
        return None
    return set(model.new_parameters) | {name for name, p in model.named_parameters() if p.requires_grad}


def _weights_to_save(model: Transformer, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    state = dict(model.state_dict() if state is None else state)
    if model.config.tie_embeddings:
        # safetensors refuses tensors that share memory; the tied head is rebuilt from the embedding on load.
        state.pop("lm_head.weight", None)
    own = own_parameter_names(model)
    if own is not None:
        state = {name: tensor for name, tensor in state.items() if name in own}
    return {name: tensor.detach().contiguous().cpu() for name, tensor in state.items()}


def save_model(model: Transformer, tokenizer: Tokenizer, directory: str | Path,
               weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Write model.safetensors, model_config.json and tokenizer/ into `directory` (created if needed). `weights`
    replaces `model.state_dict()` (e.g. the full tensors gathered from a sharded model)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(_weights_to_save(model, weights), str(directory / WEIGHTS), metadata={"format": "pt"})
    (directory / MODEL_CONFIG).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    if getattr(model, "base_model", None) is not None:
        (directory / BASE_MODEL).write_text(json.dumps(model.base_model, indent=2) + "\n")
    tokenizer.save(directory / TOKENIZER)
    return directory


def read_model_config(checkpoint: Path) -> dict[str, Any]:
    """The model_config.json of a checkpoint directory, as a dict, in today's terms: a default a PE now records but
    earlier versions left out is filled in with the value it had then (`tapecli.model.pe.cope.saved_args`)."""
    from tapecli.model.pe.cope import saved_args

    path = checkpoint / MODEL_CONFIG
    with reading(path):
        config = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError(f"expected a JSON object, got {type(config).__name__}")
    return saved_args(config)


def load_weights(model: Transformer, checkpoint: Path, missing_ok: set[str] | frozenset[str] = frozenset(),
                 keep_saved_dtype: bool = False) -> None:
    """Copy a checkpoint's weights into `model`; any missing (except `missing_ok`: parameters new to the model,
    which keep their initial values), unexpected or mis-shaped tensor is a TapeError. With `keep_saved_dtype`, a
    parameter takes the dtype its saved tensor has (a model on a bf16 base keeps its own fp32 tensors fp32)."""
    from safetensors.torch import load_file

    with reading(checkpoint / WEIGHTS):
        state = load_file(str(checkpoint / WEIGHTS))
    expected = model.state_dict()
    if model.config.tie_embeddings:
        expected.pop("lm_head.weight", None)
    missing, unexpected = sorted(set(expected) - set(state) - set(missing_ok)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise TapeError(f"{checkpoint / WEIGHTS} does not fit the model: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}")
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise TapeError(f"{checkpoint / WEIGHTS}: {name} has shape {tuple(tensor.shape)}, the model expects "
                            f"{tuple(expected[name].shape)}")
    if keep_saved_dtype:
        for name, param in model.named_parameters():
            if name in state and param.dtype != state[name].dtype:
                param.data = param.data.to(state[name].dtype)
    model.load_state_dict(state, strict=False)


def load_checkpoint_tokenizer(checkpoint: Path) -> Tokenizer:
    """The tokenizer saved in a checkpoint; a corrupt one is one line naming it."""
    from tapecli.data.tokenizer import load_tokenizer_dir

    with reading(checkpoint / TOKENIZER):
        return load_tokenizer_dir(checkpoint / TOKENIZER)


def read_base_record(checkpoint: Path) -> dict[str, Any]:
    """base_model.json: where the Hugging Face base of a checkpoint was imported from; corrupt is one line."""
    with reading(checkpoint / BASE_MODEL):
        record = json.loads((checkpoint / BASE_MODEL).read_text(encoding="utf-8"))
        return {"source": str(record["source"]), "directory": str(record["directory"]), "lora": record.get("lora"),
                "fingerprint": record.get("fingerprint")}  # None in checkpoints written before it was recorded


# ---------------------------------------------------------------------------------------------------------------
# Training checkpoints


def save_checkpoint(root: Path, step: int, model: Transformer, tokenizer: Tokenizer, train_state: dict[str, Any],
                    keep_last: int = 0, weights: dict[str, torch.Tensor] | None = None) -> Path:
    """Atomically write `root/step-XXXXXXXX/`, then keep only the newest `keep_last` checkpoints (0 = all)."""
    import torch

    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    temp = root / f"{TEMP_PREFIX}{final.name}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        with writing(final):
            save_model(model, tokenizer, temp, weights)
            torch.save(train_state, temp / TRAIN_STATE)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)  # no partial checkpoint is left behind; older ones are untouched
        raise
    if final.exists():  # only when resuming from an older checkpoint of the same run: the old future is replaced
        _delete(final)
    temp.rename(final)
    if keep_last > 0:
        for old in list_checkpoints(root)[:-keep_last]:
            _delete(old)
    return final


def _delete(checkpoint: Path) -> None:
    """Rename out of the `step-*` namespace first, so a kill half-way through leaves only a `.tmp-*` directory."""
    doomed = checkpoint.with_name(f"{TEMP_PREFIX}deleted-{checkpoint.name}-{os.getpid()}")
    checkpoint.rename(doomed)
    shutil.rmtree(doomed)


def remove_temp_dirs(root: Path) -> None:
    """Delete what interrupted saves left behind."""
    if root.is_dir():
        for leftover in root.glob(f"{TEMP_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)


def load_train_state(checkpoint: Path) -> dict[str, Any]:
    """The train_state.pt of a training checkpoint (plain tensors and numbers, so `weights_only` loading works)."""
    import torch

    path = checkpoint / TRAIN_STATE
    if not path.is_file():
        raise TapeError(f"{checkpoint} has no {TRAIN_STATE}; it holds weights only and cannot be resumed "
                        "(use it with --checkpoint / train.init_from instead)")
    with reading(path):
        return torch.load(path, map_location="cpu", weights_only=True)
