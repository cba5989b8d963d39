"""Shared fixtures: every test runs offline with a private Hugging Face cache; `tiny_corpus` is a few KB of text."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def hf_offline(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the network or the user's HF cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    # Both libraries read the offline flag once, at import; if an earlier test imported them, flip it there too.
    if "huggingface_hub" in sys.modules:
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    if "datasets" in sys.modules:
        monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)


_WORDS = ("the model reads a long sequence of tokens and learns where each one sits relative to the others "
          "position encoding rotary attention bias layer head train evaluate value query key small large fast "
          "slowly quickly river mountain city garden window paper number letter question answer").split()


@pytest.fixture
def tiny_corpus(tmp_path: Path) -> Path:
    """A directory of 8 `.txt` documents (~6 KB): sentences, digits, tabs, double spaces, blank lines, unicode."""
    rng = random.Random(0)
    root = tmp_path / "corpus"
    root.mkdir()
    for d in range(8):
        paragraphs = []
        for _ in range(rng.randint(3, 6)):
            sentences = []
            for _ in range(rng.randint(2, 5)):
                words = rng.choices(_WORDS, k=rng.randint(4, 12))
                end = rng.choice([".", "!", "?", f" {rng.randint(0, 9999)}."])
                sentences.append(" ".join(words).capitalize() + end)
            paragraphs.append(" ".join(sentences))
        extras = "\tTabbed  line with  double spaces.\nCafé naïve — 東京 🙂\n"
        (root / f"doc{d:02d}.txt").write_text("\n\n".join(paragraphs) + "\n" + extras, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread for a whole module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny models
    run fastest so on a shared machine, and compute what subprocesses started with OMP_NUM_THREADS=1 compute."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
