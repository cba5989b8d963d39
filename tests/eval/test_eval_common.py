"""tapecli.eval.common: opening models for evaluation, PE overrides, the resumable log, batched greedy decoding."""

from __future__ import annotations

import json

import pytest
import torch

from tapecli.data.tokenizer import ByteTokenizer
from tapecli.errors import TapeError
from tapecli.eval.common import SamplesLog, generate_batch, open_model, parse_pe_args
from tapecli.files import read_jsonl
from tapecli.model import ModelConfig, Transformer
from tapecli.store.checkpoint import save_model


def tiny(pe: str = "rope", **pe_args) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, max_seq_len=32, pe=pe,
                                   pe_args=pe_args)).eval()


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with two checkpoints; the newer one holds a different model."""
    save_model(tiny(), ByteTokenizer(), tmp_path / "run" / "checkpoints" / "step-00000001")
    model = tiny()
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    save_model(model, ByteTokenizer(), tmp_path / "run" / "checkpoints" / "step-00000002")
    return tmp_path / "run", model


def test_open_model_takes_a_run_or_a_checkpoint(run_dir):
    run, newest = run_dir
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    opened = open_model(str(run), device="cpu")
    assert opened.kind == "tape" and opened.dtype == "fp32" and opened.name == "run"
    assert opened.source.endswith("step-00000002") and not opened.model.training
    torch.testing.assert_close(opened.model(ids), newest(ids), rtol=0, atol=0)
    older = open_model(str(run / "checkpoints" / "step-00000001"), device="cpu", dtype="bf16")
    assert older.name == "run/step-00000001" and next(older.model.parameters()).dtype == torch.bfloat16
    assert older.record()["dtype"] == "bf16" and older.record()["pe"] == "rope"


def test_open_model_errors_are_one_line(tmp_path, run_dir):
    with pytest.raises(TapeError, match="does not exist"):
        open_model(str(tmp_path / "missing"), device="cpu")
    with pytest.raises(TapeError, match="--dtype: unknown dtype 'fp8'"):
        open_model(str(run_dir[0]), device="cpu", dtype="fp8")
    with pytest.raises(TapeError, match="--pe-arg: bogus: not an argument of pe 'rope'"):
        open_model(str(run_dir[0]), device="cpu", pe_args={"bogus": 1})
    with pytest.raises(TapeError, match="key=value"):
        parse_pe_args(["scaling"])


def test_pe_args_override_equals_a_model_built_with_them(run_dir):
    run, newest = run_dir
    assert parse_pe_args(["scaling=linear", "factor=2", "theta=1e6"]) == {"scaling": "linear", "factor": 2,
                                                                          "theta": 1e6}
    opened = open_model(str(run), device="cpu", pe_args={"scaling": "linear", "factor": 2})
    assert opened.model.config.pe_args == {"scaling": "linear", "factor": 2.0}
    reference = tiny(scaling="linear", factor=2.0)
    reference.load_state_dict(newest.state_dict())
    ids = torch.arange(20)[None]
    torch.testing.assert_close(opened.model(ids), reference(ids), rtol=0, atol=0)
    assert not torch.allclose(opened.model(ids), newest(ids))  # the override did change the model


def test_pe_args_that_change_weight_shapes_are_refused(tmp_path):
    save_model(tiny("tape"), ByteTokenizer(), tmp_path / "ckpt")
    with pytest.raises(TapeError, match="changes the shape"):
        open_model(str(tmp_path / "ckpt"), device="cpu", pe_args={"hidden": 3})


def test_samples_log_resumes_refuses_other_settings_and_skips_a_torn_line(tmp_path):
    with SamplesLog(tmp_path, {"a": 1, "lengths": (1, 2)}) as log:
        log.append([{"x": 1}, {"x": 2}])
    with (tmp_path / "samples.jsonl").open("a") as f:
        f.write('{"x": 3, "y"')  # cut off mid-write
    with SamplesLog(tmp_path, {"a": 1, "lengths": [1, 2]}, keep=lambda rows: rows[:1]) as log:
        assert log.rows == [{"x": 1}]  # the torn line is skipped, `keep` drops the rest
        log.append([{"x": 4}])
    assert read_jsonl(tmp_path / "samples.jsonl") == [{"x": 1}, {"x": 4}]
    assert json.loads((tmp_path / "settings.json").read_text()) == {"a": 1, "lengths": [1, 2]}
    with pytest.raises(TapeError, match=r"other settings \(a, b differ\)"):
        SamplesLog(tmp_path, {"a": 2, "lengths": [1, 2], "b": 0})
    # A directory without finished units (a run that failed before its first one) takes the new settings.
    SamplesLog(tmp_path / "fresh", {"a": 1}).close()
    SamplesLog(tmp_path / "fresh", {"a": 2}).close()
    assert json.loads((tmp_path / "fresh" / "settings.json").read_text()) == {"a": 2}
    (tmp_path / "samples.jsonl").write_text('{"x": 1}\n{"x"\n{"x": 2}\n')
    with pytest.raises(TapeError, match="line 2 is not JSON"):
        SamplesLog(tmp_path, {"a": 1, "lengths": [1, 2]})


def test_generate_batch_equals_one_prompt_at_a_time():
    model = tiny()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8], [9]]
    batched = generate_batch(model, prompts, max_new_tokens=4, batch_size=2)
    for prompt, continuation in zip(prompts, batched, strict=True):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=4, use_cache=False)[0, len(prompt):]
        assert continuation == alone.tolist()
