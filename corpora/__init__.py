"""NER corpora as :class:`Example` objects with character-offset spans: CoNLL-style column files
(IOB1, BIO, BMES; Weibo's char+position tokens) and JSONL. Below both ``training`` and
``pipeline``, and free of the service: any of them reads a corpus the same way."""

from corpora.readers import DOCSTART, ColumnDocument, ColumnDocuments, DataFormatError, Example, Span, check_labels, column_documents, json_records, labels_of, read_conll, read_conll_documents, read_corpus, read_jsonl, read_sources, text_of

__all__ = ["DOCSTART", "ColumnDocument", "ColumnDocuments", "DataFormatError", "Example", "Span", "check_labels", "column_documents", "json_records", "labels_of", "read_conll", "read_conll_documents", "read_corpus", "read_jsonl", "read_sources", "text_of"]
