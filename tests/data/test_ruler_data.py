"""tapecli.data.ruler: the samples equal the official RULER scripts' output (fixtures made by running them, see
tests/fixtures/ruler/make_fixtures.py), the lazy word list equals RULER's, and bad sources are one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tapecli.data.ruler import words
from tapecli.data.ruler.sources import read_essay, read_qa
from tapecli.data.ruler.tasks import Sources, generate, resolve_tasks
from tapecli.data.tokenizer import load_tokenizer
from tapecli.errors import TapeError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "ruler"
EXPECTED = sorted((FIXTURES / "expected").glob("*.jsonl"))


@pytest.fixture(scope="module")
def sources() -> Sources:
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    essay, _ = read_essay(FIXTURES / "essay.txt")
    qa, _ = read_qa([str(FIXTURES / "squad.json"), str(FIXTURES / "hotpotqa.json")])
    return Sources(essay_words=essay, split_sentences=PunktSentenceTokenizer().tokenize, qa=qa)


def fixture_tokenizer():
    return load_tokenizer(str(FIXTURES / "tokenizer" / "tokenizer.json"))


def test_the_fixtures_cover_every_task_and_both_length_branches():
    meta = json.loads((FIXTURES / "expected" / "meta.json").read_text())
    assert meta["wonderwords"] == words.wonderwords_version() == "2.2.0"
    cells = {p.stem.rsplit("-", 1)[0] for p in EXPECTED}
    assert cells == set(resolve_tasks("all")) and any(p.stem.endswith("-1024") for p in EXPECTED)


@pytest.mark.parametrize("path", EXPECTED, ids=lambda p: p.stem)
def test_samples_equal_the_official_scripts(path, sources):
    """Same seed, same tokenizer: every sample's input, answer prefix, references and length are the official ones,
    character for character."""
    task, length = path.stem.rsplit("-", 1)
    official = [json.loads(line) for line in path.read_text().splitlines()]
    tok = fixture_tokenizer()
    ours = generate(task, int(length), lambda text: len(tok.encode(text)), len(official), sources, seed=42)
    for sample, row in zip(ours, official, strict=True):
        assert sample.input == row["input"]
        assert sample.answer_prefix == row["answer_prefix"]
        assert sample.outputs == row["outputs"]
        assert sample.length == row["length"] <= int(length)


def test_adjective_noun_words_equal_rulers_sorted_set():
    """The lazy list equals sorted(set(f"{a}-{n}")) on lists with hyphenated extensions (old / old-fashioned / a
    chain), duplicates and nouns that sort between them; and on the real lists for every family plus 40 others."""
    adjs = ["old", "old-fashioned", "old-fashioned-ish", "blue", "blue-eyed", "zany", "old", "a", "a-b", "ab"]
    nouns = ["fashioned", "fashioned-house", "eyed", "ant", "zoo", "b", "b-c", "ant", "-", "fashioned-ish-x"]
    lazy = words.AdjectiveNouns(adjs, nouns)
    literal = sorted({f"{a}-{n}" for a in adjs for n in nouns})
    assert len(lazy) == len(literal) and list(lazy) == literal and lazy[-1] == literal[-1]
    real_adjs, real_nouns = words.read_list("adjectivelist.txt"), words.read_list("nounlist.txt")
    family = sorted({a for a in real_adjs if any(b.startswith(a + "-") or a.startswith(b + "-") for b in real_adjs)})
    picked = sorted(set(family + random.Random(0).sample(real_adjs, 40)))
    lazy = words.AdjectiveNouns(picked, real_nouns)
    assert list(lazy) == sorted({f"{a}-{n}" for a in picked for n in real_nouns})
    full = words.adjective_noun_words()
    assert len(full) == 6_175_260 and len(family) == 10  # wonderwords 2.2.0: 910 adjectives x 6,786 nouns


def test_task_names_and_sources_errors(tmp_path):
    assert resolve_tasks("ruler_vt, niah_single_1,vt") == ["vt", "niah_single_1"]
    with pytest.raises(TapeError, match="unknown task nope"):
        resolve_tasks("niah_single_1,nope")
    with pytest.raises(TapeError, match="no such file"):
        read_essay(tmp_path / "missing.txt")
    (tmp_path / "bad.json").write_text('{"essay": 1}')
    with pytest.raises(TapeError, match="PaulGrahamEssays"):
        read_essay(tmp_path / "bad.json")
    (tmp_path / "q.json").write_text("[1, 2]")
    with pytest.raises(TapeError, match="neither a SQuAD file"):
        read_qa([str(tmp_path / "q.json")])
    tok = fixture_tokenizer()
    with pytest.raises(TapeError, match="niah_single_1 at length 200: even the smallest haystack"):
        generate("niah_single_1", 200, lambda t: len(tok.encode(t)), 1)
    with pytest.raises(TapeError, match="needs an essay haystack"):
        generate("niah_single_2", 4096, lambda t: len(tok.encode(t)), 1)
    # A directory haystack is its files concatenated in name order, like RULER's essay download.
    (tmp_path / "essays").mkdir()
    (tmp_path / "essays" / "b.txt").write_text("second part.")
    (tmp_path / "essays" / "a.txt").write_text("First  part.\n")
    assert read_essay(tmp_path / "essays")[0] == ["First", "part.", "second", "part."]
