"""`tape eval harness` and the native lm-eval model `tape`, through lm-eval's real `simple_evaluate`, offline.

Three local tasks over data the tests write: multiple choice (one prompt longer than the context window), generation
with stop strings and a token cap, and rolling perplexity over documents longer than the window.
- On a tiny Hugging Face Llama (built and trained here, saved with `save_pretrained`, with a real `tokenizers`
  tokenizer) imported into tape, every per-sample loglikelihood, greedy flag, rolling loglikelihood and generation
  equals what lm-eval's own `hf` model computes on the same directory.
- TAPE, FIRE and T5 checkpoints give finite results that do not depend on the batch size.
- The CLI writes lm-eval's results JSON and samples; a task that needs the Hub fails offline with one line.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from train_helpers import REPO, subprocess_env
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError

MC = [
    {"question": "What color is the sky?", "choices": ["blue", "green", "red"], "answer": 0},  # lm-eval adds " "
    {"question": "What is two plus two?", "choices": ["four", "five"], "answer": 0},
    {"question": "What does the quick brown fox do?", "choices": ["jumps", "sleeps", "runs", "eats"], "answer": 0},
    # Longer than the 32-token window: context + continuation are cut from the left, as lm-eval's HF model does.
    {"question": "The sky is blue and the grass is green and the fox jumps over the lazy dog. " * 2
                 + "What color is the grass?", "choices": ["green", "blue"], "answer": 0},
]
GEN = [{"q": "what is two plus two?", "a": "four"}, {"q": "what color is the sky?", "a": "blue"},
       {"q": "red green", "a": "blue"}, {"q": "what does the fox do?", "a": "jumps"}]
PPL = [{"text": "the sky is blue and the grass is green. " * 3}, {"text": "a quick brown fox"},
       {"text": "Q: what is two plus two?\nA: four\n" * 4}]
TASKS = ["tiny_mc", "tiny_gen", "tiny_ppl"]
# What the tiny Llama is trained on, so that its greedy flags and generations are not all alike.
TRAIN_TEXT = ("Question: What color is the sky?\nAnswer: blue\nQuestion: What is two plus two?\nAnswer: four\n"
              "Q: what is two plus two?\nA: four\nQ: what color is the sky?\nA: blue\nQ: what does the fox do?\n"
              "A: jumps\nthe sky is blue and the grass is green. a quick brown fox jumps over the lazy dog.\n")


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread, and far faster than on oversubscribed ones on a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _yaml(name: str, data: Path, body: str) -> str:
    return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\nmetadata: {{version: 1.0}}\n{body}")


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    for name, rows in [("mc", MC), ("gen", GEN), ("ppl", PPL)]:
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tiny_mc.yaml").write_text(_yaml("tiny_mc", root / "mc.jsonl", (
        'output_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true},"
        " {metric: acc_norm, aggregation: mean, higher_is_better: true}]\n")))
    (root / "tiny_gen.yaml").write_text(_yaml("tiny_gen", root / "gen.jsonl", (
        'output_type: generate_until\ndoc_to_text: "Q: {{q}}\\nA:"\ndoc_to_target: " {{a}}"\n'
        'generation_kwargs: {until: ["\\n", "Q:"], max_gen_toks: 10, do_sample: false}\n'
        "metric_list: [{metric: exact_match, aggregation: mean, higher_is_better: true}]\n")))
    (root / "tiny_ppl.yaml").write_text(_yaml("tiny_ppl", root / "ppl.jsonl", (
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list: [{metric: word_perplexity}, {metric: byte_perplexity}, {metric: bits_per_byte}]\n")))
    return root


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama (GQA, untied head) with a byte-level BPE tokenizer that adds BOS, trained for a few steps."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("hf_llama")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator([TRAIN_TEXT] * 4, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=backend.get_vocab_size(), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    ids = torch.tensor([tokenizer(TRAIN_TEXT).input_ids])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _samples(results: dict) -> dict[str, list]:
    """{task: [responses of doc 0, doc 1, ...]}"""
    return {task: [s["resps"] for s in sorted(rows, key=lambda s: s["doc_id"])]
            for task, rows in results["samples"].items()}


def _loglikelihoods(samples: dict[str, list]) -> list[float]:
    """Every choice's loglikelihood, then every document's rolling loglikelihood."""
    return [r[0][0] for doc in samples["tiny_mc"] for r in doc] + [doc[0][0] for doc in samples["tiny_ppl"]]


def _evaluate(lm, task_dir: Path) -> dict:
    from tapecli.eval.harness import evaluate, task_manager

    return evaluate(lm, TASKS, task_manager(TASKS, [str(task_dir)]), log_samples=True, bootstrap_iters=0)


def test_equals_lm_evals_own_hf_model_on_an_imported_llama(hf_llama: Path, task_dir: Path) -> None:
    from lm_eval.models.huggingface import HFLM

    from tapecli.eval.lm_adapter import TapeLM

    reference = _samples(_evaluate(HFLM(pretrained=str(hf_llama), max_length=32, dtype="float32", batch_size=1,
                                        device="cpu"), task_dir))
    ours = _samples(_evaluate(TapeLM(pretrained=str(hf_llama), max_length=32, dtype="fp32", batch_size=3,
                                     device="cpu"), task_dir))
    assert ours.keys() == reference.keys() == set(TASKS)
    # multiple choice: one (loglikelihood, is_greedy) per choice
    for got, want in zip(ours["tiny_mc"], reference["tiny_mc"], strict=True):
        assert [r[0][1] for r in got] == [r[0][1] for r in want]
        assert [r[0][0] for r in got] == pytest.approx([r[0][0] for r in want], rel=1e-6, abs=1e-5)
    flags = [r[0][1] for doc in ours["tiny_mc"] for r in doc]
    assert any(flags) and not all(flags)  # the trained model makes the greedy flag mean something
    # rolling loglikelihood: one total per document, each scored in several 32-token windows
    assert [d[0][0] for d in ours["tiny_ppl"]] == pytest.approx([d[0][0] for d in reference["tiny_ppl"]], rel=1e-6)
    # generation: exactly the same strings, cut at the stop strings
    assert ours["tiny_gen"] == reference["tiny_gen"]
    texts = [d[0][0] for d in ours["tiny_gen"]]
    assert any(texts) and not any("\n" in t or "Q:" in t for t in texts)


@pytest.fixture(scope="module")
def tape_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random byte-level models with tape-only PEs (no Hugging Face equivalent), saved as checkpoints."""
    from tapecli.data.tokenizer import ByteTokenizer
    from tapecli.model import ModelConfig, Transformer
    from tapecli.store.checkpoint import save_model

    root = tmp_path_factory.mktemp("tape_models")
    found = {}
    for pe in ("tape", "fire", "t5"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=259, dim=32, n_layers=2, n_heads=2, max_seq_len=48, pe=pe))
        found[pe] = save_model(model, ByteTokenizer(), root / pe)
    return found


