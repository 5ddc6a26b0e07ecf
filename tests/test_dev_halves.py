"""The dev file's two fixed halves: settings are chosen on one and reported on the other."""

from __future__ import annotations

import json
from pathlib import Path

from corpora import column_documents, read_conll, read_corpus
from corpora.dev_halves import BLOCK, dev_halves
from training.count_calibration import Calibration, HalvesCalibration, LabelCalibration, CountErrors


def test_conll_dev_splits_by_document_into_halves_that_share_no_sentence(data_dir: Path) -> None:
    path = data_dir / "conll2003" / "dev.txt"
    halves, sentences = dev_halves(path), read_conll(path)
    documents = column_documents(path).documents
    assert len(halves.choose) + len(halves.report) == len(sentences)
    first_of_second = sum(len(d.sentence_lines) for d in documents[:1])
    assert halves.report[0] == sentences[first_of_second]  # the 2nd document opens the report half
    assert abs(len(halves.choose) - len(halves.report)) < 0.2 * len(sentences)
    assert dev_halves(path) == halves  # fixed: the same halves every time


def test_a_file_without_documents_alternates_blocks_and_a_small_one_alternates_texts(data_dir: Path, tmp_path: Path) -> None:
    resume = read_corpus(data_dir / "resume" / "dev.txt")
    halves = dev_halves(data_dir / "resume" / "dev.txt")
    assert halves.choose[:BLOCK] == resume[:BLOCK] and halves.report[:BLOCK] == resume[BLOCK:2 * BLOCK]
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"text {i}"}) + "\n" for i in range(5)), encoding="utf-8")
    texts = [e.text for e in dev_halves(small).report]
    assert texts == ["text 1", "text 3"]


def test_a_bias_that_lowers_the_report_half_is_not_kept() -> None:
    errors = CountErrors(0, 0, 1, 1)
    chosen = Calibration([LabelCalibration("ORG", 1.5, 0.25, errors, errors, 80.0, 82.0)], {"f1": 80.0, "precision": 80.0, "recall": 80.0},
                         {"f1": 82.0, "precision": 80.0, "recall": 84.0})
    worse = HalvesCalibration(chosen, {"f1": 90.0, "precision": 91.0, "recall": 89.0}, {"f1": 89.5, "precision": 88.0, "recall": 91.0})
    better = HalvesCalibration(chosen, {"f1": 90.0, "precision": 91.0, "recall": 89.0}, {"f1": 90.5, "precision": 90.0, "recall": 91.0})
    assert worse.biases == {"ORG": 0.25} and "not kept" in worse.table()
    assert better.biases == {"ORG": 1.5} and better.setting() == 1.5
