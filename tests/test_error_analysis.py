"""PaDeLLM's error breakdown: hand-built cases for each cause, and on real dev sentences with the
shipped model, every missed and false entity of the F1 score put down to exactly one cause."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corpora import Span, read_corpus
from ner_service.engine import NEREngine
from training.error_analysis import CAUSES, ErrorBreakdown, padellm_errors
from training.evaluate import evaluate_engine

PER = "PER"


def test_a_count_too_low_loses_its_entities_first() -> None:
    errors = ErrorBreakdown()
    gold = {Span(0, 5, PER), Span(10, 15, PER), Span(20, 25, PER)}
    errors.add(PER, gold, {Span(0, 5, PER)}, set(), set(), count=1)
    assert errors.missed["count", PER] == 2 and sum(errors.missed.values()) == 2
    assert errors.counts["low", PER] == 1


def test_boundary_label_and_mention_misses() -> None:
    errors = ErrorBreakdown()
    gold = {Span(0, 5, PER), Span(10, 15, PER), Span(20, 25, PER)}
    predicted = {Span(0, 3, PER), Span(30, 35, PER), Span(40, 44, PER)}  # a cut span, a span that is no entity, an ORG
    other_predicted = {Span(10, 15, "ORG")}  # the second gold span came out under another label
    other_gold = {Span(40, 44, "ORG")}
    errors.add(PER, gold, predicted, other_predicted, other_gold, count=3)
    assert errors.missed["boundary", PER] == 1
    assert errors.missed["label", PER] == 1
    assert errors.missed["mention", PER] == 1
    assert errors.false["boundary", PER] == 1
    assert errors.false["count", PER] == 0  # the count was right: the false spans are the mentions' fault
    assert errors.false["label", PER] == 1
    assert errors.false["mention", PER] == 1
    assert errors.counts["right", PER] == 1


def test_a_count_too_high_explains_its_false_entities() -> None:
    errors = ErrorBreakdown()
    errors.add(PER, {Span(0, 5, PER)}, {Span(0, 5, PER), Span(7, 9, PER)}, set(), set(), count=2)
    assert errors.false["count", PER] == 1 and errors.counts["high", PER] == 1
    assert "| count | 0 | 1 |" in errors.table()


@pytest.mark.slow
def test_every_error_of_the_score_has_one_cause(en_engine: NEREngine, data_dir: Path) -> None:
    examples = read_corpus(data_dir / "conll2003" / "dev.txt")[:16]
    options = en_engine.options(strategy="padellm")
    breakdown = padellm_errors(en_engine, examples, options, batch_size=16, progress=False)
    scores = evaluate_engine(en_engine, examples, strategy="padellm", batch_size=16, progress=False)
    labels = sorted(scores["per_label"])
    assert sum(breakdown.missed.values()) == sum(scores["per_label"][label]["fn"] for label in labels) > 0
    assert sum(breakdown.false.values()) == sum(scores["per_label"][label]["fp"] for label in labels)
    assert sum(breakdown.counts.values()) == len(examples) * len(en_engine.labels)
    assert sum(breakdown.gold.values()) == sum(len(e.spans) for e in examples)
    assert set(cause for cause, _ in breakdown.missed) <= set(CAUSES)


def test_evaluate_errors_puts_every_error_of_the_report_down_once(tmp_path: Path) -> None:
    corpus = tmp_path / "dev.jsonl"
    lines = [{"text": "Peter met Anna in Paris", "entities": [{"start": 0, "end": 5, "label": "PER"}, {"start": 10, "end": 14, "label": "PER"},
                                                       {"start": 18, "end": 23, "label": "LOC"}]},
             {"text": "EU rejects German call", "entities": [{"start": 0, "end": 2, "label": "ORG"}, {"start": 11, "end": 17, "label": "MISC"}]}]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "evaluate", str(corpus), "--model", "tiny-conll03", "--errors", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    errors = report["errors"]
    assert sum(errors["gold"].values()) == 5
    for kind, score in (("missed", "fn"), ("false", "fp")):
        put_down = sum(n for by_label in errors[kind].values() for n in by_label.values())
        assert put_down == sum(s[score] for s in report["per_label"].values())
    assert sum(n for by_label in errors["counts"].values() for n in by_label.values()) == 2 * 4
