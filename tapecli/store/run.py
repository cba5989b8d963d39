"""The run directory: what a training run leaves behind besides its checkpoints.

    RUN/recipe.yaml     the resolved recipe (after overrides), re-runnable with `--recipe RUN/recipe.yaml`
    RUN/run.json        seed, tapecli version, git revision, command line, start time (+ one entry per resume)
    RUN/metrics.jsonl   one JSON object per logged step and per validation
    RUN/checkpoints/    step-XXXXXXXX/ directories (see tapecli.store.checkpoint)
    RUN/eval-<name>/    what `tape eval <name>` writes by default, one folder per checkpoint (`eval_dir`)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tapecli
from tapecli.errors import TapeError
from tapecli.faults import check_output_dir, check_output_file, reading
from tapecli.files import JsonlLog, read_jsonl, write_atomic

if TYPE_CHECKING:
    from tapecli.recipe import Recipe

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
RECIPE = "recipe.yaml"
MODEL_CONFIG = "model_config.json"  # in each checkpoint (tapecli.store.checkpoint)
RUN_INFO = "run.json"
# What marks the other outputs tape writes (their owners: tapecli.eval.common, tapecli.experiments.sweep.runner,
# tapecli.store.checkpoint, tapecli.model.hf.export); `output_kind` reads them.
_MARKERS = [("sweep.json", "a sweep directory"), (RUN_INFO, "a tape run directory"),
            (CHECKPOINTS, "a tape run directory"), ("model_config.json", "a tape checkpoint"),
            ("settings.json", "an evaluation's output"), ("config.json", "a Hugging Face model directory")]


def git_revision() -> str | None:
    """The commit of the tapecli source tree, or None outside a git checkout (e.g. a pip install)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(tapecli.__file__).parent,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_run_files(run_dir: Path, recipe_yaml: str, seed: int, command: list[str], resumed_from: Path | None) -> None:
    """Write recipe.yaml and run.json. A resumed run keeps its original run.json and appends to `resumes`.
    An unreadable run.json fails before either file is rewritten."""
    info_path = run_dir / RUN_INFO
    entry = {"command": shlex.join(command), "time": _now()}
    if resumed_from is not None and info_path.exists():
        with reading(info_path):
            info = json.loads(info_path.read_text(encoding="utf-8"))
            info.setdefault("resumes", []).append({**entry, "checkpoint": str(resumed_from)})
    else:
        info = {"seed": seed, "version": tapecli.__version__, "git_revision": git_revision(),
                "command": entry["command"], "start_time": entry["time"]}
    run_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir / RECIPE, recipe_yaml)
    write_atomic(info_path, json.dumps(info, indent=2) + "\n")


@contextmanager
def removed_on_failure(run_dir: Path) -> Iterator[None]:
    """Undo what a failed setup created in `run_dir`: the directory itself if it is new (and the parents it needed),
    else new cache entries (a too-small corpus must not leave a tokenized `cache/` behind)."""
    run_dir = Path(run_dir)
    created = next((p for p in (*reversed(run_dir.absolute().parents), run_dir.absolute()) if not p.exists()), None)
    cache = run_dir / "cache"
    before = set(cache.iterdir()) if cache.is_dir() else None
    try:
        yield
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        elif before is None:
            shutil.rmtree(cache, ignore_errors=True)
        elif cache.is_dir():
            for entry in set(cache.iterdir()) - before:
                shutil.rmtree(entry, ignore_errors=True)
        raise


class MetricsLog(JsonlLog):
    """Append-only metrics.jsonl; each row is flushed at once so a killed run keeps everything it logged. Rows after
    `resume_step` (logged by a run killed after its last checkpoint, which the resumed run logs again) are dropped."""

    def __init__(self, path: Path, resume_step: int) -> None:
        super().__init__(path, keep=lambda rows: [row for row in rows if row.get("step", 0) <= resume_step])

    def log(self, row: dict[str, Any]) -> None:
        self.append([row])


def run_recipe_path(checkpoint: Path) -> Path:
    """Where the recipe of the run a checkpoint belongs to lives: RUN/checkpoints/step-N -> RUN/recipe.yaml."""
    return Path(checkpoint).parent.parent / RECIPE


def run_recipe(checkpoint: Path) -> Recipe | None:
    """The resolved recipe of the run a checkpoint belongs to, if any (a run written by tape 0.1 included). A
    plugin PE the recipe names that cannot be found is explained by the checkpoint's record of it (which package
    to install)."""
    from tapecli.errors import TapeError
    from tapecli.recipe import load_recipe

    path = run_recipe_path(checkpoint)
    if not path.is_file():
        return None
    try:
        return load_recipe(str(path), resolved=True)  # as the training that wrote it read it
    except TapeError:
        _explain_plugin(Path(checkpoint))
        raise


