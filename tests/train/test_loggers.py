"""`train.loggers`: TensorBoard and W&B (offline) receive exactly what metrics.jsonl receives, and a run resumed
after a crash continues the same curves (TensorBoard purges the steps logged after the checkpoint; W&B continues
the same run id, kept in RUN/wandb.json)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from train_helpers import write_recipe
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.recipe import load_recipe
from tapecli.store.run import read_metrics
from tapecli.train import engine
from tapecli.train.loggers import scalars

runner = CliRunner()


class Crash(Exception):
    pass


def crashed_then_resumed(tmp_path: Path, corpus: Path, loggers: list[str], monkeypatch: pytest.MonkeyPatch) -> Path:
    """4 steps, checkpoint every step; the first process dies while saving step 3 (steps 1-3 already logged),
    the second resumes from step 2 and logs steps 3 and 4 again."""
    recipe = write_recipe(tmp_path / "r.yaml", corpus, train={"save_every": 1, "loggers": loggers})
    real_save = engine.save

    def crash_at_3(job: engine.Job, step: int, elapsed: float) -> Path:
        if step == 3:
            raise Crash
        return real_save(job, step, elapsed)

    monkeypatch.setattr(engine, "save", crash_at_3)
    with pytest.raises(Crash):
        engine.pretrain(load_recipe(str(recipe)), tmp_path / "run")
    monkeypatch.undo()
    return engine.pretrain(load_recipe(str(recipe)), tmp_path / "run")


def expected_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as (step, value) curves under the loggers' names."""
    curves: dict[str, list[tuple[int, float]]] = {}
    for row in read_metrics(run):
        for tag, value in scalars(row).items():
            curves.setdefault(tag, []).append((row["step"], value))
    return curves


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_metrics_and_resume_purges(tmp_path: Path, tiny_corpus: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = crashed_then_resumed(tmp_path, tiny_corpus, ["jsonl", "tensorboard"], monkeypatch)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    expected = expected_curves(run)
    assert set(events.Tags()["scalars"]) == set(expected) >= {"train/loss", "train/lr", "train/tokens_per_s",
                                                              "train/grad_norm", "val/loss"}
    for tag, curve in expected.items():
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in logged] == [s for s, _ in curve], tag  # each step once: 3 was purged, then relogged
        assert [v for _, v in logged] == pytest.approx([v for _, v in curve], rel=1e-6), tag  # stored as float32


def wandb_records(path: Path):
    """The records of a W&B `.wandb` transaction log (LevelDB log format: 7-byte header, then in 32 KiB blocks,
    chunks of crc32 (4) + length (2) + type (1) + data). Written here because wandb no longer ships a reader."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending = 7, 32768, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # block trailer padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


@pytest.mark.slow
def test_wandb_offline_logs_the_metrics_and_a_resumed_run_continues_it(tmp_path: Path, tiny_corpus: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, no account
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):  # nothing outside tmp_path
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    run = crashed_then_resumed(tmp_path, tiny_corpus, ["jsonl", "wandb"], monkeypatch)

    run_id = json.loads((run / "wandb.json").read_text())["id"]
    offline = sorted((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 2  # the crashed process and the resumed one
    history: dict[int, dict[str, float]] = {}
    for folder in offline:
        (log,) = folder.glob("run-*.wandb")
        assert log.name == f"run-{run_id}.wandb"  # both processes wrote to the same W&B run
        for record in wandb_records(log):
            if record.WhichOneof("record_type") == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                if "_step" not in items:
                    continue
                history.setdefault(items["_step"], {}).update(
                    {k: v for k, v in items.items() if not k.startswith("_")})
    for tag, curve in expected_curves(run).items():
        assert [(step, history[step][tag]) for step, _ in curve] == curve, tag  # JSON floats: exact


def test_a_chosen_logger_that_is_not_installed_is_one_line(tmp_path: Path, tiny_corpus: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tapecli.train import loggers

    monkeypatch.setitem(loggers._EXTRAS, "tensorboard", "tensorboard_is_not_installed")  # find_spec finds nothing
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus)
    result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"),
                                 "train.loggers=[jsonl,tensorboard]"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == ("error: train.loggers: tensorboard is not installed; pip install "
                                     "'tapecli[tensorboard]' (or drop tensorboard from train.loggers)")
    assert not (tmp_path / "run").exists()


def test_loggers_key_is_validated(tmp_path: Path, tiny_corpus: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tiny_corpus)
    for value, message in [("[jsonl,mlflow]", "train.loggers: expected one of jsonl, tensorboard, wandb"),
                           ("[jsonl,jsonl]", "train.loggers: lists a logger twice")]:
        result = runner.invoke(app, ["pretrain", "--recipe", str(recipe), "--out", str(tmp_path / "run"),
                                     f"train.loggers={value}"])
        assert result.exit_code == 2 and message in result.stderr, result.output
    assert load_recipe(str(recipe), ["train.loggers=tensorboard"]).train.loggers == ["tensorboard"]
