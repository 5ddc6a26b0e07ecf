"""A paragraph or a document is read as its sentences are one by one: a model trained on single
sentences (en-conll03) reads each sentence as a window of its own. (What the engine then does
across a document's windows, ``document_consistency``, is tested in test_document_consistency.py:
these tests read the windows without it.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from corpora import read_conll_documents, read_corpus
from ner_service.engine import NEREngine
from ner_service.engine.chunking import chunk_spans
from training.document_windows import document_windows


@pytest.fixture(scope="module")
def window_engine(en_engine) -> NEREngine:
    """The shipped English model's engine, each window's entities as they were found."""
    return NEREngine(en_engine.ner_model, document_consistency=False)


def test_a_conll_document_finds_what_its_sentences_find_alone(window_engine: NEREngine, data_dir: Path) -> None:
    assert window_engine.ner_model.config.sentence_windows
    document = read_conll_documents(data_dir / "conll2003" / "dev.txt")[1]  # 15 lines of county cricket scores
    lines = document.text.split("\n")
    alone = window_engine.extract(lines)
    offsets = [sum(len(line) + 1 for line in lines[:i]) for i in range(len(lines))]
    expected = {(e.start + offset, e.end + offset, e.label) for offset, result in zip(offsets, alone) for e in result.entities}
    (whole,) = window_engine.extract([document.text])
    found = {(e.start, e.end, e.label) for e in whole.entities}
    # a line that holds two sentences ("Somerset 4 . Chester-le-Street : ...") is read as two windows
    assert len(expected) > 40 and len(found & expected) >= 0.9 * len(expected) and len(found) <= 1.1 * len(expected)


def test_a_paragraph_of_full_sentences_counts_every_sentences_mentions(window_engine: NEREngine, data_dir: Path) -> None:
    sentences = [e.text for e in read_corpus(data_dir / "conll2003" / "dev.txt")[:40] if e.text.rstrip().endswith(".") and len(e.spans) >= 2][:5]
    paragraph = " ".join(sentences)
    (whole,) = window_engine.extract([paragraph])
    alone = sum(len(r.entities) for r in window_engine.extract(sentences))
    assert len(sentences) == 5 and len(whole.entities) == alone


CONLL_DOCUMENTS = """-DOCSTART- -X- -X- O

SOCCER NN B-NP O
- : O O
JAPAN NNP B-NP B-LOC
WIN VB B-VP O

Nadim NNP B-NP B-PER
Ladki NNP I-NP I-PER

Japan NNP B-NP B-LOC
beat VB B-VP O
Syria NNP B-NP B-LOC
in IN B-PP O
Al-Ain NNP B-NP B-LOC
. . O O

-DOCSTART- -X- -X- O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
spoke VB B-VP O
. . O O
"""


def test_document_windows_are_the_engines_windows_that_are_no_sentence(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text(CONLL_DOCUMENTS, encoding="utf-8")
    words = lambda piece: len(piece.split())  # noqa: E731
    windows = document_windows(path, words, window_tokens=6, limit=100, seed=0)
    document = read_conll_documents(path, " ")[0]
    engine_windows = {document.text[s:e] for s, e in chunk_spans(document.text, words, 6, one_sentence=True)}
    sentences = {e.text for e in read_corpus(path)}
    assert windows and all(w.text in engine_windows and w.text not in sentences for w in windows)
    # no full stop ends the headline: it runs into the byline, and the window is cut after 6 words,
    # before the sentence that follows, which is a training sentence already
    assert [(w.text, [(w.text[s.start:s.end], s.label) for s in w.spans]) for w in windows] == [
        ("SOCCER - JAPAN WIN Nadim Ladki", [("JAPAN", "LOC"), ("Nadim Ladki", "PER")])]
    assert document_windows(path, words, 4, limit=100, seed=0)[0].text != windows[0].text  # cut to the budget
    assert len(document_windows(path, words, 4, limit=1, seed=0)) == 1


def test_document_windows_need_documents(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text(CONLL_DOCUMENTS.replace("-DOCSTART- -X- -X- O\n\n", ""), encoding="utf-8")
    with pytest.raises(ValueError, match="-DOCSTART-"):
        document_windows(path, len, 6, 10, 0)
