"""BABILong's data (`tapecli.data.babilong`): the bAbI world simulator checked by an independent reader of its
sentences (the facts answer their question), BABILong's prompt template, the haystack sizing and the depth windows,
BABILong's own files, and the `babilong` data kind (the loss on the answer)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import torch

from tapecli.data.babilong import official
from tapecli.data.babilong.prompts import DEFAULT_PROMPTS, format_prompt
from tapecli.data.babilong.samples import TOKENS_TO_GENERATE, Generator, Haystack
from tapecli.data.babilong.world import ACTORS, GIVE_ACTORS, LOCATIONS, OBJECTS, TASKS, story
from tapecli.data.text import IGNORE_INDEX
from tapecli.data.tokenizer import load_tokenizer
from tapecli.errors import TapeError
from tapecli.recipe import load_recipe

TOKENIZER = Path(__file__).parents[1] / "fixtures" / "ruler" / "tokenizer" / "tokenizer.json"
MOVE = re.compile(r"(\w+) (?:moved|went|journeyed|travelled|went back) to the (\w+)\.")
GET = re.compile(r"(\w+) (?:got|took|picked up|grabbed) the (\w+) there\.")
DROP = re.compile(r"(\w+) (?:dropped|put down|discarded|left) the (\w+)\.")
GIVE = re.compile(r"(\w+) (?:gave|passed|handed) the (\w+) to (\w+)\.")
RELATION = re.compile(r"The (\w+) is (north|south|east|west) of the (\w+)\.")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def read(facts: list[str]) -> dict:
    """An independent reader: what the sentences tell about places (the bAbI rules written from scratch)."""
    actor_at, holder, lies, places, gives, relations = {}, {}, {}, {o: [] for o in OBJECTS}, [], set()

    def seen(o: str, place: str | None) -> None:
        if place is None:
            places[o] = []
        elif not places[o] or places[o][-1] != place:
            places[o].append(place)

    for fact in facts:
        if m := MOVE.fullmatch(fact):
            actor_at[m[1]] = m[2]
            for o, h in holder.items():
                if h == m[1]:
                    seen(o, m[2])
        elif m := GET.fullmatch(fact):
            holder[m[2]] = m[1]
            lies.pop(m[2], None)
            seen(m[2], actor_at.get(m[1]))
        elif m := DROP.fullmatch(fact):
            assert holder.pop(m[2]) == m[1], fact  # only what one holds can be dropped
            lies[m[2]] = actor_at.get(m[1])
        elif m := GIVE.fullmatch(fact):
            assert holder[m[2]] == m[1] and m[3] != m[1], fact
            assert actor_at.get(m[1]) == actor_at.get(m[3]) or m[1] not in actor_at or m[3] not in actor_at, fact
            holder[m[2]] = m[3]
            gives.append((m[1], m[2], m[3]))
        elif m := RELATION.fullmatch(fact):
            relations.add((m[1], m[2], m[3]))
            relations.add((m[3], OPPOSITE[m[2]], m[1]))
        else:
            raise AssertionError(f"not a bAbI sentence: {fact!r}")
    return {"actor_at": actor_at, "holder": holder, "lies": lies, "places": places, "gives": gives,
            "relations": relations}


def expected_answer(question: str, state: dict) -> str:
    if m := re.fullmatch(r"Where is (\w+)\?", question):
        return state["actor_at"][m[1]]
    if m := re.fullmatch(r"Where is the (\w+)\?", question):
        o = m[1]
        return state["actor_at"][state["holder"][o]] if o in state["holder"] else state["lies"][o]
    if m := re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question):
        assert state["places"][m[1]][-1] == m[2]
        return state["places"][m[1]][-2]
    if state["gives"]:
        a, o, r = state["gives"][-1]
        forms = {f"What did {a} give to {r}?": o, f"Who gave the {o} to {r}?": a, f"Who did {a} give the {o} to?": r,
                 f"Who received the {o}?": r, f"Who gave the {o}?": a}
        return forms[question]
    m = re.fullmatch(r"What is (north|south|east|west) of the (\w+)\?", question) or \
        re.fullmatch(r"What is the (\w+) (north|south|east|west) of\?", question)
    assert m, question
    if question.startswith("What is the "):
        place, direction = m[1], m[2]
        return next(b for a, d, b in state["relations"] if a == place and d == direction)
    direction, place = m[1], m[2]
    return next(a for a, d, b in state["relations"] if b == place and d == direction)


@pytest.mark.parametrize("task", TASKS)
def test_every_story_is_answered_by_its_own_facts(task):
    """400 stories per task: an independent reader of the sentences finds the generator's answer, every sentence is
    one of bAbI's, the supporting facts name the question's entities, and every story is a pure function of its
    seed."""
    lengths = []
    for i in range(400):
        s = story(task, random.Random(f"t:{i}"))
        assert s == story(task, random.Random(f"t:{i}"))
        assert expected_answer(s.question, read(s.facts)) == s.answer, (s.facts, s.question, s.answer)
        assert s.support and all(0 <= k < len(s.facts) for k in s.support)
        lengths.append(len(s.facts))
        names = GIVE_ACTORS if task == "qa5" else ACTORS
        assert {w for f in s.facts for w in re.findall(r"[A-Z]\w+", f)} <= {*names, "The"}
        assert s.answer in (*LOCATIONS, *OBJECTS, *names)
    if task == "qa1":
        assert sorted(set(lengths)) == [2, 4, 6, 8, 10]  # two moves before each of the five questions
    elif task == "qa4":
        assert set(lengths) == {2}
    else:
        assert min(lengths) >= 3 and max(lengths) > 20


def test_the_supporting_facts_are_the_ones_bAbI_names():
    s = story("qa1", random.Random(0))
    actor = s.question.split()[2][:-1]
    assert s.facts[s.support[0]].startswith(actor) and s.answer in s.facts[s.support[0]]
    for i in range(50):
        s = story("qa2", random.Random(i))
        obj = s.question.split()[3][:-1]
        assert any(obj in s.facts[k] for k in s.support) and any(MOVE.fullmatch(s.facts[k]) for k in s.support)
        s = story("qa4", random.Random(i))
        assert len(s.support) == 1 and (s.answer in s.facts[s.support[0]])


def test_the_prompt_is_babilongs_template():
    """BABILong's DEFAULT_TEMPLATE filled by get_formatted_input, written out by hand, in all three styles."""
    context, question = "Mary moved to the office. The grass is green.", "Where is Mary?"
    assert format_prompt("qa1", "bare", f" {context} ", question) == f"<context>\n{context}\n</context>\n\nQuestion: " \
                                                                     f"{question}"
    p = DEFAULT_PROMPTS["qa1"]
    assert format_prompt("qa1", "full", context, question) == (
        f"{p['instruction']}\n\n{p['examples']}\n\n{p['post_prompt']}\n\n<context>\n{context}\n</context>\n\n"
        f"Question: {question}")
    assert format_prompt("qa1", "no-examples", context, question) == (
        f"{p['instruction']}\n\n\n\n{p['post_prompt']}\n\n<context>\n{context}\n</context>\n\nQuestion: {question}")
    assert p["examples"].startswith("<example>\nCharlie went to the hallway. Judith come back to the kitchen.")
    with pytest.raises(TapeError, match="--prompt: expected one of full, no-examples, bare"):
        format_prompt("qa1", "chat", context, question)


