"""`tape eval nolima`: the tests a needle set expands to, the needle's placement with its random draws and the scoring
equal to the official run_tests.py, book_haystack.py and async_evaluate.py (written out here from their published
source) on a tiny needle set and books, the scores and effective length with a stand-in model, and the real command
on a tape run and a Hugging Face Llama."""

from __future__ import annotations

import json
import random
import re
from copy import copy

import numpy as np
import pytest
from cli_helpers import one_line_error
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.data import nolima as data
from tapecli.data.tokenizer import ByteTokenizer
from tapecli.errors import TapeError
from tapecli.eval import nolima
from tapecli.eval.protocol import run

runner = CliRunner()

NEEDLE_SET = [
    {"id": "0401", "reasoning_type": "world_knowledge", "system_prompt": "You are a helpful assistant",
     "needle": "Actually, {CHAR} lives next to the {1}.",
     "questions": {"onehop": "Which character has been to {2}?", "twohop": "Which character has been to {3}?"},
     "character_set": ["Yuki", "Stuart", "Katie", "Diana"],
     "tests": {"T01": {"input_args": ["Semper Opera House", "Dresden", "Saxony"]},
               "T02": {"input_args": ["Kiasma museum", "Helsinki", "Uusimaa"]}}},
    {"id": "0502", "system_prompt": "", "needle": "The cellar of {1} holds {2} wheels of cheese.",
     "questions": {"onehop": "Who keeps {2} near {1}?"},  # two placeholders: the official loop replaces only the last
     "distractors": {"onehop": "A cart of {2} stood in the road."},
     "tests": {"T01": {"input_args": ["Bob", "forty"], "gold_answers": ["Bob"]}}},
]


def official_tests(needle_set, base_seed=42):
    """run_tests.py's loop over the needle set, as published (DEFAULT_TASK_TEMPLATE is data.DEFAULT_TASK_TEMPLATE)."""
    tests = []
    for exp_config in needle_set:
        system_prompt = exp_config["system_prompt"]
        exp_id = exp_config["id"]
        for question_type, question in exp_config["questions"].items():
            for test_id, test in exp_config["tests"].items():
                full_needle = "" + exp_config["needle"]
                input_args = test["input_args"]
                tests.append({
                    "test_name": exp_id+"_"+test_id+"_"+question_type,
                    "system_prompt": system_prompt,
                    "task_template": data.DEFAULT_TASK_TEMPLATE if "task_template" not in exp_config else exp_config["task_template"],  # noqa: E501
                    "gold_answers": test["gold_answers"] if "gold_answers" in test else "",
                    "seed": base_seed + int(exp_id[:4])
                })
                if "character_set" in exp_config:
                    tests[-1]["character_set"] = exp_config["character_set"]
                else:
                    tests[-1]["character_set"] = ""
                full_question = copy(question)
                full_distractor = None
                for arg_no, arg in enumerate(input_args):
                    arg_placeholder = "{"+str(arg_no+1)+"}"
                    if arg_placeholder in question:
                        full_question = question.replace(arg_placeholder, arg)
                    if arg_placeholder in full_needle:
                        full_needle = full_needle.replace(arg_placeholder, arg)
                    if "distractors" in exp_config and arg_placeholder in exp_config["distractors"][question_type]:
                        full_distractor = exp_config["distractors"][question_type].replace(arg_placeholder, arg)
                tests[-1]["needle"] = full_needle
                tests[-1]["retrieval_question"] = full_question
                tests[-1]["distractor"] = full_distractor
    return tests


