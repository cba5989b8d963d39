"""tapecli.eval.common: --pe-arg values, the resumable log, batched greedy decoding, what is built once per tokenizer
(opening models: test_door)."""

from __future__ import annotations

import json

import pytest
import torch

from tapecli.errors import TapeError
from tapecli.eval.common import SamplesLog, generate_batch, parse_pe_args, per_tokenizer
from tapecli.files import read_jsonl
from tapecli.model import ModelConfig, Transformer


def tiny(pe: str = "rope", **pe_args) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, max_seq_len=32, pe=pe,
                                   pe_args=pe_args)).eval()


def test_parse_pe_args_reads_yaml_values_and_refuses_a_bare_key():
    assert parse_pe_args(["scaling=linear", "factor=2", "theta=1e6"]) == {"scaling": "linear", "factor": 2,
                                                                          "theta": 1e6}
    with pytest.raises(TapeError, match="key=value"):
        parse_pe_args(["scaling"])


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


def test_per_tokenizer_builds_once_per_distinct_tokenizer(monkeypatch):
    """Two objects of one tokenizer share what was built; another tokenizer gets its own; each object is
    fingerprinted once."""
    from tapecli.data import tokenizer as tokenizers

    made, fingerprinted = [], []
    real = tokenizers.tokenizer_fingerprint
    monkeypatch.setattr(tokenizers, "tokenizer_fingerprint", lambda t: fingerprinted.append(t) or real(t))
    cache: dict = {}
    first, same, other = tokenizers.load_tokenizer("byte"), tokenizers.load_tokenizer("byte"), \
        tokenizers.load_tokenizer("addition")

    def build(name):
        return lambda: made.append(name) or name

    assert per_tokenizer(cache, first, build("byte")) == "byte"
    assert per_tokenizer(cache, first, build("again")) == "byte"
    assert per_tokenizer(cache, same, build("same")) == "byte"
    assert per_tokenizer(cache, other, build("addition")) == "addition"
    assert made == ["byte", "addition"]
    assert [id(t) for t in fingerprinted] == [id(first), id(same), id(other)]
