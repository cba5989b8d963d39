"""`tape eval ruler`: RULER's metric on hand-made predictions, lm-eval's own niah generator gives the same prompts,
scoring/effective length with a stand-in model, and the real command on a tape checkpoint and a Hugging Face
Llama directory (files, plots, resume, skipped tasks, errors)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.tokenizer import load_tokenizer
from tapecli.eval import ruler
from tapecli.eval.long_context import effective_length
from tapecli.eval.ruler_metric import postprocess, sample_score, string_match_all, string_match_part
from tapecli.model import ModelConfig, Transformer
from tapecli.store.checkpoint import save_model

runner = CliRunner()
FIXTURES = Path(__file__).parents[1] / "fixtures" / "ruler"
TOKENIZER = FIXTURES / "tokenizer"


def test_metric_reproduces_rulers_string_match():
    preds = [" The numbers are 1234567 and 7654321.\x00", "answer: PARIS", "nothing", "ABCDE fghij"]
    refs = [["1234567", "7654321", "1111111"], ["paris", "london"], ["x"], ["abcde", "FGHIJ"]]
    clean = [postprocess(p) for p in preds]
    assert clean[0] == "The numbers are 1234567 and 7654321." and postprocess("a\tb\x1f ") == "a\nb"
    # all: 2/3, 1/2, 0, 1 -> mean 54.17; part: 1, 1, 0, 1 -> 75
    assert string_match_all(clean, refs) == 54.17 and string_match_part(clean, refs) == 75.0
    per_sample = [sample_score("all", p, r) for p, r in zip(clean, refs, strict=True)]
    assert round(sum(per_sample) / len(per_sample) * 100, 2) == 54.17
    assert [sample_score("part", p, r) for p, r in zip(clean, refs, strict=True)] == [1.0, 1.0, 0.0, 1.0]
    # lm-eval 0.4.13's string_match_part scores one sample as the share of references found (the "all" value).
    from lm_eval.tasks.ruler.common_utils import string_match_part as lm_eval_part

    assert lm_eval_part([clean[1]], [refs[1]]) == 0.5 and string_match_part([clean[1]], [refs[1]]) == 100.0


def test_effective_length():
    assert effective_length({1024: 90.0, 2048: 86.0, 4096: 85.6, 8192: 90.0}, 85.6) == 2048
    assert effective_length({1024: 80.0, 2048: 95.0}, 85.6) is None


@pytest.mark.slow
def test_lm_evals_niah_generator_makes_the_same_prompts(monkeypatch):
    """lm-eval's `generate_input_output` (lm_eval/tasks/ruler/prepare_niah.py, run offline: its punkt download is
    stubbed, the noise and needle haystacks need nothing) and tape's, from the same random state, give the same
    prompt up to the answer prefix, the same answers, and lm-eval's gen_prefix is tape's answer prefix. (Importing
    prepare_niah sorts 6.2M words: ~30 s.)"""
    import nltk

    from tapecli.data.ruler.constants import FAMILIES, TASKS
    from tapecli.data.ruler.niah import Niah
    from tapecli.data.ruler.sizing import split_answer_prefix

    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    from lm_eval.tasks.ruler import prepare_niah
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE

    for task in ("niah_single_1", "niah_multikey_2", "niah_multikey_3"):
        args = TASKS[task][1]
        kind = "repeat" if args["type_haystack"] == "noise" else args["type_haystack"]
        for state, size in [(0, 5), (1, 40), (2, 200)]:
            random.seed(state)
            text, answers, query = prepare_niah.generate_input_output(
                size, prepare_niah.get_haystack(kind), type_haystack=kind, num_needle_k=args["num_needle_k"],
                type_needle_k=args["type_needle_k"], num_needle_v=args["num_needle_v"],
                type_needle_v=args["type_needle_v"], template=TEMPLATE, num_needle_q=args["num_needle_q"])
            ours = Niah(task, args, count=len, seed=42)
            ours.rng = random.Random(state)  # the state lm-eval's module-level `random` had
            full, our_answers = ours.make(size)
            prompt, prefix = split_answer_prefix(full, FAMILIES["niah"].answer_prefix)
            assert prompt == text and our_answers == answers
            singular = args["type_needle_v"][:-1]
            assert prefix.strip() == f"The special magic {singular} for {query} mentioned in the provided text is"


def _hf_model(tmp_path: Path) -> Path:
    """A tiny real Hugging Face Llama directory (save_pretrained) with the fixtures' tokenizer."""
    from hf_helpers import make_hf_llama

    directory = tmp_path / "hf-llama"
    make_hf_llama(directory, tokenizer="none", vocab=1024, max_position_embeddings=4096, dim=32, ffn=64)
    for f in TOKENIZER.iterdir():
        shutil.copy(f, directory / f.name)
    return directory


def _tape_model(tmp_path: Path, pe: str) -> Path:
    tok = load_tokenizer(str(TOKENIZER / "tokenizer.json"))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=1024, dim=32, n_layers=1, n_heads=2, max_seq_len=512, pe=pe))
    return save_model(model, tok, tmp_path / f"tape-{pe}")