class OfficialBookHaystack:
    """book_haystack.py's BookHaystack (shift 0, no static depth), as published, over given encode / decode."""

    def __init__(self, text):
        self.text = text
        self.text_encoded = None

    def _generate_w_needle_placement(self, needle, encoding_func, decoding_func, context_length, depth, shift=0):
        if self.text_encoded is None:
            self.text_encoded = encoding_func(self.text)
            self.text_tokens = [decoding_func([i]) for i in self.text_encoded]
            self.valid_positions_token_counts = [0]
            for i in range(len(self.text_tokens)):
                if "\n" in self.text_tokens[i]:
                    self.valid_positions_token_counts.append(i)
            self.valid_positions_token_counts = np.array(self.valid_positions_token_counts)
        delta = (self.valid_positions_token_counts - shift) / (context_length + 1) - depth
        delta[delta < 0] = np.inf
        closest_pos_arg = np.argmin(delta)
        context_length_wo_needle = context_length
        start_pos = self.valid_positions_token_counts[closest_pos_arg] - int(np.round(context_length_wo_needle * depth))
        end_pos = start_pos + context_length_wo_needle
        assert start_pos >= 0
        assert end_pos <= len(self.text_encoded)
        pre_haystack = decoding_func(self.text_encoded[start_pos:self.valid_positions_token_counts[closest_pos_arg]+1])
        pre_haystack = pre_haystack[:max(pre_haystack.rfind("\n"), 0)]
        post_haystack = decoding_func(self.text_encoded[self.valid_positions_token_counts[closest_pos_arg]+1:end_pos])
        return {"text": pre_haystack + " " + needle + "\n" + post_haystack}

    def generate_w_needle_placement(self, needle, encoding_func, decoding_func, context_length, depth,
                                    distractor=None, distractor_free_zone=0.2):
        if distractor is None:
            return self._generate_w_needle_placement(needle, encoding_func, decoding_func, context_length, depth)
        left_available_span = max(0, depth - 2 * distractor_free_zone)
        right_available_span = max(0, 1 - (depth + 2 * distractor_free_zone))
        dist_depth = np.random.uniform(0, left_available_span + right_available_span)
        if dist_depth > left_available_span:
            dist_depth = depth + distractor_free_zone + (dist_depth - left_available_span)
        else:
            dist_depth += distractor_free_zone
        if context_length < 500:
            if depth < 0.6:
                dist_depth = 0.7
            elif depth > 0.75:
                dist_depth = 0.6
            else:
                dist_depth = 0.5
        placement_w_distractor = self._generate_w_needle_placement(distractor, encoding_func, decoding_func,
                                                                   context_length, dist_depth)
        distr_char_pos = placement_w_distractor["text"].index(distractor)
        distr_placement_findspan = (max(distr_char_pos-50, 0), distr_char_pos-1)
        if context_length < 500:
            distr_placement_findspan = (max(distr_char_pos-25, 0), distr_char_pos-1)
        placement_w_needle = self._generate_w_needle_placement(needle, encoding_func, decoding_func, context_length,
                                                               depth)
        distractor_loc = placement_w_needle["text"].index(placement_w_distractor["text"][distr_placement_findspan[0]:distr_placement_findspan[1]]) + (49 if context_length >= 500 else 23)  # noqa: E501
        placement_w_needle["text"] = placement_w_needle["text"][:distractor_loc] + " " + distractor + "\n" + placement_w_needle["text"][distractor_loc:]  # noqa: E501
        return placement_w_needle


def official_evaluate_response(metric, response, gold_answers):
    """async_evaluate.py's _evaluate_response."""
    if metric == "EM":
        return int(response.strip() in gold_answers)
    elif metric == "contains":
        return int(any([gold_answer in response for gold_answer in gold_answers]))
    elif metric == "lastline_EM":
        return int(response.strip().split("\n")[-1] in gold_answers)
    elif metric == "lastline_contains":
        return int(any([gold_answer in response.strip().split("\n")[-1] for gold_answer in gold_answers]))


