"""Where training metrics go (`train.loggers`): RUN/metrics.jsonl, TensorBoard, Weights & Biases.

Every logger receives exactly the rows `metrics.jsonl` receives -- `{"step", "loss", "lr", "tokens",
"tokens_per_s", "elapsed", "grad_norm"}` per logged step and `{"step", "val_loss"}` per validation (plus
`val_token_accuracy` and `val_accuracy` for the generated tasks) -- through one small interface, `log(row)` and
`close()`. TensorBoard and W&B are optional extras, imported only when chosen.

A resumed run continues the same curves: metrics.jsonl drops the rows after the resumed step, TensorBoard purges
events after it (`purge_step`), and W&B continues the same run, whose id is kept in RUN/wandb.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from pathlib import Path
from typing import Any, Protocol

from tapecli.errors import TapeError
from tapecli.files import write_atomic
from tapecli.store.run import METRICS, MetricsLog

TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb.json"
_EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}  # logger -> the module it needs (= the pip extra)


class Logger(Protocol):
    def log(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def check_loggers(names: list[str]) -> None:
    """Fail before anything is written if a chosen logger's package is not installed."""
    for name in names:
        module = _EXTRAS.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            raise TapeError(f"train.loggers: {name} is not installed; pip install 'tapecli[{name}]' "
                            f"(or drop {name} from train.loggers)")


def open_loggers(names: list[str], run_dir: Path, resume_step: int, config: dict[str, Any]) -> Loggers:
    """The chosen loggers for run directory `run_dir`, continuing after `resume_step` (0 for a fresh run)."""
    opened: list[Logger] = []
    try:
        for name in names:
            if name == "jsonl":
                opened.append(MetricsLog(run_dir / METRICS, resume_step))
            elif name == "tensorboard":
                opened.append(TensorBoardLogger(run_dir / TENSORBOARD_DIR, resume_step))
            elif name == "wandb":
                opened.append(WandbLogger(run_dir, config))
    except BaseException:
        Loggers(opened).close()
        raise
    return Loggers(opened)


class Loggers:
    """Sends each row to every chosen logger."""

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = loggers

    def log(self, row: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(row)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row as named curves: `val_<name>` -> `val/<name>` (val/loss, val/accuracy, ...), every other value
    -> `train/<key>`."""
    return {(f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"): float(value)
            for key, value in row.items() if key != "step"}


class TensorBoardLogger:
    """Event files in RUN/tensorboard/; a resumed run purges the events logged after its checkpoint."""

    def __init__(self, log_dir: Path, resume_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir), purge_step=resume_step + 1 if resume_step else None)

    def log(self, row: dict[str, Any]) -> None:
        for tag, value in scalars(row).items():
            self.writer.add_scalar(tag, value, global_step=row["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """One W&B run per run directory: its id is kept in RUN/wandb.json so a resumed run continues it.
    Offline (`WANDB_MODE=offline`) it writes under RUN/wandb/ and never touches the network."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        run_id = json.loads(id_file.read_text())["id"] if id_file.is_file() else secrets.token_hex(4)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "tape"), name=run_dir.name, id=run_id,
                                  resume="allow", dir=str(run_dir), config=config, reinit="finish_previous")
        except Exception as e:  # no login, no network: one line saying what to do
            reason = " ".join(str(e).split())
            raise TapeError(f"train.loggers: wandb could not start ({reason}); run `wandb login`, or set "
                            "WANDB_MODE=offline") from None
        if not id_file.is_file():
            write_atomic(id_file, json.dumps({"id": run_id}) + "\n")

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(scalars(row), step=row["step"])

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # waits for the W&B service to write everything (finish alone may return before)
