"""Sentence splitting, the one way every part of tape splits text into sentences: NLTK's English Punkt model
(`nltk.sent_tokenize`, what the SCROLLS metric and RULER use) when it is installed (`python -m nltk.downloader
punkt_tab`), otherwise NLTK's untrained `PunktSentenceTokenizer` (the same algorithm without learned abbreviations).
Callers record the name of the splitter that ran (settings.json, results.json)."""

from __future__ import annotations

from collections.abc import Callable


def sentence_splitter() -> tuple[str, Callable[[str], list[str]]]:
    """(name, function) of the sentence splitter in use (see the module docstring)."""
    import nltk
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        return "nltk PunktSentenceTokenizer (untrained; punkt_tab not installed)", PunktSentenceTokenizer().tokenize
    return "nltk.sent_tokenize (punkt_tab english)", nltk.sent_tokenize