def test_samples_fit_their_length_and_put_the_facts_at_their_depth():
    tok = load_tokenizer(str(TOKENIZER))
    generator = Generator(tok, seed=3)
    for task in TASKS:
        facts_only = generator.sample(task, 0, None, 7)
        assert facts_only.input == " ".join(facts_only.extra["facts"]) and facts_only.extra["sentences"] == 0
        for length in (512, 1024):
            for depth in (0.0, 0.5, 1.0):
                s = generator.sample(task, length, depth, 7)
                assert s.prompt_tokens == len(tok.encode(s.prompt, add_special_tokens=True))
                assert length - 40 < s.prompt_tokens + TOKENS_TO_GENERATE <= length  # whole sentences, close to L
                assert s.question == facts_only.question and s.target == facts_only.target  # the same story
                assert s.extra["facts"] == facts_only.extra["facts"]
                low = depth * 0.8
                assert all(low - 0.05 <= d <= low + 0.2 + 1e-9 for d in s.extra["fact_depths"]), s.extra
                # The text is the story's facts, in order, among whole noise sentences.
                sentences = re.split(r"(?<=\.) ", s.input)
                assert [x for x in sentences if x not in Haystack().sentences] == s.extra["facts"]
        anywhere = generator.sample(task, 1024, None, 7)
        assert anywhere.prompt == generator.sample(task, 1024, None, 7).prompt  # deterministic
        assert anywhere.prompt != Generator(tok, seed=4).sample(task, 1024, None, 7).prompt


def test_an_essay_haystack_and_the_lengths_too_short():
    tok = load_tokenizer(str(TOKENIZER))
    essay = ("Work is the thing you do when nobody is watching and it matters. " * 3 + "Short one. ") * 40
    generator = Generator(tok, Haystack(essay.split(" "), lambda text: re.split(r"(?<=\.) ", text)), seed=0)
    s = generator.sample("qa1", 1024, 0.5, 0)
    assert "Work is the thing" in s.input and "Short one." not in s.input  # BABILong skips sentences < 10 tokens
    with pytest.raises(TapeError, match=r"babilong qa3 at length 40: even the facts of 100 stories do not fit"):
        generator.sample("qa3", 40, None, 0)
    with pytest.raises(TapeError, match=r"no sentence of the text has 10 tokens or more"):
        Generator(tok, Haystack(["Hi."], lambda text: [text])).sample("qa1", 1024, None, 0)


