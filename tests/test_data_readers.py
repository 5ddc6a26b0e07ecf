"""Corpus readers on the real files and on broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corpora import DataFormatError, labels_of, read_conll, read_corpus, read_jsonl


@pytest.mark.parametrize(
    ("name", "sentences", "mentions"),
    [
        ("conll2003/train.txt", 14041, 23499),
        ("conll2003/dev.txt", 3250, 5942),
        ("resume/dev.txt", 463, 1497),
        ("weibo/train.txt", 1350, 1895),
        ("weibo/dev.txt", 270, 389),
    ],
)
def test_real_corpora_match_published_counts(data_dir: Path, name: str, sentences: int, mentions: int) -> None:
    examples = read_conll(data_dir / name)
    assert len(examples) == sentences
    assert sum(len(e.spans) for e in examples) == mentions


def test_conll_iob1_spans_are_character_offsets(data_dir: Path) -> None:
    first = read_conll(data_dir / "conll2003/train.txt")[0]
    assert first.text.startswith("EU rejects German call")
    assert [(first.text[s.start:s.end], s.label) for s in first.spans] == [("EU", "ORG"), ("German", "MISC"), ("British", "MISC")]


def test_weibo_tokens_lose_their_position_digits(data_dir: Path) -> None:
    examples = read_conll(data_dir / "weibo/dev.txt")
    assert not any(ch.isdigit() for ch in examples[0].text[:5])
    assert " " not in examples[0].text
    assert labels_of(examples) == ["GPE.NAM", "GPE.NOM", "LOC.NAM", "LOC.NOM", "ORG.NAM", "ORG.NOM", "PER.NAM", "PER.NOM"]


def test_bmes_single_and_multi_character_entities(tmp_path: Path) -> None:
    path = tmp_path / "bmes.txt"
    path.write_text("高 B-NAME\n勇 E-NAME\n， O\n男 S-RACE\n\n", encoding="utf-8")
    (example,) = read_conll(path)
    assert example.text == "高勇，男"
    assert [(example.text[s.start:s.end], s.label) for s in example.spans] == [("高勇", "NAME"), ("男", "RACE")]


def test_iob1_b_tag_splits_adjacent_entities(tmp_path: Path) -> None:
    path = tmp_path / "iob1.txt"
    path.write_text("-DOCSTART- -X- O O\n\nA NNP I-NP I-LOC\nB NNP I-NP B-LOC\nC NNP I-NP I-LOC\nd x x O\n\n")
    (example,) = read_conll(path)
    assert [(example.text[s.start:s.end], s.label) for s in example.spans] == [("A", "LOC"), ("B C", "LOC")]


@pytest.mark.parametrize(
    ("content", "line", "reason"),
    [
        (b"EU NNP I-NP I-ORG\nrejects VBZ I-VP\n", 2, "columns"),
        (b"EU NNP I-NP X-ORG\n", 1, "impossible tag"),
        (b"EU NNP I-NP I-ORG\n\xff\xfe x x O\n", 2, "UTF-8"),
        (b"", None, "empty"),
        (b"EU\n", 1, "token and a tag"),
    ],
)
def test_malformed_column_files_name_file_line_and_reason(tmp_path: Path, content: bytes, line: int | None, reason: str) -> None:
    path = tmp_path / "broken.txt"
    path.write_bytes(content)
    with pytest.raises(DataFormatError) as error:
        read_corpus(path)
    assert error.value.line == line
    assert reason in error.value.reason
    assert str(path) in str(error.value)


def test_scheme_mismatch_is_an_impossible_tag(tmp_path: Path) -> None:
    path = tmp_path / "bio.txt"
    path.write_text("a M-PER\n\n")
    with pytest.raises(DataFormatError, match="impossible tag 'M-PER' for scheme bio"):
        read_conll(path, scheme="bio")


def test_jsonl_reader_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"text": "Paris is nice", "entities": [{"start": 0, "end": 5, "label": "LOC"}]}) + "\n\n", encoding="utf-8")
    (example,) = read_jsonl(good)
    assert example.mentions("LOC") == ["Paris"]
    for body, reason in [
        ('{"text": "a"}\n{broken\n', "broken JSON"),
        ('{"text": "abc", "entities": [{"start": 2, "end": 9, "label": "X"}]}\n', "outside the text"),
        ('{"entities": []}\n', '"text"'),
        ('{"text": "abc", "entities": [{"start": 0}]}\n', "needs"),
    ]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(body, encoding="utf-8")
        with pytest.raises(DataFormatError, match=reason) as error:
            read_corpus(bad)
        assert error.value.line is not None
