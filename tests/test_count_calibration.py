"""Per-label count biases: how they are written and read, that the engine counts as the calibration
predicts it will, and that calibration picks the biases of the best dev F1, the F1 the engine then gives."""

from __future__ import annotations

import json
from dataclasses import replace
import shutil
from pathlib import Path

import pytest
import torch

from corpora import read_corpus
from ner_service.engine import NEREngine
from ner_service.engine.count_bias import CountBias, InvalidCountBiasError, InvalidCountQuantileError, checked_quantile, quantile_digits
from padellm_ner.cli import main
from tests.conftest import TINY_DIR
from corpora.dev_halves import dev_halves
from training.count_calibration import ascend, calibrate, calibrate_quantile_on_halves, count_scores
from training.evaluate import predict, span_f1
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


def test_the_ascent_finds_each_labels_best_bias_across_a_flat_step_and_keeps_the_start_on_a_tie() -> None:
    # ORG's F1 peaks at 1.0 with a flat step at 0.5 on the way; PER's is best where it starts;
    # LOC's is flat everywhere. The labels add up, as micro-F1 nearly does.
    org = {0.0: 80.0, 0.25: 81.0, 0.5: 81.0, 0.75: 82.0, 1.0: 83.0, 1.25: 82.5, 1.5: 70.0}
    tried: list[dict[str, float]] = []

    def score(biases: dict[str, float]) -> float:
        tried.append(biases)
        return org.get(biases["ORG"], 0.0) + 90.0 - 4 * abs(biases["PER"] - 0.75) + 50.0

    chosen = ascend(["LOC", "ORG", "PER"], {"LOC": 0.0, "ORG": 0.0, "PER": 0.75}, score)
    assert chosen == {"LOC": 0.0, "ORG": 1.0, "PER": 0.75}
    assert {"LOC": 0.0, "ORG": 1.5, "PER": 0.75} in tried  # PATIENCE steps past the best before turning back
    assert all(b["ORG"] <= 1.5 for b in tried)


def test_a_start_between_the_grid_steps_is_kept_when_nothing_beats_it() -> None:
    assert ascend(["ORG"], {"ORG": 0.6}, lambda b: -abs(b["ORG"] - 0.6)) == {"ORG": 0.6}


def test_a_count_quantile_is_the_largest_count_that_probable_or_more() -> None:
    at_least = torch.tensor([[1.0, 0.9, 0.35, 0.1, 0.0], [1.0, 0.2, 0.05, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 0.6]])
    assert quantile_digits(at_least, 0.3).tolist() == [2, 0, 4]
    assert quantile_digits(at_least, 0.1).tolist() == [3, 1, 4]
    assert quantile_digits(at_least - 1e-7, 1.0).tolist() == [0, 0, 0]  # a sum that rounds under 1: still 0, never -1
    assert checked_quantile(None) is None and checked_quantile(0.25) == 0.25
    for outside in (0.0, -0.1, 1.5):
        with pytest.raises(InvalidCountQuantileError, match=r"probability in \(0, 1\]"):
            checked_quantile(outside)


@pytest.mark.parametrize(("bias", "quantile"), [(0.0, None), ({"ORG": 1.5, "MISC": 1.0}, None), (0.0, 0.2), (0.0, 0.6)])
def test_the_engine_counts_as_the_calibration_predicts(en_engine: NEREngine, data_dir: Path, bias, quantile) -> None:
    """The counts the calibration derives from one forward are the counts the engine then asks
    mentions for, under a count bias or a count quantile: the number of answers per (text, label),
    recorded before alignment (of a model that is not asked past its counts)."""
    examples = read_corpus(data_dir / "conll2003" / "dev.txt")[:16]  # one engine batch: the recorder's text indices are the batch's
    model = en_engine.ner_model
    not_past = replace(model, config=replace(model.config, answers_past_count=False))  # the same weights, asked its counts only
    engine = NEREngine(not_past, count_bias=bias, count_quantile=quantile or 0)  # 0: the count bias, whatever the model's rule
    scores = count_scores(engine, examples, progress=False)
    assert len(scores.labels) == len(engine.windows([e.text for e in examples])) * 4
    recorder = RecordingStrategy(engine.strategy("padellm"))
    engine.extract_with(engine.options(), [e.text for e in examples], strategy=recorder)
    windows = engine.windows([e.text for e in examples])
    predicted = {}
    by_quantile = scores.quantile_counts(quantile).tolist() if quantile is not None else None
    for label in engine.labels:
        rows = torch.tensor([lab == label for lab in scores.labels])
        if by_quantile is None:
            per_window = scores.counts(engine.count_bias.for_label(label), rows).tolist()
        else:
            per_window = [count for count, row in zip(by_quantile, rows.tolist()) if row]
        for window, count in zip(windows, per_window):
            predicted[window.text_index, label] = predicted.get((window.text_index, label), 0) + count
    recorded = {key: n for key, n in recorder.answers.items() if n}
    assert {key: n for key, n in predicted.items() if n} == recorded
    assert sum(recorded.values()) >= 15  # the dev sentences have entities: the comparison is not of empty counts
    assert scores.texts == [w.text_index for w in windows for _ in engine.labels]


