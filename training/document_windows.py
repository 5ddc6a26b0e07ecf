"""Training texts cut from documents as the engine cuts them: windows that are no single sentence.

A model trained on sentences alone reads a document worse than the same sentences sent one by one
(CoNLL-03 dev documents joined by spaces: 85.36 against 90.74): where the sentence splitter finds
no boundary (headlines, datelines, tables of results without full stops), a window holds parts of
several sentences, which the model never saw in training. These windows, with the entities that
lie wholly inside them, are training texts of that shape.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from corpora import Example, Span, column_documents, read_conll_documents, read_corpus
from ner_service.engine.chunking import chunk_spans


def document_windows(path: str | Path, count_tokens: Callable[[str], int], window_tokens: int, limit: int, seed: int) -> list[Example]:
    """Up to ``limit`` windows (chosen at random by ``seed``) of the ``-DOCSTART-`` documents of the
    column file ``path``, their sentences joined by spaces and cut into windows of at most
    ``window_tokens`` tokens one sentence at a time (as a model with ``sentence_windows`` reads
    them), that are not one of the file's sentences; an entity a window cuts through is left out."""
    if not column_documents(path).has_docstart:
        raise ValueError(f"{path}: document windows need a column file whose documents start with -DOCSTART- lines")
    sentences = {example.text for example in read_corpus(path)}
    windows = []
    for document in read_conll_documents(path, " "):
        for start, end in chunk_spans(document.text, count_tokens, window_tokens, one_sentence=True):
            text = document.text[start:end]
            if text not in sentences:
                windows.append(Example(text, [Span(s.start - start, s.end - start, s.label)
                                              for s in document.spans if start <= s.start and s.end <= end]))
    random.Random(seed).shuffle(windows)
    return windows[:limit]