def test_babilongs_own_files_are_read_in_any_published_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"input": f"Mary moved to the office. Text {i}.", "question": "Where is Mary?", "target": "office"}
            for i in range(3)]
    (tmp_path / "a" / "1k").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a" / "1k" / "qa1-00000-of-00001.parquet")
    (tmp_path / "b" / "qa1").mkdir(parents=True)
    (tmp_path / "b" / "qa1" / "0k.json").write_text(json.dumps(rows[:2]))
    (tmp_path / "b" / "qa10").mkdir()
    (tmp_path / "b" / "qa10" / "0k.json").write_text(json.dumps(rows))  # qa10 is not qa1
    got, described = official.rows(tmp_path / "a", "qa1", 1024)
    assert got == rows and described[0].startswith("1k/qa1-00000-of-00001.parquet sha256:")
    assert official.rows(tmp_path / "b", "qa1", 0)[0] == rows[:2]
    with pytest.raises(TapeError, match="no file for qa2 at 0k"):
        official.rows(tmp_path / "b", "qa2", 0)
    with pytest.raises(TapeError, match="--lengths 1000: BABILong's files come in 0k, 1k"):
        official.length_name(1000)
    (tmp_path / "b" / "qa1" / "0k.json").write_text(json.dumps([{"input": "x", "question": "y"}]))
    with pytest.raises(TapeError, match=r"0k.json: row 0 lacks one of the string fields input, question, target"):
        official.rows(tmp_path / "b", "qa1", 0)


def test_the_data_kind_trains_on_the_answer_of_the_evaluations_own_prompts(tmp_path):
    """Kind `babilong`: item i is the generator's sample in the training namespace, laid out as BOS + prompt +
    " answer" + EOS with the loss on the answer and EOS only; validation is a separate fixed stream."""
    recipe = load_recipe("babilong-example", [f"data.tokenizer={TOKENIZER}", "data.lengths=[0, 512]",
                                              "data.seq_len=512", "model.max_seq_len=512", "data.tasks=qa1,qa4"])
    tok = load_tokenizer(str(TOKENIZER))
    train, val = recipe.data.build(tok, 0, tmp_path)
    assert len(val) == 256 and not hasattr(train, "num_examples")  # a stream read in order
    for i in range(4):
        sample = train.sample(i)
        assert sample.task == ("qa1", "qa4")[i % 2] and sample.length in (0, 512)
        ids, labels = train[i]
        answer = tok.encode(" " + sample.target) + [tok.eos_id]
        assert labels[labels != IGNORE_INDEX].tolist() == answer
        assert ids[0] == tok.bos_id and ids[1: sample.prompt_tokens].tolist() == tok.encode(sample.prompt)
    assert train.sample(0).prompt != val.sample(0).prompt
    evaluation = Generator(tok, seed=recipe.eval.seed).sample("qa1", 512, None, 0)
    assert evaluation.prompt != train.sample(0).prompt and isinstance(train[0][0], torch.Tensor)


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.tasks=qa7"], "data.tasks: unknown task qa7; known: all, qa1, qa2, qa3, qa4, qa5"),
    (["data.lengths=[0, 512]"], "data.seq_len: 96 is shorter than the longest of data.lengths (512)"),
    (["data.depths=[1.5]"], "data.depths: fractions in [0, 1], or null for anywhere; got [1.5]"),
    (["data.tokenizer=synthetic"], "data.tokenizer: 'synthetic' is the tokenizer of generated data"),
    (["data.prompt=chat"], "data.prompt: expected one of full, no-examples, bare; got 'chat'"),
    (["eval.lengths=[-1]"], "eval.lengths: token counts of 0 (facts only) or more, got [-1]"),
    (["data.val_fraction=0.1"], "data.val_fraction is not a key of kind babilong"),
])
def test_bad_keys_are_one_line(overrides, message):
    with pytest.raises(TapeError) as info:
        load_recipe("babilong-example", overrides)
    assert message in str(info.value)


def test_the_examples_tokenizer_makes_a_noise_sentence_one_token(tmp_path, capsys):
    from tapecli.data.babilong import example

    example.main([str(tmp_path), "--vocab-size", "400"])
    assert "(400 pieces)" in capsys.readouterr().out
    tok = load_tokenizer(str(tmp_path / "tokenizer.model"))
    for symbol in example.SYMBOLS:
        assert len(tok.encode(symbol)) == 1, symbol
    text = "Mary moved to the office. The grass is green. The sky is blue. Where is Mary?"
    assert tok.decode(tok.encode(text)) == text and len(tok.encode(" office")) == 1
