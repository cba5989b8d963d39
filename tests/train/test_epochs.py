"""The papers' protocol on generated tasks: a fixed training set passed over for train.epochs (reshuffled every
epoch, resumed exactly mid-epoch after a SIGKILL), dropout in training only, and the task's accuracy logged at
every validation."""

from __future__ import annotations

import pytest
import torch
from train_helpers import assert_same_weights, kill_after_first_checkpoint, subprocess_env, weights
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.synthetic import SyntheticDataset
from tapecli.model import ModelConfig, Transformer
from tapecli.recipe import load_recipe
from tapecli.store.door import open_model
from tapecli.store.run import read_metrics
from tapecli.train.engine import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


def test_each_epoch_passes_over_the_fixed_set_once_in_a_new_order(tmp_path, monkeypatch):
    read: list[int] = []
    original = SyntheticDataset.__getitem__

    def recording(self, index):
        if self.split == "train":
            read.append(index)
        return original(self, index)

    monkeypatch.setattr(SyntheticDataset, "__getitem__", recording)
    recipe = load_recipe("flip-flop-smoke", ["data.train_size=12", "train.batch_size=4", "train.epochs=3",
                                             "train.eval_every=0", "train.save_every=100"])
    assert recipe.train.max_steps == 9
    pretrain(recipe, tmp_path / "run")
    read = read[1:]  # setup reads one example before training, to fail early on unreadable data
    epochs = [read[k : k + 12] for k in range(0, 36, 12)]
    assert len(read) == 36 and all(sorted(epoch) == list(range(12)) for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch


def test_a_killed_run_resumes_mid_epoch_bitwise(tmp_path):
    """24 sequences, batch 8: an epoch is 3 steps. The first checkpoint (step 4) is one step into the second epoch;
    a run SIGKILLed right after it and resumed ends with exactly the weights of an uninterrupted run, dropout
    included (its random draws resume with the checkpoint's RNG state). The killed run is a real process (~5 s on an
    idle CPU): the kill must hit a process; the same command resumes it here, in this process (one thread, as the
    child)."""
    env = subprocess_env()
    overrides = ["data.train_size=24", "train.batch_size=8", "train.epochs=10", "train.save_every=4",
                 "train.keep_last=0", "train.eval_every=0", "model.dropout=0.1"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    pretrain(load_recipe("flip-flop-smoke", overrides), whole)  # in this process: one thread, as the child
    args = ["pretrain", "--recipe", "flip-flop-smoke", "--out", str(killed), *overrides]
    kill_after_first_checkpoint(args, killed, env, 30)
    resumed = CliRunner().invoke(app, args)
    assert resumed.exit_code == 0 and f"resuming from {killed / 'checkpoints'}" in resumed.output, resumed.output
    assert_same_weights(weights(whole), weights(killed))
    assert_same_weights(weights(whole / "checkpoints" / "step-00000004"),
                        weights(killed / "checkpoints" / "step-00000004"))


def tiny(dropout: float) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=16, dim=32, n_layers=2, n_heads=2, max_seq_len=16, dropout=dropout))


def test_dropout_in_training_only():
    ids = torch.randint(3, 16, (2, 12))
    plain, dropped = tiny(0.0), tiny(0.3)
    reference = plain.eval()(ids)
    torch.testing.assert_close(dropped.eval()(ids), reference, rtol=0, atol=0)  # off at evaluation
    torch.testing.assert_close(plain.train()(ids), reference, rtol=0, atol=0)  # 0: nothing dropped
    torch.manual_seed(1)
    first = dropped.train()(ids)
    torch.manual_seed(1)
    assert torch.equal(dropped(ids), first)  # the draws follow torch's RNG (so a resumed run repeats them)
    assert not torch.allclose(dropped(ids), first)
    assert (first - reference).abs().max() > 0.01
    # A checkpoint written before model.dropout existed opens with none.
    saved = {k: v for k, v in plain.config.to_dict().items() if k != "dropout"}
    assert ModelConfig.from_dict(saved).dropout == 0.0


def test_validation_logs_the_task_accuracy(tmp_path):
    """At each validation, the argmax accuracy over the read bits of the validation sequences it scores: per token
    and per sequence, as counted here by hand from the final model."""
    run = pretrain(load_recipe("flip-flop-smoke", ["train.eval_batches=3"]), tmp_path / "run")
    rows = [row for row in read_metrics(run) if "val_loss" in row]
    assert [row["step"] for row in rows] == [2, 4]
    assert set(rows[-1]) == {"step", "val_loss", "val_token_accuracy", "val_accuracy"}
    model = open_model(str(run), device="cpu", dtype="fp32").model
    recipe = load_recipe(str(run / "recipe.yaml"))
    _, val = recipe.data.build(None, recipe.train.seed, tmp_path)
    right = scored = whole = 0
    for index in range(12):  # eval_batches x micro_batch_size
        example, (inputs, _) = val.example(index), val[index]
        guess = model(inputs[None])[0].argmax(-1).tolist()
        gold = val.tokenizer.encode(example.text)
        hits = [guess[t] == gold[t] for t, s in enumerate(example.scored) if s]
        right, scored, whole = right + sum(hits), scored + len(hits), whole + all(hits)
    assert rows[-1]["val_token_accuracy"] == pytest.approx(right / scored)
    assert rows[-1]["val_accuracy"] == pytest.approx(whole / 12)


def test_constant_schedule_with_and_without_warm_up():
    from tapecli.train.optim import lr_at

    warm = [lr_at(s, lr=2e-4, min_lr=0.0, warmup_steps=3, max_steps=8, schedule="constant") for s in range(8)]
    assert warm == pytest.approx([2e-4 / 3, 4e-4 / 3, 2e-4, 2e-4, 2e-4, 2e-4, 2e-4, 2e-4])
    assert {lr_at(s, lr=2e-4, min_lr=0.0, warmup_steps=0, max_steps=8, schedule="constant") for s in range(8)} == {2e-4}
