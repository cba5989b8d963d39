"""`tape eval passkey`: the prompts are the official ones (budgets, seeding, key placement), answers are scored on
token ids, files and resume, the depth x length sweep, and a briefly trained tiny model really retrieves keys."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.tokenizer import ByteTokenizer, load_tokenizer, train_tokenizer
from tapecli.eval import passkey, protocol
from tapecli.eval.passkey import FILLER, budget_chars, encode_prompt, evaluate_passkey, make_prompt, plan_budgets
from tapecli.model import ModelConfig, Transformer
from tapecli.store.checkpoint import save_model

runner = CliRunner()


def official_prompt(n_garbage: int, seed: int) -> tuple[str, str]:
    """LongLoRA's / TAPE's generate_prompt_landmark, as published (numpy imported as `random`)."""
    random = np.random
    rnd_state = random.get_state()
    random.seed(seed)
    n_garbage_prefix = random.randint(0, n_garbage)
    n_garbage_suffix = n_garbage - n_garbage_prefix
    task_description = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                        "them. I will quiz you about the important information there.")
    garbage = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
    garbage_inf = " ".join([garbage] * 5000)
    assert len(garbage_inf) >= n_garbage
    garbage_prefix = garbage_inf[:n_garbage_prefix]
    garbage_suffix = garbage_inf[:n_garbage_suffix]
    pass_key = random.randint(1, 50000)
    information_line = f"The pass key is {pass_key}. Remember it. {pass_key} is the pass key."
    final_question = "What is the pass key? The pass key is"
    lines = [task_description, garbage_prefix, information_line, garbage_suffix, final_question]
    random.set_state(rnd_state)
    return "\n".join(lines), str(pass_key)


def test_budgets_and_prompts_are_the_official_ones():
    assert [budget_chars(i) for i in range(8)] == [3072, 7168, 10240, 14336, 18432, 21504, 25600, 29696]
    for budget in (3072, 29696):
        for trial in range(20):
            prompt = make_prompt(budget, trial)
            assert (prompt.text, str(prompt.key)) == official_prompt(budget, trial)
            prefix, key_line, suffix = prompt.text.split("\n")[1:4]
            assert len(prefix) == prompt.depth and len(prefix) + len(suffix) == budget
            assert prefix == FILLER[: prompt.depth] and suffix == FILLER[: budget - prompt.depth]
            assert key_line == f"The pass key is {prompt.key}. Remember it. {prompt.key} is the pass key."
            assert 1 <= prompt.key < 50000
    # A depth sweep moves the key, keeps trial t's key.
    swept = make_prompt(3072, 7, depth_fraction=0.5)
    assert swept.depth == 1536 and swept.key == make_prompt(3072, 7).key
    assert len(swept.text.split("\n")[1]) == 1536 and make_prompt(3072, 7, depth_fraction=1.0).depth == 3072


def test_prompt_and_answer_tokens(tmp_path):
    prompt = make_prompt(100, 3)
    ids, answer = encode_prompt(ByteTokenizer(), prompt)
    assert ids[0] == ByteTokenizer().bos_id and ids[1:] == list(prompt.text.encode())
    assert answer == list(f" {prompt.key}".encode())
    docs = tmp_path / "docs"
    docs.mkdir()
    for t in range(20):
        (docs / f"{t}.txt").write_text(make_prompt(200, 1000 + t).text)
    sp = load_tokenizer(str(train_tokenizer(str(docs), 400, str(tmp_path / "sp.model"))))
    ids, answer = encode_prompt(sp, prompt)
    assert ids[0] == sp.bos_id and ids[1:] + answer == sp.encode(f"{prompt.text} {prompt.key}")
    assert sp.decode(answer).strip() == str(prompt.key)
    # --max-tokens keeps the budgets whose every prompt fits: byte prompts are ~250 tokens longer than the filler.
    assert plan_budgets(ByteTokenizer(), None, 8192, trials=20) == [3072, 7168]
    assert plan_budgets(ByteTokenizer(), [64, 32], 8192, trials=20) == [64, 32]


class Oracle(torch.nn.Module):
    """Reads the key from the prompt (byte tokens) and answers it, or answers key + 1."""

    def __init__(self, off_by_one: bool = False) -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.off_by_one = off_by_one

    def generate(self, input_ids, max_new_tokens, **_):
        rows = []
        for prompt in input_ids.tolist():
            text = bytes(t for t in prompt if t < 256).decode()  # drop BOS and any left padding
            key = int(re.search(r"pass key is (\d+)", text).group(1)) + self.off_by_one
            rows.append(prompt + list(f" {key}".encode().ljust(max_new_tokens, b"x"))[:max_new_tokens])
        return torch.tensor(rows)


@pytest.mark.parametrize("off_by_one", [False, True])
def test_scoring_is_exact_match_on_the_answer_tokens(tmp_path, monkeypatch, off_by_one):
    monkeypatch.setattr(protocol, "open_model", lambda spec, **_: _opened(Oracle(off_by_one)))
    monkeypatch.setattr(protocol, "model_config", lambda spec, **_: _opened(Oracle(off_by_one)).model.config)
    results = evaluate_passkey("oracle", tmp_path, budgets=[64, 128], trials=5, batch_size=4, show_progress=False)
    assert results["accuracy"] == (0.0 if off_by_one else 1.0)
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and all(r["prediction"] == f" {r['key'] + off_by_one}" for r in rows)


def _opened(model):
    from tapecli.store.door import OpenedModel

    model.config = ModelConfig(vocab_size=259, dim=8, n_layers=1, n_heads=2)
    return OpenedModel(model=model, tokenizer=ByteTokenizer(), spec="oracle", source="oracle", kind="tape",
                       dtype="fp32", device="cpu", name="oracle")


def test_sweep_files_resume_and_the_command_line(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=259, dim=16, n_layers=1, n_heads=2, max_seq_len=64))
    checkpoint = save_model(model, ByteTokenizer(), tmp_path / "ckpt")
    args = ["eval", "passkey", "--model", str(checkpoint), "--budgets", "16,48", "--trials", "2", "--depths",
            "0,0.5,1", "--device", "cpu", "--batch-size", "3", "--out"]
    calls, original = [], passkey.generate_batch

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*a, **kw)

    monkeypatch.setattr(passkey, "generate_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate_passkey(str(checkpoint), tmp_path / "out", budgets=[16, 48], trials=2, depths=[0, 0.5, 1],
                         device="cpu", batch_size=3, show_progress=False)
    assert len((tmp_path / "out" / "samples.jsonl").read_text().splitlines()) == 3
    monkeypatch.setattr(passkey, "generate_batch", original)
    result = runner.invoke(app, [*args, str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "16 filler characters" in result.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 3 * 2 and len({(r["budget"], r["depth_fraction"], r["trial"]) for r in rows}) == 12
    assert {"budget", "trial", "prompt_tokens", "depth", "key", "prediction", "correct"} <= rows[0].keys()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(results["grid"]) == 6 and [b["budget"] for b in results["budgets"]] == [16, 48]
    assert (tmp_path / "out" / "passkey.png").read_bytes()[:4] == b"\x89PNG"
    reference = runner.invoke(app, [*args, str(tmp_path / "ref")])  # uninterrupted
    assert reference.exit_code == 0

    def answers(out):
        lines = (tmp_path / out / "samples.jsonl").read_text().splitlines()
        return {(r["budget"], r["depth_fraction"], r["trial"]): r["generated"] for r in map(json.loads, lines)}

    assert answers("out") == answers("ref")
    bad = runner.invoke(app, [*args, str(tmp_path / "bad"), "--depths", "0,2"])
    assert bad.exit_code == 2 and "--depths" in bad.output


def test_several_models_and_the_default_folder(tmp_path):
    """Two models: one folder each and their comparison; without --out, a checkpoint of a run writes next to it."""
    specs = []
    for seed, name in ((0, "a"), (1, "b")):
        torch.manual_seed(seed)
        model = Transformer(ModelConfig(vocab_size=259, dim=16, n_layers=1, n_heads=2, max_seq_len=128))
        specs.append(str(save_model(model, ByteTokenizer(), tmp_path / name / "checkpoints" / "step-00000001")))
    args = ["eval", "passkey", "--budgets", "16", "--trials", "2", "--device", "cpu"]
    result = runner.invoke(app, [*args, "-m", specs[0], "-m", specs[1], "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    comparison = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert list(comparison) == ["a/step-00000001", "b/step-00000001"]  # open_model's names; folders a_step-..
    for label, results in comparison.items():
        assert results == json.loads((tmp_path / "cmp" / label.replace("/", "_") / "results.json").read_text())
        assert f"{label}: 16 filler characters" in result.output
    assert (tmp_path / "cmp" / "passkey.png").read_bytes()[:4] == b"\x89PNG"
    result = runner.invoke(app, [*args, "-m", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a" / "eval-passkey" / "step-00000001" / "results.json").is_file()


def passkey_tokenizer(tmp_path, budget: int):
    """A real SentencePiece BPE model (tape's training options) whose fixed protocol sentences are single pieces, so
    a passkey prompt is ~50 tokens and a tiny model can learn the task in seconds."""
    import sentencepiece as spm

    from tapecli.eval.passkey import FILLER_SENTENCES, INSTRUCTION, QUESTION

    corpus = tmp_path / "passkey.txt"
    corpus.write_text("\n".join(make_prompt(budget, 10**6 + t).text for t in range(50)))
    fixed = [INSTRUCTION, QUESTION, "The pass key is", ". Remember it.", "is the pass key."]
    fixed += [sentence.rstrip(".") + "." for sentence in FILLER_SENTENCES.split(". ")]
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=300, model_type="bpe",
        normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, byte_fallback=True, character_coverage=1.0, pad_id=0, unk_id=1, bos_id=2,
        eos_id=3, num_threads=1, minloglevel=2, user_defined_symbols=[s.replace(" ", "\u2581") for s in fixed])
    return load_tokenizer(str(tmp_path / "sp.model"))


@pytest.mark.slow
def test_a_briefly_trained_model_retrieves_keys_at_its_training_length(tmp_path):
    """Trained on passkey prompts of one budget (other seeds than the evaluation's), a 2-layer model learns to copy
    the key; scored through the real prompt builder, tokenizer and scorer it must retrieve it. ~40 s of CPU."""
    budget = 128
    tok = passkey_tokenizer(tmp_path, budget)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=tok.vocab_size, dim=64, n_layers=2, n_heads=2, max_seq_len=128))
    checkpoint = tmp_path / "ckpt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is several times faster on a busy machine
    try:
        save_model(model, tok, checkpoint)
        untrained = evaluate_passkey(str(checkpoint), tmp_path / "untrained", budgets=[budget], device="cpu",
                                     batch_size=20, show_progress=False)
        train(model, tok, budget, steps=1000)
        save_model(model, tok, checkpoint)
        trained = evaluate_passkey(str(checkpoint), tmp_path / "trained", budgets=[budget], device="cpu",
                                   batch_size=20, show_progress=False)
    finally:
        torch.set_num_threads(threads)
    assert untrained["accuracy"] == 0.0
    assert trained["accuracy"] >= 0.9 and trained["budgets"][0]["trials"] == 20


def train(model: Transformer, tok, budget: int, steps: int, batch: int = 16) -> None:
    """Next-token loss over prompt + answer, batches of 16 prompts drawn with trials >= 1000 (never evaluated).
    (700 steps of 32, more prompts and more time, retrieved 18 of the evaluation's 20 keys; 1000 of 16 retrieve all.)"""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, betas=(0.9, 0.98))
    rng = np.random.default_rng(0)
    for _ in range(steps):
        examples = [encode_prompt(tok, make_prompt(budget, int(t))) for t in rng.integers(1000, 10**6, size=batch)]
        length = max(len(ids) + len(answer) for ids, answer in examples)
        inputs = torch.zeros(len(examples), length, dtype=torch.long)
        labels = torch.full((len(examples), length), -100)
        for row, (ids, answer) in enumerate(examples):
            inputs[row, : len(ids) + len(answer)] = torch.tensor(ids + answer)
            labels[row, : len(ids) + len(answer) - 1] = torch.tensor(ids[1:] + answer)
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
