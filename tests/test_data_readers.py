"""Corpus readers on the real files and on broken ones."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from corpora import DataFormatError, Example, Span, check_labels, labels_of, read_conll, read_corpus, read_jsonl


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


def _entity(start: object, end: object, label: str = "DRUG") -> dict:
    return {"start": start, "end": end, "label": label}


@pytest.mark.parametrize(
    ("entities", "reason"),
    [
        ([_entity(0, 7), _entity(5, 12, "DOSE")], "entity [5, 12) DOSE 'in 40mg' overlaps entity [0, 7) DRUG 'aspirin'"),
        ([_entity(0, 12), _entity(8, 12, "DOSE")], "entity [8, 12) DOSE '40mg' overlaps entity [0, 12) DRUG 'aspirin 40mg'"),
        ([_entity(0, 7), _entity(0, 7, "DOSE")], "entity [0, 7) DRUG 'aspirin' overlaps entity [0, 7) DOSE 'aspirin'"),
        ([_entity(0, 7), _entity(0, 7)], "entity [0, 7) DRUG 'aspirin' is given twice"),
        ([_entity(7, 8)], "only whitespace"),
        ([_entity(0, 8)], "entity [0, 8) DRUG 'aspirin ': the mention starts or ends with whitespace (offsets are characters, "
                          "end exclusive: [0, 7)?)"),
        ([_entity(7, 12, "DOSE")], "starts or ends with whitespace (offsets are characters, end exclusive: [8, 12)?)"),
        ([_entity(True, 7)], "must be integers"),
        ([_entity(0, 7, " DRUG")], "starts or ends with whitespace"),
        ([_entity(0, 7, "DRUG,DOSE")], "holds a comma"),
    ],
)
def test_jsonl_entities_that_would_be_misread_name_the_line_and_spans(tmp_path: Path, entities: list, reason: str) -> None:
    path = tmp_path / "spans.jsonl"
    good = json.dumps({"text": "ibuprofen", "entities": [_entity(0, 9)]})
    path.write_text(good + "\n" + json.dumps({"text": "aspirin 40mg", "entities": entities}) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(reason)) as error:
        read_corpus(path)
    assert error.value.line == 2 and str(error.value).startswith(f"{path}:2: ")


def test_a_file_read_for_scoring_keeps_nested_entities_and_one_span_under_two_labels(tmp_path: Path) -> None:
    path = tmp_path / "nested.jsonl"
    entities = [_entity(0, 12), _entity(8, 12, "DOSE"), _entity(0, 7, "INGREDIENT"), _entity(0, 7, "BRAND")]
    path.write_text(json.dumps({"text": "aspirin 40mg", "entities": entities}) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="overlaps"):
        read_corpus(path)  # a file to train on: one mention one label, none inside another
    (example,) = read_corpus(path, nested=True)
    assert [(s.start, s.end, s.label) for s in example.spans] == [(0, 7, "BRAND"), (0, 7, "INGREDIENT"), (0, 12, "DRUG"), (8, 12, "DOSE")]
    path.write_text(json.dumps({"text": "aspirin 40mg", "entities": [_entity(0, 7), _entity(0, 7)]}) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape("entity [0, 7) DRUG 'aspirin' is given twice")):
        read_corpus(path, nested=True)


def test_adjacent_jsonl_entities_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "adjacent.jsonl"
    path.write_text(json.dumps({"text": "aspirin40mg", "entities": [_entity(7, 11, "DOSE"), _entity(0, 7)]}) + "\n", encoding="utf-8")
    (example,) = read_corpus(path)
    assert [(example.text[s.start:s.end], s.label) for s in example.spans] == [("aspirin", "DRUG"), ("40mg", "DOSE")]


@pytest.mark.parametrize("tag", ["X-PER", "B_PER", "PER", "B-", "b-PER"])
def test_a_tag_of_no_known_scheme_names_file_line_and_the_tag(tmp_path: Path, tag: str) -> None:
    path = tmp_path / "tags.txt"
    path.write_text(f"Peter B-PER\nmet O\n\nAnna {tag}\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as error:
        read_corpus(path)
    assert str(error.value).startswith(f"{path}:4: impossible tag {tag!r}: a tag is O or B-, I-, M-, E- or S- and the type")


def _examples(*labels: str) -> list:
    return [Example(f"text {i}", [Span(0, 4, label)]) for i, label in enumerate(labels)]


def test_check_labels_defaults_to_every_label_of_the_data() -> None:
    assert check_labels(None, _examples("PER", "LOC", "PER"), "train.jsonl") == ["LOC", "PER"]
    assert check_labels(["PER", "LOC"], _examples("PER", "LOC"), "train.jsonl") == ["PER", "LOC"]


def test_a_data_label_left_out_of_labels_is_an_error() -> None:
    with pytest.raises(DataFormatError) as error:
        check_labels(["PER", "LOC"], _examples("PER", "LOC", "ORG", "ORG"), "train.jsonl")
    message = str(error.value)
    assert message.startswith("train.jsonl: holds entities of label(s) ORG (2) that --labels PER,LOC leaves out")
    assert "dropped" in message and "(its labels: LOC,ORG,PER)" in message


def test_a_listed_label_absent_from_the_data_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="corpora"):
        assert check_labels(["PER", "LOC", "DATE", "TIME"], _examples("PER", "LOC"), "train.jsonl") == ["PER", "LOC", "DATE", "TIME"]
    [record] = caplog.records
    assert record.getMessage().startswith("train.jsonl: --labels PER,LOC,DATE,TIME names DATE, TIME, which never occur in the training data")


@pytest.mark.parametrize(
    ("labels", "examples", "reason"),
    [
        (None, [Example("no entities here")], "holds no entities: there is nothing to learn"),
        (["DATE"], _examples("PER"), "holds entities of label(s) PER (1) that --labels DATE leaves out"),
        (["PER"], [Example("no entities here")], "holds no entities at all: there is nothing to learn for --labels PER"),
        (["PER", "LOC", "PER"], _examples("PER", "LOC"), "--labels PER,LOC,PER names PER more than once"),
    ],
)
def test_labels_that_train_nothing_are_errors(labels: list[str] | None, examples: list, reason: str) -> None:
    with pytest.raises(DataFormatError, match=re.escape(reason)):
        check_labels(labels, examples, "train.jsonl")


def test_dev_labels_the_model_does_not_learn_are_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="corpora"):
        check_labels(None, _examples("PER"), "train.jsonl", _examples("PER", "ORG", "ORG"), "dev.jsonl")
    [record] = caplog.records
    assert record.getMessage().startswith("dev.jsonl: the dev data holds label(s) ORG that the model is not trained on")
