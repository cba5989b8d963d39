"""Flip-flop and CoPE's counting task: the generators follow their definitions, the splits are what the recipes
say, and `tape eval synthetic` scores exactly the read bits / the answer (and grid navigation's objects)."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from tapecli.data.counting import VALUES, VARIABLES, CountSpec
from tapecli.data.flipflop import FlipFlopSpec
from tapecli.data.synthetic import BLANK, GridSpec, SyntheticDataset, split_specs
from tapecli.data.tokenizer import CharTokenizer
from tapecli.errors import TapeError
from tapecli.eval.synthetic import evaluate_synthetic
from tapecli.recipe import load_recipe

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------------------
# Flip-flop


@pytest.mark.parametrize("p_ignore", [0.0, 0.5, 0.98])
def test_flip_flop_reads_return_the_last_written_bit(p_ignore):
    for seed in range(50):
        ex = FlipFlopSpec(64, p_ignore).example(random.Random(seed))
        instructions, bits = ex.text[::2], ex.text[1::2]
        assert len(ex.text) == 64 and instructions[0] == "w" and instructions[-1] == "r"
        assert set(instructions) <= set("wri") and set(bits) <= set("01")
        memory = None
        for k, (instruction, bit) in enumerate(zip(instructions, bits, strict=True)):
            if instruction == "w":
                memory = bit
            elif instruction == "r":
                assert bit == memory
            assert ex.scored[2 * k + 1] == (instruction == "r") and not ex.scored[2 * k]  # the read bits only
        assert all(ex.targets)  # the loss on every token


def test_flip_flop_instruction_and_bit_frequencies():
    """FFL(p): ignore with probability p, write and read (1 - p) / 2 each, between the first write and the last
    read; written and ignored bits are fair coins."""
    for p in (0.1, 0.8):
        counts, bits = {"w": 0, "r": 0, "i": 0}, []
        for seed in range(200):
            text = FlipFlopSpec(202, p).example(random.Random(seed)).text
            for instruction, bit in zip(text[2:-2:2], text[3:-2:2], strict=True):
                counts[instruction] += 1
                if instruction != "r":
                    bits.append(bit)
        total = sum(counts.values())
        assert abs(counts["i"] / total - p) < 0.01
        assert abs(counts["w"] / total - (1 - p) / 2) < 0.01 and abs(counts["r"] / total - (1 - p) / 2) < 0.01
        assert abs(bits.count("1") / len(bits) - 0.5) < 0.01


# ---------------------------------------------------------------------------------------------------------------
# Counting


def run_program(text: str) -> tuple[str, str, list[str]]:
    """A reference interpreter of the `counting` characters: (the variable asked, its value, the statements)."""
    body, name = text[:-3], text[-2]
    assert text[-3] == "?"
    statements = re.findall(r"[a-j]=0;|\.|[a-j]\+", body)
    assert "".join(statements) == body
    values: dict[str, int] = {}
    for statement in statements:
        if statement.endswith("=0;"):
            values[statement[0]] = 0
        elif statement.endswith("+"):
            assert statement[0] in values  # an increment only after a set
            values[statement[0]] += 1
    return name, VALUES[values[name]], statements


@pytest.mark.parametrize("variables", [1, 3, 5])
def test_counting_answer_is_the_value_after_the_program(variables):
    for seed in range(300):
        ex = CountSpec(variables, 60, 50.0, 10**6).example(random.Random(seed))  # a window that never cuts
        name, value, statements = run_program(ex.text)
        assert ex.text[-1] == value and name in VARIABLES[:variables] and 3 <= len(statements) <= 60
        assert ex.scored == ex.targets == [False] * (len(ex.text) - 1) + [True]  # the answer only
    # Without passes the first statement is always a set (an increment first is drawn again), so no program is
    # rejected and the number of statements is plainly uniform in 3..max_statements.
    lengths = [len(run_program(CountSpec(variables, 60, 0.0, 10**6).example(random.Random(s)).text)[2])
               for s in range(600)]
    assert min(lengths) == 3 and max(lengths) == 60 and abs(sum(lengths) / len(lengths) - 31.5) < 1.5


def test_counting_statement_frequencies_and_values():
    """Statements weighted set 1 : pass 50 : increment 7 (a statement that cannot be made is drawn again), values
    never above 10; the question asks about a variable that was set, uniformly."""
    kinds = {"set": 0, "pass": 0, "increment": 0}
    asked = []
    for seed in range(300):
        text = CountSpec(3, 512, 50.0, 10**6).example(random.Random(seed)).text
        name, value, statements = run_program(text)
        asked.append(name)
        for s in statements:
            kinds["pass" if s == "." else "set" if s.endswith(";") else "increment"] += 1
    total = sum(kinds.values())
    # Sets and passes are never redrawn, and a redrawn increment is replaced with the same weights: their ratio
    # stays 1 : 50. Increments (redrawn before any set and at 10, often with 3 variables) fall below their 7 / 58.
    assert abs(kinds["set"] / (kinds["set"] + kinds["pass"]) - 1 / 51) < 0.002
    assert 0.5 * 7 / 58 < kinds["increment"] / total < 7 / 58
    assert {asked.count(v) for v in "abc"} and all(abs(asked.count(v) / 300 - 1 / 3) < 0.1 for v in "abc")


def test_counting_window_keeps_the_last_tokens():
    for seed in range(20):
        whole = CountSpec(1, 512, 50.0, 10**6).example(random.Random(seed)).text
        cut = CountSpec(1, 512, 50.0, 40).example(random.Random(seed))
        assert cut.text == whole[-40:] and cut.scored[-1] and sum(cut.scored) == 1


# ---------------------------------------------------------------------------------------------------------------
# Both: determinism, splits, recipe keys


@pytest.mark.parametrize(("task", "spec"), [("flip-flop", FlipFlopSpec(32, 0.8)),
                                           ("counting", CountSpec(3, 40, 50.0, 64))])
def test_examples_are_pure_functions_of_seed_split_and_index(task, spec):
    a = SyntheticDataset(task, spec, seed=3, split="train", length=10, seq_len=spec.length)
    b = SyntheticDataset(task, spec, seed=3, split="train", length=10, seq_len=spec.length)
    assert [a.example(i) for i in range(6)] == [b.example(i) for i in range(6)]
    assert a.example(4) != a.example(5)
    assert a.example(0) != SyntheticDataset(task, spec, 4, "train", 10, spec.length).example(0)
    assert a.example(0) != SyntheticDataset(task, spec, 3, "val", 10, spec.length).example(0)
    tok = CharTokenizer(spec.tokenizer)
    inputs, labels = a[1]
    ids = tok.encode(a.example(1).text)
    assert inputs.tolist()[: len(ids)] == [tok.bos_id] + ids[:-1]
    assert a.scored_mask([1]).tolist()[0][: len(ids)] == a.example(1).scored


def test_splits_follow_the_recipes():
    ff = load_recipe("flip-flop")
    assert split_specs("flip-flop", ff.data, ff.eval) == {
        "iid": FlipFlopSpec(512, 0.8), "ood-dense": FlipFlopSpec(512, 0.1), "ood-sparse": FlipFlopSpec(512, 0.98)}
    count = load_recipe("counting")
    assert split_specs("counting", count.data, count.eval) == {
        "iid": CountSpec(3, 512, 50.0, 512), "ood-dense": CountSpec(3, 115, 5.0, 256),
        "ood-sparse": CountSpec(3, 1836, 200.0, 2048)}
    assert (count.data.train_size, count.train.epochs, count.train.max_steps, count.train.schedule) == (
        10000, 100, 15625, "constant")  # the official script: 100 epochs of 10K at batch 64, no decay


@pytest.mark.parametrize(("recipe", "overrides", "key"), [
    ("flip-flop-smoke", ["data.seq_len=15"], "data.seq_len"),
    ("flip-flop-smoke", ["data.p_ignore=1.0"], "data.p_ignore"),
    ("flip-flop-smoke", ["eval.sparse_ignore=-0.1"], "eval.sparse_ignore"),
    ("flip-flop-smoke", ["data.train_size=0"], "data.train_size"),
    ("counting-smoke", ["data.variables=11"], "data.variables"),
    ("counting-smoke", ["data.max_statements=2"], "data.max_statements"),
    ("counting-smoke", ["data.pass_weight=-1"], "data.pass_weight"),
    ("counting-smoke", ["eval.dense_counting=[8, 5]"], "eval.dense_counting"),
])
def test_recipe_mistakes_name_the_key(recipe, overrides, key):
    with pytest.raises(TapeError, match=key.replace(".", r"\.")):
        load_recipe(recipe, overrides)


# ---------------------------------------------------------------------------------------------------------------
# Scoring


class Constant(torch.nn.Module):
    """Predicts the same token everywhere."""

    def __init__(self, token_id: int) -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.token_id = token_id
        self.config = type("Config", (), {"pe": "rope", "max_seq_len": 4096})()

    def forward(self, input_ids, start_pos=0):
        logits = torch.zeros(*input_ids.shape, 64)
        logits[..., self.token_id] = 1.0
        return logits


@pytest.mark.parametrize(("recipe", "guess"), [("flip-flop-smoke", "0"), ("counting-smoke", "0"),
                                               ("grid-1d-smoke", BLANK)])
def test_accuracies_equal_hand_counts(tmp_path, recipe, guess):
    """Always guessing one token: per-token accuracy = the share of scored tokens equal to it, whole-sequence
    accuracy = the share of sequences whose scored tokens all are, object accuracy (grid) = 0 for a blank guess."""
    r = load_recipe(recipe)
    tok = CharTokenizer(r.data.tokenizer)
    results = evaluate_synthetic(Constant(tok.encode(guess)[0]), r, tmp_path, samples=6, batch_size=4)
    for split, spec in split_specs(r.data.kind, r.data, r.eval).items():
        examples = [SyntheticDataset(r.data.kind, spec, 1234, split, 6, spec.length).example(i) for i in range(6)]
        scored = [[c for c, s in zip(ex.text, ex.scored, strict=True) if s] for ex in examples]
        scored = [s for s in scored if s]
        got = results["splits"][split]
        assert got["token_accuracy"] == pytest.approx(sum(s.count(guess) for s in scored) / sum(map(len, scored)))
        assert got["accuracy"] == pytest.approx(sum(set(s) == {guess} for s in scored) / len(scored))
        if recipe.startswith("grid"):
            objects = sum(len(s) - s.count(BLANK) for s in scored)
            assert got["object_tokens"] == objects and got["object_accuracy"] == (0.0 if objects else None)
        else:
            assert "object_accuracy" not in got
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert ("object_scored" in rows[0]) == recipe.startswith("grid")


def test_grid_object_accuracy_counts_revisited_objects():
    """The objects of a grid split are its scored observations that are not blank."""
    ex = GridSpec("grid-1d", 64, 4, 0.5).example(random.Random(0))
    assert any(s and c == BLANK for c, s in zip(ex.text, ex.scored, strict=True))
    assert any(s and c != BLANK for c, s in zip(ex.text, ex.scored, strict=True))


@pytest.mark.parametrize("edges", ["torus", "clamped"])
def test_grid_edges_wrap_or_stop_the_walker(edges):
    """Replaying the actions from the true start (one of the 3 cells) explains every observation: a cell shows one
    object for the whole walk, and an observation is scored exactly when its cell was seen before. On a torus the
    walker wraps around; clamped, a move into an edge leaves it where it is."""
    for seed in range(20):
        ex = GridSpec("grid-1d", 81, 3, 0.5, edges).example(random.Random(seed))
        explained = []
        for start in range(3):
            position, cells, ok = start, {start: ex.text[0]}, True
            for t in range(1, len(ex.text), 2):
                step = 1 if ex.text[t] == "R" else -1
                position = (position + step) % 3 if edges == "torus" else min(max(position + step, 0), 2)
                seen = position in cells
                ok &= ex.scored[t + 1] == seen and cells.setdefault(position, ex.text[t + 1]) == ex.text[t + 1]
            explained.append(ok)
        assert any(explained), seed


def test_demo_budgets_are_valid_recipes():
    from tapecli.experiments.demo_synthetic import BUDGETS

    for task, budget in BUDGETS.items():
        recipe = load_recipe(task, list(budget.sweep_overrides()))
        assert recipe.data.kind == task
    assert load_recipe("counting", list(BUDGETS["counting"].sweep_overrides())).train.max_steps == 625


def test_a_grid_sweep_reports_the_object_accuracy(tmp_path):
    from typer.testing import CliRunner

    from tapecli.cli import app

    out = tmp_path / "sweep"
    result = CliRunner().invoke(app, ["sweep", "--recipe", "grid-1d-smoke", "--pe", "rope", "--seeds", "0", "--out",
                                      str(out), "train.max_steps=2"])
    assert result.exit_code == 0, result.output
    assert "whole sequence / per token / per object token" in result.output
    summary = json.loads((out / "results.json").read_text())
    assert summary["evaluation"]["metrics"] == ["accuracy", "token_accuracy", "object_accuracy"]
    cell = json.loads((out / "rope-seed0" / "eval-synthetic" / "step-00000002" / "results.json").read_text())
    for split, values in cell["splits"].items():
        assert summary["groups"][0]["scores"][split]["object_accuracy"]["mean"] == values["object_accuracy"]