@pytest.mark.parametrize("pe", ["tape", "fire", "t5"])
def test_tape_only_pes_give_finite_results_independent_of_batch_size(pe: str, tape_checkpoints: dict[str, Path],
                                                                     task_dir: Path) -> None:
    from tapecli.eval.lm_adapter import TapeLM

    one, many = (_evaluate(TapeLM(pretrained=str(tape_checkpoints[pe]), device="cpu", batch_size=size), task_dir)
                 for size in (1, 4))
    a, b = _samples(one), _samples(many)
    lls = _loglikelihoods(a)
    assert all(math.isfinite(x) and x < 0 for x in lls)
    # right-padded batches score exactly what single sequences score
    assert _loglikelihoods(b) == pytest.approx(lls, rel=1e-5, abs=1e-5)
    assert [r[0][1] for doc in b["tiny_mc"] for r in doc] == [r[0][1] for doc in a["tiny_mc"] for r in doc]
    assert b["tiny_gen"] == a["tiny_gen"]
    assert one["results"]["tiny_ppl"]["bits_per_byte,none"] == pytest.approx(
        many["results"]["tiny_ppl"]["bits_per_byte,none"], rel=1e-5)
    assert math.isfinite(one["results"]["tiny_ppl"]["bits_per_byte,none"])


