"""`tape eval latent-list`: the generated programs run as Python and print their answer, only the relevant lines change
the list, the same question at every length, sized to the length; the scores on pinned answers and of a stand-in
model worked out by hand; the real command on a tape run and a Hugging Face Llama, with one-line errors."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data.latent_list import Generator
from tapecli.data.tokenizer import load_tokenizer
from tapecli.errors import TapeError
from tapecli.eval import latent_list
from tapecli.eval.protocol import run

runner = CliRunner()
TOKENIZER = Path(__file__).parents[1] / "fixtures" / "ruler" / "tokenizer" / "tokenizer.json"


def program_lines(prompt: str) -> list[str]:
    return prompt.split("```python\n", 1)[1].split("\n```", 1)[0].splitlines()


def printed(lines: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec("\n".join(lines), {})  # noqa: S102 - the generator's own program, the point of the test
    return out.getvalue().strip()


@pytest.mark.parametrize("tokenizer", ["byte", str(TOKENIZER)])
def test_programs_print_their_answer_and_only_relevant_lines_change_the_list(tokenizer):
    generator = Generator(load_tokenizer(tokenizer), seed=3)
    for relevant in (0, 1, 5, 20):
        for index in range(4):
            samples = [generator.sample(length, relevant, index) for length in (768, 1536)]
            for s in samples:
                lines = program_lines(s.prompt)
                assert printed(lines) == s.answer == str(s.value)
                # Walk the program: a line that changes `a` is the next relevant line, and every one occurs in order.
                namespace: dict = {}
                exec(lines[0] + "\n" + lines[1], namespace)  # noqa: S102
                pending = list(s.extra["relevant_lines"])
                for line in lines[2:-1]:
                    before = list(namespace["a"])
                    exec(line, namespace)  # noqa: S102
                    if pending and line == pending[0]:
                        pending.pop(0)
                    else:
                        assert namespace["a"] == before, line
                assert not pending and len(s.extra["relevant_lines"]) == relevant
                assert len(lines) == 3 + relevant + s.extra["distractors"]
                # Sized: prompt + answer + EOS fit; one more distractor line (at most ~30 tokens) would not have.
                used = s.prompt_tokens + len(generator.tokenizer.encode(s.answer)) + 1
                assert used <= s.length and s.length - used < 40, (s.length, used)
            short, long = samples
            # The same question at every length: the initial list, the relevant lines, the view and the answer.
            assert program_lines(short.prompt)[0] == program_lines(long.prompt)[0]
            assert program_lines(short.prompt)[-1] == program_lines(long.prompt)[-1]
            assert short.extra["relevant_lines"] == long.extra["relevant_lines"] and short.answer == long.answer
            assert long.extra["distractors"] > short.extra["distractors"]


def test_samples_are_deterministic_per_seed_and_too_short_lengths_are_one_line():
    tokenizer = load_tokenizer("byte")
    a, b = Generator(tokenizer, seed=0).sample(512, 5, 2), Generator(tokenizer, seed=0).sample(512, 5, 2)
    assert (a.prompt, a.answer) == (b.prompt, b.answer)
    assert Generator(tokenizer, seed=1).sample(512, 5, 2).prompt != a.prompt
    assert Generator(tokenizer, seed=0).sample(512, 5, 3).prompt != a.prompt
    with pytest.raises(TapeError, match=r"^latent-list at length 100: the program with 5 relevant lines and no "
                                        r"distractor needs \d+ tokens; choose a longer length$"):
        Generator(tokenizer).sample(100, 5, 0)


def test_the_score_of_pinned_answers():
    # Exact: the first non-empty line read as a Python literal equals the printed value.
    assert latent_list.score([1, 2, 3], "\n[1,2, 3]\nmore") == (1.0, 1.0)
    assert latent_list.score(7, " 7") == (1.0, 1.0)
    # Approximate, lists: same value at the same position, over the longer list: [1, 9, 3] vs [1, 2, 3, 4] -> 2/4.
    assert latent_list.score([1, 2, 3, 4], "[1, 9, 3]") == (0.0, 0.5)
    assert latent_list.score([5], "[5, 5, 5, 5, 5]") == (0.0, 0.2)
    assert latent_list.score([], "[]") == (1.0, 1.0)  # an exact answer has full credit
    # Approximate, numbers: 1 - |answer - truth| / max(1, |truth|), at least 0: 40 for 50 -> 0.8; 0 for 0 -> 1.
    assert latent_list.score(50, "40") == (0.0, 0.8)
    assert latent_list.score(0, "2") == (0.0, 0.0)
    assert latent_list.score(-4, "-3") == (0.0, 0.75)
    # Not a literal of the right kind: 0 and 0.
    for truth, answer in [([1], "1"), (3, "[3]"), (3, "three"), (1, "True"), (3, ""), ([1], "[1")]:
        assert latent_list.score(truth, answer) == (0.0, 0.0), (truth, answer)


def test_scores_with_a_stand_in_model_equal_the_hand_computed_ones(tmp_path, monkeypatch, trained):
    """The stand-in runs the program (right) except at length 1024 with 2 relevant lines ("no": wrong). Per R:
    0 ops 100, 100; 2 ops 100, 0; average 100, 50; RULER's effective length 512 (50 <= 85.6), NoLiMa's 512 (50 <
    0.85 x 100); LongScore 100 (50 - 100) / 100 = -50."""
    asked = {}  # prompt -> (length, relevant lines)
    original = Generator.sample

    def sample(self, length, relevant, index):
        made = original(self, length, relevant, index)
        asked[made.prompt] = (length, relevant)
        return made

    def answer(opened, prompts, batch_size, max_new_tokens, stop_check=None):
        assert max_new_tokens == 256 and stop_check([]) is False
        return ["no" if asked[p] == (1024, 2) else printed(program_lines(p)) for p in prompts]

    monkeypatch.setattr(Generator, "sample", sample)
    monkeypatch.setattr("tapecli.eval.common.generate_texts", answer)
    evaluation = latent_list.LatentList([512, 1024], [0, 2], samples=2)
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", show_progress=False)
    m = report.results["latent-list"]["models"][0]
    assert m["scores"] == {"0 ops": {"512": 100.0, "1024": 100.0}, "2 ops": {"512": 100.0, "1024": 0.0}}
    assert m["approximate"]["2 ops"] == {"512": 100.0, "1024": 0.0} and m["average"] == {"512": 100.0, "1024": 50.0}
    assert (m["effective_length"], m["effective_length_nolima"], m["long_score"]) == (512, 512, -50.0)
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 and all(r["prompt_tokens"] <= r["length"] for r in rows)
    for name in ("latent-list.png", "heatmap.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """Real greedy answers of two untrained models (up to 256 tokens each: ~7 s on a CPU), a resume that redoes
    nothing, and each bad input as one line before anything is written."""
    out = tmp_path / "latent"
    args = ["eval", "latent-list", "--model", str(trained()), "--model", str(tiny_hf_llama), "--lengths", "384",
            "--relevant-ops", "0,3", "--samples", "1", "--device", "cpu", "--batch-size", "2", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| 3 ops |" in result.output and "effective length" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 and {r["model"] for r in rows} == {0, 1}
    assert all(r["prompt_tokens"] < r["length"] and 0 <= r["approximate"] <= 1 for r in rows)
    # Both models are asked the same questions (one seed), each sized with its own tokenizer.
    assert {(r["length"], r["relevant_ops"], r["answer"]) for r in rows if r["model"] == 0} == \
        {(r["length"], r["relevant_ops"], r["answer"]) for r in rows if r["model"] == 1}
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().count("\n") == len(rows)
    for extra, fragment in [(["--lengths", "1k,x"], "--lengths: expected comma-separated token counts"),
                            (["--lengths", "0"], "--lengths: positive token counts, got [0]"),
                            (["--relevant-ops", "-1"], "--relevant-ops: counts of 0 or more, got [-1]"),
                            (["--samples", "0"], "'--samples': Input should be greater than or equal to 1"),
                            (["--lengths", "512", "--base-lengths", "1k"], "--base-lengths: 1024 is not among"),
                            (["--lengths", "60"], "latent-list at length 60: the program with 1 relevant lines")]:
        where = tmp_path / f"x{len(extra)}{extra[-1]}"
        one_line_error(runner.invoke(app, ["eval", "latent-list", "--model", str(trained()), "--device", "cpu",
                                           "--out", str(where), *extra]), 2, fragment)
        assert not where.exists()