def _explain_plugin(checkpoint: Path) -> None:
    """Raise the one-line error of the checkpoint's own plugin record when its PE cannot be resolved here."""
    from tapecli.errors import TapeError
    from tapecli.model.pe import resolve_pe

    try:
        config = json.loads((checkpoint / MODEL_CONFIG).read_text(encoding="utf-8"))
        pe, record = config["pe"], config.get("pe_plugin")
    except (OSError, ValueError, KeyError, TypeError):
        return  # no readable record: the recipe's own error stands
    if record:
        try:
            resolve_pe(pe, record)
        except ValueError as e:
            raise TapeError(f"{checkpoint / MODEL_CONFIG}: {e}") from None


def run_of(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint belongs to (RUN/checkpoints/step-N -> RUN), or None for a lone checkpoint."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else None


def check_no_links(root: Path, entries: list[Path], what: str) -> None:
    """Refuse to write through a symbolic link inside a directory someone else may have made: each of `entries`
    (paths under `root` that tape is about to write into or below) and every folder between it and `root` must be
    a real file or folder, so that a run directory handed over with `checkpoints -> ~/` cannot make tape write or
    prune outside it. `root` itself may be a link: the user named it."""
    root = Path(root)
    for entry in entries:
        path = Path(entry)
        while path != root and root in path.parents:
            if path.is_symlink():
                raise TapeError(f"{path} is a symbolic link (to {os.readlink(path)}); tape does not write through "
                                f"links inside {what}: replace it with a real folder or file")
            path = path.parent


def run_entries(run_dir: Path) -> list[Path]:
    """What training writes into a run directory: its files, the checkpoints folder and every checkpoint in it, the
    data cache."""
    run_dir = Path(run_dir)
    checkpoints = run_dir / CHECKPOINTS
    inside = sorted(checkpoints.iterdir()) if checkpoints.is_dir() and not checkpoints.is_symlink() else []
    return [run_dir / name for name in (RECIPE, RUN_INFO, METRICS, CHECKPOINTS, "cache")] + inside


def eval_dir(evaluation: str, kind: str, source: str, per_checkpoint: bool = True) -> Path:
    """Where `tape eval <evaluation>` writes for one model when no --out is given; the one rule of every evaluation.

    A checkpoint of a run: RUN/eval-<evaluation>/<checkpoint name> (RUN/eval-<evaluation> when not
    `per_checkpoint`); a checkpoint outside a run: CHECKPOINT/eval-<evaluation>; a Hugging Face model (`kind` "hf",
    `source` its directory or hub id): ./eval-<evaluation>/<its folder name or hub id, made safe for a path>.
    """
    folder = f"eval-{evaluation}"
    if kind != "tape":
        return Path(folder) / safe_name(Path(source).name if Path(source).exists() else source)
    checkpoint = Path(source)
    run = run_of(checkpoint)
    if run is None:
        check_no_links(checkpoint, [checkpoint / folder], "a checkpoint directory")
        return checkpoint / folder
    out = run / folder / checkpoint.name if per_checkpoint else run / folder
    check_no_links(run, [out], "a run directory")
    return out


def safe_name(name: str) -> str:
    """`name` as one folder name: every run of characters other than letters, digits, `.`, `_` and `-` becomes `_`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def output_kind(path: Path) -> str | None:
    """What tape (or an export) wrote in the directory `path` ("a tape run directory", "an evaluation's output",
    "a Hugging Face model directory", "a tape checkpoint", "a sweep directory"), else None."""
    for marker, kind in _MARKERS:
        if (Path(path) / marker).exists():
            return kind
    return None


def check_output(path: str | Path, option: str = "--out", *, file: bool = False, run: bool = False) -> None:
    """Fail now, in one line, if a command may not write its output `path` (a directory, or a file with `file`):
    one it cannot create or write (`tapecli.faults.check_output_dir` / `check_output_file`), a run's checkpoints
    folder or anything inside it (they hold only what training saves; a checkpoint is read by every evaluation), a
    checkpoint, or a run directory, unless the command writes runs (`run`: pretrain, finetune, extend-context).
    Every command that takes an output path checks it here, before any work."""
    path = Path(path)
    (check_output_file if file else check_output_dir)(path, option)
    where = path.expanduser().absolute()
    for folder in (where, *where.parents):
        if folder.name == CHECKPOINTS and any((folder.parent / name).is_file() for name in (RUN_INFO, RECIPE, METRICS)):
            raise TapeError(f"{option} {path} is inside the checkpoints of the run {folder.parent}, which hold only "
                            f"what its training saves; pass an {option} outside {folder}")
    if not file and (where / MODEL_CONFIG).is_file():
        raise TapeError(f"{option} {path} is a tape checkpoint; pass a new {option} (a checkpoint holds only what "
                        "its training saved)")
    if not file and not run and output_kind(where) == "a tape run directory":
        raise TapeError(f"{option} {path} is a tape run directory, which only its training writes into; pass a new "
                        f"{option}")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All rows of RUN/metrics.jsonl."""
    return read_jsonl(Path(run_dir) / METRICS)
