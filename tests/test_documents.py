"""A paragraph or a document is tagged as its sentences are one by one: a model trained on
single sentences (en-conll03) reads each sentence as a window of its own."""

from __future__ import annotations

from pathlib import Path

from corpora import read_conll_documents, read_corpus


def test_a_conll_document_finds_what_its_sentences_find_alone(en_engine, data_dir: Path) -> None:
    assert en_engine.ner_model.config.sentence_windows
    document = read_conll_documents(data_dir / "conll2003" / "dev.txt")[1]  # 15 lines of county cricket scores
    lines = document.text.split("\n")
    alone = en_engine.extract(lines)
    offsets = [sum(len(line) + 1 for line in lines[:i]) for i in range(len(lines))]
    expected = {(e.start + offset, e.end + offset, e.label) for offset, result in zip(offsets, alone) for e in result.entities}
    (whole,) = en_engine.extract([document.text])
    found = {(e.start, e.end, e.label) for e in whole.entities}
    # a line that holds two sentences ("Somerset 4 . Chester-le-Street : ...") is read as two windows
    assert len(expected) > 40 and len(found & expected) >= 0.9 * len(expected) and len(found) <= 1.1 * len(expected)


def test_a_paragraph_of_full_sentences_counts_every_sentences_mentions(en_engine, data_dir: Path) -> None:
    sentences = [e.text for e in read_corpus(data_dir / "conll2003" / "dev.txt")[:40] if e.text.rstrip().endswith(".") and len(e.spans) >= 2][:5]
    paragraph = " ".join(sentences)
    (whole,) = en_engine.extract([paragraph])
    alone = sum(len(r.entities) for r in en_engine.extract(sentences))
    assert len(sentences) == 5 and len(whole.entities) == alone