def test_sampled_generation_is_seeded_and_stops_at_stop_strings(tape_checkpoints: dict[str, Path]) -> None:
    from lm_eval.api.instance import Instance

    from tapecli.eval.lm_adapter import TapeLM

    def requests(gen_kwargs: dict) -> list[Instance]:
        return [Instance("generate_until", {}, (prompt, dict(gen_kwargs)), i)
                for i, prompt in enumerate(["Q: 2+2\nA:", "Q: sky\nA:", "hello"])]

    lm = TapeLM(pretrained=str(tape_checkpoints["tape"]), device="cpu", batch_size=2, seed=7)
    sampled = {"until": ["e"], "max_gen_toks": 12, "do_sample": True, "temperature": 1.0}
    first, again = lm.generate_until(requests(sampled)), lm.generate_until(requests(sampled))
    assert first == again and not any("e" in text for text in first)
    greedy = lm.generate_until(requests({"until": ["e"], "max_gen_toks": 12, "do_sample": False}))
    assert greedy != first
    other_seed = TapeLM.from_opened(lm.opened, batch_size=2, seed=8).generate_until(requests(sampled))
    assert other_seed != first


def test_generation_stops_as_soon_as_every_row_holds_a_stop_string(tape_checkpoints: dict[str, Path]) -> None:
    from lm_eval.api.instance import Instance
    from lm_eval.models.utils import postprocess_generated_text

    from tapecli.eval.lm_adapter import TapeLM

    lm = TapeLM(pretrained=str(tape_checkpoints["t5"]), device="cpu", batch_size=2)
    steps = []
    run = lm.model.run
    lm.model.run = lambda *args, **kwargs: steps.append(1) or run(*args, **kwargs)

    def generate(until: list[str]) -> list[str]:
        steps.clear()
        return lm.generate_until([Instance("generate_until", {}, (prompt, {"until": until, "max_gen_toks": 12}), i)
                                  for i, prompt in enumerate(["Q: 2+2\nA:", "hello"])])

    free = generate([])
    assert len(steps) == 12 and all(free)  # prefill + 11 decoding steps: nothing stopped them
    stops = [text[1] for text in free]  # each row's second character
    cut = generate(stops)
    assert cut == [postprocess_generated_text(text, stops, None) for text in free]
    assert len(steps) < 12


