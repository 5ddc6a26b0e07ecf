"""Per-label count biases: how they are written and read, that the engine counts as the calibration
predicts it will, and that calibration picks the bias that brings counts closest to gold."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from corpora import read_corpus
from ner_service.engine import NEREngine
from ner_service.engine.count_bias import CountBias, InvalidCountBiasError
from ner_service.engine.ner_model import SHIPPED_DIR
from training.count_calibration import CountScores, calibrate, count_scores
from training.error_analysis import RecordingStrategy

LABELS = ["LOC", "MISC", "ORG", "PER"]


def test_a_count_bias_is_one_number_or_a_table_and_a_command_line_overrides_some_labels() -> None:
    assert CountBias.of(0.5).for_label("ORG") == 0.5
    table = CountBias.of({"ORG": 1.0, "MISC": 0.75})
    assert (table.for_label("ORG"), table.for_label("MISC"), table.for_label("PER")) == (1.0, 0.75, 0.0)
    assert CountBias.of(0.5).overridden("ORG=1.25", LABELS).setting(LABELS) == {"LOC": 0.5, "MISC": 0.5, "ORG": 1.25, "PER": 0.5}
    assert CountBias.of({"ORG": 1.0}).overridden("0.25", LABELS).setting(LABELS) == 0.25
    assert CountBias.of({label: 0.5 for label in LABELS}).setting(LABELS) == 0.5  # the same everywhere: one number
    with pytest.raises(InvalidCountBiasError, match="unknown label.*'ORGG'.*LOC, MISC, ORG, PER"):
        CountBias.of(0.5).overridden("ORGG=1", LABELS)
    with pytest.raises(InvalidCountBiasError, match="LABEL=NUMBER"):
        CountBias.of(0.5).overridden("ORG=lots", LABELS)
    with pytest.raises(InvalidCountBiasError, match="'GPE'"):
        CountBias.of({"GPE": 1.0}).checked(LABELS)
    for broken in ("lots", {"ORG": "lots"}, {"ORG": None}, True):  # what a hand-edited ner_model.json may hold
        with pytest.raises(InvalidCountBiasError, match="a count bias is a number"):
            CountBias.of(broken)


def test_calibration_raises_the_bias_of_a_label_that_counts_too_few_and_leaves_a_right_one() -> None:
    # Two labels, 40 pairs each, gold count 2. ORG's model prefers 1 by 0.4 nats; PER's prefers 2.
    digits = torch.full((80, 10), -20.0)
    digits[:40, 1], digits[:40, 2] = -0.5, -0.9
    digits[40:, 2], digits[40:, 1] = -0.3, -1.5
    scores = CountScores(digits, torch.full((80,), -5.0), torch.full((80,), 2), ["ORG"] * 40 + ["PER"] * 40)
    org, per = calibrate(scores, CountBias(0.0), ["ORG", "PER"])
    assert org.before.too_few == 40 and org.after.total == 0 and org.bias > 0.4  # the smallest grid bias above the margin
    assert org.bias == 0.5
    assert per.bias == 0.0 and per.after.total == per.before.total == 0


@pytest.mark.parametrize("bias", [0.0, {"ORG": 1.5, "MISC": 1.0}])
def test_the_engine_counts_as_the_calibration_predicts(en_engine: NEREngine, data_dir: Path, bias) -> None:
    """The counts the calibration derives from one forward are the counts the engine then asks
    mentions for: the number of answers per (text, label), recorded before alignment."""
    examples = read_corpus(data_dir / "conll2003" / "dev.txt")[:16]  # one engine batch: the recorder's text indices are the batch's
    engine = NEREngine(en_engine.ner_model, count_bias=bias)
    scores = count_scores(engine, examples, progress=False)
    assert len(scores.labels) == len(engine.windows([e.text for e in examples])) * 4
    recorder = RecordingStrategy(engine.strategy("padellm"))
    engine.extract_with(engine.options(), [e.text for e in examples], strategy=recorder)
    windows = engine.windows([e.text for e in examples])
    predicted = {}
    for label in engine.labels:
        rows = torch.tensor([lab == label for lab in scores.labels])
        per_window = scores.counts(engine.count_bias.for_label(label), rows).tolist()
        for window, count in zip(windows, per_window):
            predicted[window.text_index, label] = predicted.get((window.text_index, label), 0) + count
    recorded = {key: n for key, n in recorder.answers.items() if n}
    assert {key: n for key, n in predicted.items() if n} == recorded
    assert sum(recorded.values()) >= 15  # the dev sentences have entities: the comparison is not of empty counts


def test_calibrate_counts_writes_a_table_the_engine_then_uses(tmp_path: Path, data_dir: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(SHIPPED_DIR / "tiny-conll03", model)
    done = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "calibrate-counts", str(data_dir / "conll2003" / "dev.txt"),
                           "--model", str(model), "--limit", "32", "--write"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| label | pairs |" in done.stdout and f"written to {model / 'ner_model.json'}" in done.stdout
    written = json.loads((model / "ner_model.json").read_text())["count_bias"]
    printed = json.loads(done.stdout.split("count_bias: ", 1)[1].splitlines()[0])
    assert written == printed
    engine = NEREngine.load(model)
    assert engine.count_bias == CountBias.of(written)
    bad = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "evaluate", str(data_dir / "conll2003" / "dev.txt"),
                          "--model", str(model), "--limit", "2", "--count-bias", "GPE=1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "unknown label" in bad.stderr and "Traceback" not in bad.stderr