def book(seed: int, lines: int = 300) -> str:
    """A shuffled-book stand-in: lines of random words (no line repeats a 40-character span)."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10**6):06d}" for _ in range(2000)]
    return "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(lines)) + "\n"


def write(tmp_path, needle_set=NEEDLE_SET[:1]):
    """The needle set (by default without the distractor's experiment: its anchor needs 64+ tokens around it) and two
    books."""
    (tmp_path / "needle_set.json").write_text(json.dumps(needle_set))
    (tmp_path / "books").mkdir()
    for i in (1, 2):
        (tmp_path / "books" / f"rand_book_{i}.txt").write_text(book(i))


def test_the_tests_are_run_tests_pys():
    ours = data.expand(NEEDLE_SET)
    theirs = official_tests(NEEDLE_SET)
    assert [(t.name, t.system_prompt, t.task_template, t.gold_answers, t.seed, t.character_set, t.needle, t.question,
             t.distractor) for t in ours] == [
        (t["test_name"], t["system_prompt"], t["task_template"], t["gold_answers"], t["seed"], t["character_set"],
         t["needle"], t["retrieval_question"], t["distractor"]) for t in theirs]
    assert [t.name for t in ours] == ["0401_T01_onehop", "0401_T02_onehop", "0401_T01_twohop", "0401_T02_twohop",
                                      "0502_T01_onehop"]
    assert ours[4].question == "Who keeps forty near {1}?" and ours[0].seed == 42 + 401
    assert data.depths(26)[:3] == [0.0, 0.04, 0.08] and data.depths(26)[-1] == 1.0


@pytest.mark.parametrize("length", [64, 120, 600])
def test_placement_and_draws_are_the_official_ones(length):
    """Each series (test, book) draws its characters (and distractor depths) from np.random.seed(test seed + book
    number) in depth order, as async_evaluate.py; the placed text equals BookHaystack's."""
    tok = ByteTokenizer()
    text = book(1, lines=400)
    ours = data.Haystack("b", text, tok)
    depth_list = data.depths(6)
    stopped = []
    for test in data.expand(NEEDLE_SET):
        official = OfficialBookHaystack(text)
        np.random.seed(test.seed + 1)
        for depth, (character, distractor_depth) in zip(depth_list, data.draws(test, test.seed + 1, depth_list,
                                                                               length), strict=True):
            needle = test.needle
            if "{CHAR}" in needle:
                expected = str(np.random.choice(test.character_set))
                assert character == expected
                needle = needle.replace("{CHAR}", expected)
            try:
                placed = official.generate_w_needle_placement(needle, tok.encode, tok.decode, length, depth,
                                                              distractor=test.distractor)["text"]
            except ValueError:  # the distractor's anchor is not in the needle's context: both stop
                assert length < 500 and test.distractor is not None
                with pytest.raises(TapeError, match="the text before the distractor occurs 0 times"):
                    ours.place_with_distractor(needle, test.distractor, length, depth, distractor_depth)
                stopped.append(depth)
                continue
            mine = (ours.place(needle, length, depth) if test.distractor is None else
                    ours.place_with_distractor(needle, test.distractor, length, depth, distractor_depth))
            assert mine == placed
            assert needle in mine and (test.distractor is None or test.distractor in mine)
    assert len(stopped) < len(depth_list)  # the distractor is placed at most depths


@pytest.mark.parametrize("response", ["Yuki", " Yuki \n", "It is Yuki.", "Stuart\nYuki", "Yuki\nStuart", "", "yuki",
                                      "Bob and Yuki"])
@pytest.mark.parametrize("gold", [["Yuki"], ["Yuki", "Bob"], [""], []])
def test_scoring_is_async_evaluate_pys(response, gold):
    for metric in data.METRICS:
        assert data.score(metric, response, gold) == official_evaluate_response(metric, response, gold)


def test_scores_and_effective_length_with_a_stand_in_model(tmp_path, monkeypatch, trained):
    """The stand-in names the needle's character when the context is 64 tokens, and Katie otherwise: every test is
    right at 64 tokens; at 128 only the trials whose drawn character is Katie."""
    write(tmp_path)

    def answer(opened, prompts, batch_size, max_new_tokens, stop_check=None):
        assert max_new_tokens == 192
        out = []
        for p in prompts:
            name = re.search(r"Actually, (\w+) lives|The cellar of (\w+)", p)
            snippet = p.split("snippet:\n\n")[1].split("\n\nUse the information")[0]
            short = len(snippet) < 140  # 64 bytes of book + the needle; 128 bytes + the needle
            out.append((name[1] or name[2]) if short else "Katie")
        return out

    monkeypatch.setattr("tapecli.eval.common.generate_texts", answer)
    evaluation = nolima.NoLiMa(str(tmp_path / "needle_set.json"), str(tmp_path / "books"), [64, 128], depths=3)
    report = run(evaluation, [str(trained())], tmp_path / "out", device="cpu", batch_size=4, show_progress=False)
    m = report.results["nolima"]["models"][0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 * 2 * 3
    katie = [r for r in rows if r["length"] == 128 and r["character"] == "Katie"]
    assert 0 < len(katie) < 24 and m["scores"] == {"64": 100.0, "128": round(100 * len(katie) / 24, 2)}
    assert m["base_lengths"] == [64] and m["base_score"] == 100.0 and m["effective_length_nolima"] == 64
    assert m["by_question_type"]["twohop"]["64"] == 100.0 and set(m["by_test"]) == {t.name for t in evaluation.tests}
    assert (tmp_path / "out" / "nolima.png").read_bytes()[:4] == b"\x89PNG"
    # A unit rebuilt alone (as after a resume) is the trial the series made
    trial = evaluation.trial(ByteTokenizer(), (128, 0, 1, 2))
    assert trial["character"] == [r for r in rows if (r["length"], r["test"], r["book"], r["depth"]) ==
                                  (128, 0, 1, 2)][0]["character"]


@pytest.mark.slow
def test_the_command_on_a_tape_run_and_a_hugging_face_llama(tmp_path, trained, tiny_hf_llama):
    """Two real models answer real prompts; a rerun after a lost last row redoes only that row; bad input is one line
    before anything is written; without --needle-set (offline) one sentence says what to pass."""
    write(tmp_path)
    out = tmp_path / "out"
    args = ["eval", "nolima", "--model", str(trained()), "--model", str(tiny_hf_llama), "--needle-set",
            str(tmp_path / "needle_set.json"), "--haystack", str(tmp_path / "books" / "rand_book_1.txt"),
            "--lengths", "24,48", "--depths", "2", "--device", "cpu", "--batch-size", "4", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "effective length" in result.output and "| twohop |" in result.output
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 4 * 2 and {r["model"] for r in rows} == {0, 1}
    results = json.loads((out / "results.json").read_text())
    assert [m["kind"] for m in results["models"]] == ["tape", "hf"] and results["settings"]["metric"] == "contains"
    lines = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and (out / "samples.jsonl").read_text().splitlines() == lines
    model = str(trained())
    given = ["--needle-set", str(tmp_path / "needle_set.json"), "--haystack", str(tmp_path / "books")]
    for n, (extra, fragment) in enumerate([
            ([*given, "--metric", "F1"], "--metric: one of contains, EM, lastline_EM, lastline_contains"),
            ([*given, "--lengths", "100k"], "is too short for 102400 tokens"),
            ([*given, "--lengths", "0,250"], "--lengths: positive token counts, got [0, 250]"),
            (["--needle-set", str(tmp_path / "none.json")], "--needle-set"),
            ([], "amodaresi/NoLiMa cannot be read from the Hugging Face hub (offline or unreachable); download "
                 "needlesets/needle_set.json")]):
        where = tmp_path / f"x{n}"
        one_line_error(runner.invoke(app, ["eval", "nolima", "--model", model, "--device", "cpu", "--out",
                                           str(where), *extra]), 2, fragment)
        assert not where.exists()