def test_the_calibrated_f1_is_the_f1_the_engine_gives_with_the_chosen_biases(en_engine: NEREngine, data_dir: Path) -> None:
    examples = read_corpus(data_dir / "conll2003" / "dev.txt")[:20]
    engine = NEREngine(en_engine.ner_model, count_bias=-1.0, count_quantile=0)  # a bias that counts too few: the ascent has somewhere to go
    calibration = calibrate(engine, examples, batch_size=16, progress=False)
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in examples]
    for biases, expected in ((-1.0, calibration.before), (calibration.setting(), calibration.after)):
        scored = NEREngine(en_engine.ner_model, count_bias=biases, count_quantile=0)
        found = span_f1(gold, predict(scored, examples, scored.options(strategy="padellm"), batch_size=16, progress=False).entities)
        assert (found["micro_f1"], found["precision"], found["recall"]) == pytest.approx((expected["f1"], expected["precision"], expected["recall"]))
    assert calibration.after["f1"] > calibration.before["f1"]
    assert all(c.bias > -1.0 for c in calibration.labels if c.after.too_few < c.before.too_few)
    table = calibration.table()
    assert table.startswith("| label | pairs | bias (was) | F1 (was) |") and "\n| PER | " in table and f"micro-F1 {calibration.after['f1']:.2f}" in table


def test_calibrate_counts_writes_a_table_the_engine_then_uses(tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "model"
    shutil.copytree(TINY_DIR, model)
    assert main(["calibrate-counts", str(data_dir / "conll2003" / "dev.txt"), "--model", str(model), "--limit", "32", "--write"]) == 0
    done = capsys.readouterr().out
    assert "| label | pairs |" in done and f"written to {model / 'ner_model.json'}" in done
    assert "Chosen on the choose half of dev" in done and "Report half: micro-F1" in done
    written = json.loads((model / "ner_model.json").read_text())["count_bias"]
    printed = json.loads(done.split("count_bias: ", 1)[1].splitlines()[0])
    assert written == printed
    engine = NEREngine.load(model)
    assert engine.count_bias == CountBias.of(written)
    assert main(["evaluate", str(data_dir / "conll2003" / "dev.txt"), "--model", str(model), "--limit", "2", "--count-bias", "GPE=1"]) == 2
    assert "unknown label" in capsys.readouterr().err


def test_a_lower_count_quantile_asks_for_more_mentions_and_the_chosen_one_gives_the_f1_reported(en_engine: NEREngine, data_dir: Path) -> None:
    """One number for every label: a lower quantile never counts fewer; the quantile chosen on the
    choose half is the one of the best F1 there, and the engine under it gives the report half the
    F1 the calibration says."""
    dev = data_dir / "conll2003" / "dev.txt"
    examples = dev_halves(dev).choose[:12]
    scores = count_scores(en_engine, examples, progress=False)
    counts = [scores.quantile_counts(q) for q in (0.9, 0.5, 0.2, 0.05)]
    assert all(bool((low >= high).all()) for high, low in zip(counts, counts[1:]))
    assert int(counts[-1].sum()) > int(counts[0].sum())  # the model is unsure somewhere: the quantile moves counts
    found = calibrate_quantile_on_halves(en_engine, dev, batch_size=16, limit=12, progress=False, grid=(0.6, 0.3, 0.1))
    assert found.quantile == max(found.tried, key=lambda q: (found.tried[q]["f1"], q)) and set(found.tried) == {0.6, 0.3, 0.1}
    report = dev_halves(dev).report[:12]
    gold = [[(s.start, s.end, s.label) for s in e.spans] for e in report]
    for quantile, expected in ((found.quantile, found.report_after), (None, found.report_before)):
        engine = NEREngine(en_engine.ner_model, count_quantile=quantile)
        scored = span_f1(gold, predict(engine, report, engine.options(strategy="padellm"), batch_size=16, progress=False).entities)
        assert (scored["micro_f1"], scored["precision"], scored["recall"]) == pytest.approx((expected["f1"], expected["precision"], expected["recall"]))
    assert found.was == en_engine.count_quantile
    assert found.setting() == (found.quantile if found.report_after["f1"] > found.report_before["f1"] else found.was)
    assert "| count quantile | choose half micro-F1 (P / R) |" in found.table() and "Report half: micro-F1" in found.table()


def test_calibrate_counts_quantile_writes_one_number_the_engine_then_uses(tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    model = tmp_path / "model"
    shutil.copytree(TINY_DIR, model)
    assert main(["calibrate-counts", str(data_dir / "conll2003" / "dev.txt"), "--model", str(model), "--limit", "24", "--quantile", "--write"]) == 0
    done = capsys.readouterr().out
    assert "| count quantile |" in done and f"written to {model / 'ner_model.json'}" in done
    printed = json.loads(done.split("count_quantile: ", 1)[1].splitlines()[0])
    assert json.loads((model / "ner_model.json").read_text())["count_quantile"] == printed
    assert NEREngine.load(model).count_quantile == printed
    assert NEREngine.load(model, count_quantile=0).count_quantile is None  # 0: back to the count bias
    assert main(["evaluate", str(data_dir / "conll2003" / "dev.txt"), "--model", str(model), "--limit", "2", "--count-quantile", "1.5"]) == 2
    assert "probability in (0, 1]" in capsys.readouterr().err