def test_cli_writes_lm_eval_results_and_samples_and_resumes_from_its_cache(
        tape_checkpoints: dict[str, Path], task_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tapecli.eval.lm_adapter import TapeLM

    out = tmp_path / "harness"
    tasks = f"tiny_mc,tiny_gen,{task_dir / 'tiny_ppl.yaml'}"  # a task may be named by its YAML file
    command = ["eval", "harness", "--model", str(tape_checkpoints["fire"]), "--tasks", tasks,
               "--include-path", str(task_dir), "--limit", "2", "--out", str(out), "--log-samples", "--batch-size",
               "2", "--bootstrap-iters", "0", "--device", "cpu"]
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 0, result.output
    assert re.search(r"\|tiny_mc *\|", result.output) and "bits_per_byte" in result.output
    written = json.loads((out / "results.json").read_text())
    assert set(written["results"]) == set(TASKS) and "samples" not in written
    assert written["n-samples"]["tiny_mc"] == {"original": 4, "effective": 2}
    assert written["config"]["model_args"]["pe"] == "fire"
    for task in TASKS:
        rows = [json.loads(line) for line in (out / f"samples_{task}.jsonl").read_text().splitlines()]
        assert [row["doc_id"] for row in rows] == [0, 1]

    # Run again (as after an interruption): every answer comes from the request cache, the model is never called.
    def no_model(*args, **kwargs):
        raise AssertionError("the model was called for a cached request")

    monkeypatch.setattr(TapeLM, "_forward_padded", no_model)
    monkeypatch.setattr(TapeLM, "_generate", no_model)
    again = CliRunner().invoke(app, command)
    assert again.exit_code == 0, again.output
    assert json.loads((out / "results.json").read_text())["results"] == written["results"]
    # The cache belongs to one model and its options: another max_length may not reuse the directory.
    other = CliRunner().invoke(app, [*command, "--max-length", "40"])
    assert other.exit_code == 2 and "max_length differ" in other.output


def test_offline_hub_task_fails_with_one_line(tape_checkpoints: dict[str, Path], task_dir: Path,
                                              tmp_path: Path) -> None:
    folder = tmp_path / "hub_tasks"
    folder.mkdir()
    (folder / "hub_task.yaml").write_text(
        "task: hub_task\ndataset_path: EleutherAI/lambada_openai\ndataset_name: default\noutput_type: loglikelihood\n"
        'test_split: test\ndoc_to_text: "{{text}}"\ndoc_to_target: " x"\nmetric_list: [{metric: acc}]\n')
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["eval", "harness", "--model", str(tape_checkpoints["t5"]), "--tasks",
                                      "hub_task", "--include-path", str(folder), "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert "Traceback" not in result.output and lines[-1].startswith("error: a task needs the Hub dataset "
                                                                     "EleutherAI/lambada_openai")
    assert "--include-path" in lines[-1]
    # The failed run answered nothing, so its directory takes the corrected command, even with another model.
    fixed = CliRunner().invoke(app, ["eval", "harness", "--model", str(tape_checkpoints["tape"]), "--tasks",
                                     "tiny_mc", "--include-path", str(task_dir), "--device", "cpu", "--out", str(out),
                                     "--limit", "1", "--bootstrap-iters", "0"])
    assert fixed.exit_code == 0, fixed.output


def test_bad_model_arguments_are_one_line_errors(tape_checkpoints: dict[str, Path]) -> None:
    from tapecli.eval.lm_adapter import TapeLM

    with pytest.raises(TapeError, match="unknown tape model argument"):
        TapeLM(pretrained=str(tape_checkpoints["tape"]), device="cpu", temperature=3)
    with pytest.raises(TapeError, match="batch_size=auto"):
        TapeLM(pretrained=str(tape_checkpoints["tape"]), device="cpu", batch_size="auto")


def test_pe_overrides_arrive_as_lm_eval_model_args(hf_llama: Path) -> None:
    """lm-eval's CLI hands `pe_args=scaling=linear;factor=2` over as one string."""
    from tapecli.eval.lm_adapter import TapeLM

    lm = TapeLM(pretrained=str(hf_llama), device="cpu", pe_args="scaling=linear;factor=2")
    assert lm.model.config.pe_args["scaling"] == "linear" and lm.model.config.pe_args["factor"] == 2
    assert lm.settings()["pe_overrides"] == {"scaling": "linear", "factor": 2}
    assert lm.max_length == 128  # the imported config's max_position_embeddings


def test_supported_lm_eval_range_is_checked_and_matches_pyproject() -> None:
    from lm_eval import __version__ as installed

    from tapecli.eval.lm_adapter import LM_EVAL_RANGE, check_lm_eval_version

    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"lm-eval{LM_EVAL_RANGE}"' in pyproject
    assert check_lm_eval_version() == installed
    for ok in ("0.4.10", "0.4.13", "0.4.14.dev0"):
        assert check_lm_eval_version(ok) == ok
    for bad in ("0.4.9", "0.5.0", "0.5.0rc1", "1.0"):
        with pytest.raises(TapeError, match=r"lm-eval>=0.4.10,<0.5"):
            check_lm_eval_version(bad)


@pytest.mark.slow
def test_lm_evals_own_cli_runs_the_tape_model(tape_checkpoints: dict[str, Path], task_dir: Path,
                                              tmp_path: Path) -> None:
    """`python -m tapecli.lm_eval_cli` is lm-eval's CLI with `tape` registered (indexing all built-in tasks: ~15 s)."""
    out = tmp_path / "stock"
    command = [sys.executable, "-m", "tapecli.lm_eval_cli", "--model", "tape", "--model_args",
               f"pretrained={tape_checkpoints['tape']}", "--device", "cpu", "--batch_size", "2", "--include_path",
               str(task_dir), "--tasks", "tiny_mc", "--limit", "2", "--output_path", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"\|tiny_mc *\|", done.stdout)
    assert list(out.glob("*/results_*.json"))