class Answers:
    """Stands in for generate_batch: answers each prompt with its references (or with nothing)."""

    def __init__(self, tokenizer, right: bool) -> None:
        self.tokenizer, self.right, self.prompts = tokenizer, right, {}

    def __call__(self, model, prompts, max_new_tokens, **_):
        return [self.tokenizer.encode(" " + " ".join(self.prompts[tuple(p)])) if self.right else [] for p in prompts]


def test_scores_and_effective_length_with_a_stand_in_model(tmp_path, monkeypatch):
    """Right answers score 100 everywhere (effective length = the longest length), no answers score 0."""
    checkpoint = _tape_model(tmp_path, "rope")
    tok = load_tokenizer(str(TOKENIZER / "tokenizer.json"))
    from tapecli.data.ruler import tasks as ruler_tasks

    for right in (True, False):
        answers = Answers(tok, right)
        original = ruler_tasks.generate

        def generate(*a, answers=answers, original=original, **k):
            samples = original(*a, **k)
            for s in samples:
                answers.prompts[tuple([tok.bos_id] + tok.encode(s.prompt))] = s.outputs
            return samples

        monkeypatch.setattr(ruler_tasks, "generate", generate)
        monkeypatch.setattr(ruler, "generate_batch", answers)
        out = tmp_path / f"out-{right}"
        results = ruler.evaluate_ruler([str(checkpoint)], out, tasks="niah_single_1,niah_multikey_3,cwe,fwe",
                                       lengths=[1024, 2048], samples=2, device="cpu", batch_size=2,
                                       show_progress=False)
        model = results["models"][0]
        expected = 100.0 if right else 0.0
        assert all(v == expected for cells in model["scores"].values() for v in cells.values())
        assert model["effective_length"] == (2048 if right else None)


@pytest.mark.slow
def test_the_command_on_a_tape_model_and_a_hugging_face_model(tmp_path, monkeypatch):
    """Two real models (a tape ALiBi checkpoint, a saved HF Llama), every source-free task family plus SQuAD and the
    essay haystack, resumed after an interruption; files, plots, table; skipped tasks and bad input are one line."""
    tape_dir, hf_dir = _tape_model(tmp_path, "alibi"), _hf_model(tmp_path)
    out = tmp_path / "ruler"
    tasks = "niah_single_1,niah_single_2,vt,qa_1"
    args = ["eval", "ruler", "--model", str(tape_dir), "--model", str(hf_dir), "--tasks", tasks, "--lengths",
            "1024", "--samples", "1", "--batch-size", "2", "--device", "cpu", "--haystack",
            str(FIXTURES / "essay.txt"), "--qa-data", str(FIXTURES / "squad.json"), "--out"]
    calls, original = [], ruler.generate_batch

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(*a, **k)

    monkeypatch.setattr(ruler, "generate_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ruler.evaluate_ruler([str(tape_dir), str(hf_dir)], out, tasks=tasks, lengths=[1024], samples=1,
                             device="cpu", batch_size=2, haystack=str(FIXTURES / "essay.txt"),
                             qa_data=[str(FIXTURES / "squad.json")], show_progress=False)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2
    monkeypatch.setattr(ruler, "generate_batch", original)
    result = runner.invoke(app, [*args, str(out)])
    assert result.exit_code == 0, result.output
    assert "effective length" in result.output and "| niah_single_2 |" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 and len({(r["model"], r["task"], r["index"]) for r in rows}) == 8
    assert all(r["ruler_length"] <= 1024 and 0 <= r["score"] <= 1 for r in rows)
    results = json.loads((out / "results.json").read_text())
    assert [m["kind"] for m in results["models"]] == ["tape", "hf"]
    assert set(results["models"][1]["scores"]) == set(tasks.split(","))
    assert results["settings"]["haystack"]["sha256"] and "squad" in results["settings"]["qa_data"]
    for name in ("ruler.png", "heatmap-0-tape-alibi.png", "heatmap-1-hf-llama.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    # Same prompts for both models (one tokenizer), so the reference answers agree row by row.
    by_model = [{(r["task"], r["index"]): r["outputs"] for r in rows if r["model"] == m} for m in (0, 1)]
    assert by_model[0] == by_model[1]
    # `all` without sources skips the essay and QA tasks with one line each; named, they are an error.
    skipped = runner.invoke(app, ["eval", "ruler", "--model", str(tape_dir), "--tasks", "all", "--lengths", "16",
                                  "--samples", "1", "--device", "cpu", "--out", str(tmp_path / "x")])
    assert "skipping niah_single_2, niah_single_3, niah_multikey_1, niah_multivalue, niah_multiquery: they need " \
           "the essay haystack (pass --haystack FILE_OR_DIR)" in skipped.output
    assert "skipping qa_1: it needs SQuAD data (pass --qa-data FILE)" in skipped.output
    assert skipped.exit_code == 2 and "niah_single_1 at length 16" in skipped.output
    named = runner.invoke(app, ["eval", "ruler", "--model", str(tape_dir), "--tasks", "qa_2", "--out",
                                str(tmp_path / "y")])
    assert named.exit_code == 2 and "--tasks qa_2 needs HotpotQA data (pass --qa-data FILE)" in named.output
