"""`tape eval perplexity`: each protocol equals a naive per-token loop (tape checkpoint) and transformers (a Hugging
Face Llama, once the importer exists); windows, seeded window choice, text sources, resume, CLI, plot."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.tokenizer import ByteTokenizer
from tapecli.errors import TapeError
from tapecli.eval import perplexity
from tapecli.eval.perplexity import chosen_windows, evaluate_perplexity, make_windows
from tapecli.model import ModelConfig, Transformer
from tapecli.store.checkpoint import save_model

runner = CliRunner()
PROTOCOLS = ("longlora", "disjoint", "sliding")


def tiny_model(pe: str = "rope", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32,
                                   pe=pe)).eval()


@pytest.fixture
def checkpoint(tmp_path):
    return save_model(tiny_model(), ByteTokenizer(), tmp_path / "ckpt")


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "test.bin"
    np.random.default_rng(0).integers(0, 259, size=131).astype(np.uint16).tofile(path)
    return path


def naive_nll(model, tokens: list[int], seq_len: int, protocol: str, stride: int) -> tuple[float, int, int]:
    """(summed NLL, scored predictions, argmax hits), written straight from each protocol's definition, one token
    at a time in fp64."""
    n = len(tokens)
    if protocol == "longlora":  # LongLoRA eval.py: for idx in range(0, len - seq_len, stride), labels = inputs
        spans = [(s, s + seq_len, s + 1) for s in range(0, n - seq_len, stride)]
    elif protocol == "disjoint":
        spans = [(s, s + seq_len, s + 1) for s in range(0, n - seq_len + 1, seq_len)]
    else:  # Hugging Face "perplexity of fixed-length models": score only the last trg_len tokens of each window
        spans, prev_end = [], 0
        for begin in range(0, n, stride):
            end = min(begin + seq_len, n)
            trg_len = end - prev_end
            spans.append((begin, end, max(end - trg_len, begin + 1)))
            prev_end = end
            if end == n:
                break
    total, count, hits = 0.0, 0, 0
    for start, end, first in spans:
        with torch.no_grad():
            logits = model(torch.tensor([tokens[start:end]]))[0].double()
        for t in range(first, end):
            log_probs = logits[t - 1 - start].log_softmax(-1)
            total -= float(log_probs[tokens[t]])
            count += 1
            hits += int(int(log_probs.argmax()) == tokens[t])
    return total, count, hits


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_protocol_equals_a_naive_loop(tmp_path, checkpoint, token_file, protocol):
    results = evaluate_perplexity([str(checkpoint)], str(token_file), [16, 40], tmp_path / "out", protocol=protocol,
                                  stride=12, device="cpu", batch_size=3, show_progress=False)
    tokens = np.fromfile(token_file, dtype=np.uint16).astype(int).tolist()
    model = tiny_model()
    for seq_len in (16, 40):
        total, count, hits = naive_nll(model, tokens, seq_len, protocol, stride=12)
        got = results["models"][0]["lengths"][str(seq_len)]
        assert got["tokens"] == count and got["token_accuracy"] == hits / count
        assert got["nll"] == pytest.approx(total / count, rel=1e-5)
        assert got["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)
    if protocol == "sliding":  # every token after the first scored exactly once
        assert results["models"][0]["lengths"]["16"]["tokens"] == len(tokens) - 1
    assert results["protocol"] == protocol and results["settings"]["stride"] == 12


def test_windows_of_each_protocol():
    assert [w.start for w in make_windows(100, 32, "longlora", 16)] == [0, 16, 32, 48, 64]  # start < 100 - 32
    assert [(w.start, w.end) for w in make_windows(100, 32, "disjoint", 16)] == [(0, 32), (32, 64), (64, 96)]
    sliding = make_windows(100, 32, "sliding", 24)
    assert [(w.start, w.end, w.score_from) for w in sliding] == [(0, 32, 1), (24, 56, 32), (48, 80, 56),
                                                                 (72, 100, 80)]
    picked = chosen_windows(50, 7, seed=3, seq_len=32)
    assert picked == chosen_windows(50, 7, seed=3, seq_len=32) == sorted(set(picked)) and len(picked) == 7
    assert picked != chosen_windows(50, 7, seed=4, seq_len=32) and chosen_windows(5, 7, 3, 32) == list(range(5))


def test_max_windows_resume_and_the_command_line(tmp_path, checkpoint, token_file, monkeypatch):
    other = save_model(tiny_model(seed=1), ByteTokenizer(), tmp_path / "other")
    args = ["eval", "perplexity", "--model", str(checkpoint), "--model", str(other), "--data", str(token_file),
            "--seq-len", "16,32", "--stride", "8", "--max-windows", "4", "--seed", "1", "--device", "cpu"]
    reference = runner.invoke(app, [*args, "--out", str(tmp_path / "ref")])
    assert reference.exit_code == 0, reference.output
    assert "ckpt: perplexity 16:" in reference.output and "other: perplexity" in reference.output
    expected = json.loads((tmp_path / "ref" / "results.json").read_text())
    assert [m["name"] for m in expected["models"]] == ["ckpt", "other"]
    assert expected["models"][0]["lengths"]["16"]["windows"] == 4
    assert expected["models"][0]["lengths"]["16"]["windows_total"] == len(make_windows(131, 16, "longlora", 8))
    assert (tmp_path / "ref" / "perplexity.png").read_bytes()[:4] == b"\x89PNG"

    calls, original = [], perplexity.score_windows

    def interrupted(model, tokens, windows):
        calls.append(len(windows))
        if len(calls) == 6:
            raise KeyboardInterrupt
        return original(model, tokens, windows)

    monkeypatch.setattr(perplexity, "score_windows", interrupted)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        evaluate_perplexity([str(checkpoint), str(other)], str(token_file), [16, 32], out, stride=8, max_windows=4,
                            seed=1, device="cpu", show_progress=False)
    calls.clear()
    monkeypatch.setattr(perplexity, "score_windows", lambda m, t, w: calls.append(len(w)) or original(m, t, w))
    resumed = runner.invoke(app, [*args, "--out", str(out)])
    assert resumed.exit_code == 0, resumed.output
    assert len(calls) == 16 - 5  # 2 models x 2 lengths x 4 windows, batch 1: only the unfinished ones
    got = json.loads((out / "results.json").read_text())
    assert [m["lengths"] for m in got["models"]] == [m["lengths"] for m in expected["models"]]
    changed = runner.invoke(app, [*args, "--out", str(out), "--protocol", "disjoint"])
    assert changed.exit_code == 2 and "other settings (protocol differ)" in changed.output


def test_text_sources_are_tokenized_as_bos_document_eos(tmp_path, checkpoint, tiny_corpus):
    stream = perplexity.load_stream(str(tiny_corpus), ByteTokenizer(), max_tokens=5000)
    first = sorted(tiny_corpus.iterdir())[0].read_text(encoding="utf-8").encode()
    assert stream[0] == 256 and stream[1 : len(first) + 1].tolist() == list(first) and stream[len(first) + 1] == 257
    assert len(stream) == 5000
    results = evaluate_perplexity([str(checkpoint)], str(tiny_corpus), [64], tmp_path / "out", max_tokens=1000,
                                  stride=64, device="cpu", show_progress=False)
    assert results["models"][0]["data_tokens"] == 1000 and results["models"][0]["lengths"]["64"]["windows"] == 15


def test_bad_input_is_one_line(tmp_path, checkpoint, token_file):
    wide = tmp_path / "wide.u32.bin"
    np.array([1, 2, 70000, 3] * 20, dtype=np.uint32).tofile(wide)
    with pytest.raises(TapeError, match="token id 70000, but ckpt has a vocabulary of 259"):
        evaluate_perplexity([str(checkpoint)], str(wide), [8], tmp_path / "a", device="cpu", show_progress=False)
    with pytest.raises(TapeError, match="too few for one window of --seq-len 4096"):
        evaluate_perplexity([str(checkpoint)], str(token_file), [4096], tmp_path / "b", device="cpu",
                            show_progress=False)
    result = runner.invoke(app, ["eval", "perplexity", "--model", str(checkpoint), "--data", str(token_file),
                                 "--protocol", "bogus", "--out", str(tmp_path / "c")])
    assert result.exit_code == 2 and "unknown protocol 'bogus'" in result.output
    with pytest.raises(TapeError, match="--max-windows must be a positive integer, got 0"):
        evaluate_perplexity([str(checkpoint)], str(token_file), [8], tmp_path / "e", max_windows=0)
    result = runner.invoke(app, ["eval", "perplexity", "--model", str(checkpoint), "--data", str(token_file),
                                 "--pe-arg", "bogus=1", "--out", str(tmp_path / "d"), "--device", "cpu"])
    assert result.exit_code == 2 and "--pe-arg: bogus: not an argument of pe 'rope'" in result.output


def save_tiny_llama(directory, vocab_size: int = 300):
    """A tiny Llama (GQA) and a byte-level BPE tokenizer with BOS/EOS, saved as transformers saves them."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the pass key is 12345. the grass is green. the sky is blue."] * 20, trainer)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(
        directory)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return model


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    """(the directory, the transformers model) of `save_tiny_llama`, once for the three protocols."""
    directory = tmp_path_factory.mktemp("llama")
    return directory, save_tiny_llama(directory)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_protocol_equals_transformers_on_a_hugging_face_llama(tmp_path, protocol, llama):
    pytest.importorskip("tapecli.model.hf.load")  # the importer (issue 8)
    directory, hf_model = llama
    vocab = hf_model.config.vocab_size
    data = tmp_path / "test.bin"
    tokens = np.random.default_rng(1).integers(0, vocab, size=150).astype(np.uint16)
    tokens.tofile(data)
    results = evaluate_perplexity([str(directory)], str(data), [24, 48], tmp_path / "out",
                                  protocol=protocol, stride=16, device="cpu", dtype="fp32", show_progress=False)
    ids = torch.tensor(tokens.astype(np.int64))[None]
    for seq_len in (24, 48):
        total, count = 0.0, 0
        if protocol == "sliding":  # the Hugging Face documentation's loop, weighting each window by its targets
            prev_end = 0
            for begin in range(0, ids.shape[1], 16):
                end = min(begin + seq_len, ids.shape[1])
                trg_len = end - prev_end
                inputs = ids[:, begin:end]
                labels = inputs.clone()
                labels[:, :-trg_len] = -100
                with torch.no_grad():
                    loss = hf_model(inputs, labels=labels).loss
                scored = int((labels[:, 1:] != -100).sum())
                total, count = total + float(loss) * scored, count + scored
                prev_end = end
                if end == ids.shape[1]:
                    break
        else:  # LongLoRA eval.py: model(x, labels=x) per window; disjoint windows the same way
            step = 16 if protocol == "longlora" else seq_len
            last = ids.shape[1] - seq_len if protocol == "longlora" else ids.shape[1] - seq_len + 1
            for start in range(0, last, step):
                window = ids[:, start : start + seq_len]
                with torch.no_grad():
                    loss = hf_model(window, labels=window).loss
                total, count = total + float(loss) * (seq_len - 1), count + seq_len - 1
        got = results["models"][0]["lengths"][str(seq_len)]
        assert got["tokens"] == count
        assert got["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)
