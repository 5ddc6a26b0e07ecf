"""Precision and recall at thresholds and the calibration error, on mentions whose rightness is known."""

from __future__ import annotations

import pytest

from training.score_calibration import ScoredMention, at_thresholds, reliability


def test_a_threshold_keeps_the_mentions_scored_at_least_it() -> None:
    mentions = [ScoredMention(0.95, True), ScoredMention(0.9, True), ScoredMention(0.6, False), ScoredMention(0.2, True),
                ScoredMention(0.1, False)]
    rows = {r["threshold"]: r for r in at_thresholds(mentions, gold_total=4, thresholds=(0.0, 0.5, 0.92))}
    assert (rows[0.0]["kept"], rows[0.0]["precision"], rows[0.0]["recall"]) == (5, 60.0, 75.0)
    assert (rows[0.5]["kept"], rows[0.5]["precision"], rows[0.5]["recall"]) == (3, pytest.approx(200 / 3), 50.0)
    assert (rows[0.92]["kept"], rows[0.92]["precision"], rows[0.92]["recall"]) == (1, 100.0, 25.0)


def test_calibration_error_is_the_gap_between_a_bins_score_and_its_share_right() -> None:
    calibrated = [ScoredMention(0.8, True)] * 8 + [ScoredMention(0.8, False)] * 2
    bins, ece = reliability(calibrated)
    assert [(b["mentions"], b["right"]) for b in bins] == [(10, 0.8)] and ece == pytest.approx(0.0)
    overconfident = [ScoredMention(1.0, True), ScoredMention(1.0, False)]
    bins, ece = reliability(overconfident)
    assert bins[-1]["to"] == 1.0 and bins[-1]["mentions"] == 2 and ece == pytest.approx(0.5)


def test_the_fitted_map_turns_overconfident_scores_into_how_often_they_are_right() -> None:
    from training.score_calibration import fit_calibration

    # raw 0.95 right half the time, raw 0.5 right a tenth of the time
    mentions = ([ScoredMention(0.95, True)] * 50 + [ScoredMention(0.95, False)] * 50
                + [ScoredMention(0.5, True)] * 10 + [ScoredMention(0.5, False)] * 90)
    calibration = fit_calibration(mentions)
    assert calibration.probability(0.95) == pytest.approx(0.5, abs=0.03)
    assert calibration.probability(0.5) == pytest.approx(0.1, abs=0.03)
    assert calibration.probability(0.3) < calibration.probability(0.5) < calibration.probability(0.95) < calibration.probability(1.0)
    _, raw_error = reliability(mentions)
    _, calibrated_error = reliability([ScoredMention(calibration.probability(m.score), m.right) for m in mentions])
    assert calibrated_error < 0.05 < raw_error


def test_scores_that_are_calibrated_already_keep_about_the_identity() -> None:
    from training.score_calibration import fit_calibration

    mentions = [ScoredMention(0.8, True)] * 80 + [ScoredMention(0.8, False)] * 20 + [ScoredMention(0.3, True)] * 30 \
        + [ScoredMention(0.3, False)] * 70
    calibration = fit_calibration(mentions)
    assert calibration.probability(0.8) == pytest.approx(0.8, abs=0.02) and calibration.probability(0.3) == pytest.approx(0.3, abs=0.02)
    assert fit_calibration([]).is_identity  # no mentions: nothing to fit


def test_the_engine_reports_the_models_calibrated_scores_with_the_same_entities(tiny_engine) -> None:
    from dataclasses import replace

    from ner_service.engine import NEREngine
    from ner_service.engine.score_calibration import ScoreCalibration

    texts = ["Peter Blackburn visited Brussels .", "EU rejects German call to boycott British lamb ."]
    raw = tiny_engine.extract(texts)
    setting = {"padellm": {"slope": 0.5, "intercept": -1.0}}
    model = replace(tiny_engine.ner_model, config=replace(tiny_engine.ner_model.config, score_calibration=setting))
    calibrated, unchanged = NEREngine(model).extract(texts), NEREngine(model, calibrated_scores=False).extract(texts)
    assert any(r.entities for r in raw)
    calibration = ScoreCalibration(0.5, -1.0)
    for before, after, same in zip(raw, calibrated, unchanged):
        assert [(e.start, e.end, e.label) for e in after.entities] == [(e.start, e.end, e.label) for e in before.entities]
        assert [e.score for e in after.entities] == pytest.approx([calibration.probability(e.score) for e in before.entities])
        assert [e.score for e in same.entities] == [e.score for e in before.entities]
    (ar,) = NEREngine(model).extract(texts[:1], strategy="ar")  # no map for ar: its raw scores
    assert [e.score for e in ar.entities] == [e.score for e in tiny_engine.extract(texts[:1], strategy="ar")[0].entities]
    with pytest.raises(ValueError, match="slope and intercept"):
        ScoreCalibration.of({"slope": 1.0, "temperature": 2.0})


def test_calibrate_scores_fits_on_the_choosing_half_and_writes_the_map(tiny_engine, data_dir, tmp_path, capsys) -> None:
    import json
    import shutil

    from padellm_ner.cli import main

    folder = tmp_path / "tiny"
    shutil.copytree(tiny_engine.ner_model.path, folder)
    dev = tmp_path / "dev.txt"
    lines = (data_dir / "conll2003" / "dev.txt").read_text(encoding="utf-8").split("\n\n")
    dev.write_text("\n\n".join(lines[:60]) + "\n", encoding="utf-8")
    assert main(["calibrate-scores", str(dev), "--model", str(folder), "--strategies", "padellm,ar", "--limit", "12", "--write"]) == 0
    printed = capsys.readouterr().out
    assert "| padellm |" in printed and "| ar |" in printed and "ECE report" in printed
    written = json.loads((folder / "ner_model.json").read_text(encoding="utf-8"))["score_calibration"]
    assert set(written) == {"padellm", "ar"} and all(set(v) == {"slope", "intercept"} for v in written.values())


def test_a_map_that_makes_the_other_half_worse_is_not_kept() -> None:
    """Overconfident scores on the choosing half, honest ones on the reporting half: the map that
    fixes the first would spoil the second, so the raw scores stay; where both halves are alike it is kept."""
    from training.score_calibration import ScoredMention, fit_where_it_carries

    def mentions(score: float, right_share: float, n: int = 200) -> list[ScoredMention]:
        return [ScoredMention(score, i < right_share * n) for i in range(n)]

    overconfident = mentions(0.95, 0.6) + mentions(0.6, 0.3)
    honest = mentions(0.95, 0.95) + mentions(0.6, 0.6)
    calibration, ece, not_carried = fit_where_it_carries(overconfident, honest)
    assert calibration.is_identity and not_carried is not None
    fitted, worse = not_carried
    assert not fitted.is_identity and worse > ece["report"][0] and ece["report"][0] == ece["report"][1]
    calibration, ece, not_carried = fit_where_it_carries(overconfident, list(reversed(overconfident)))
    assert not calibration.is_identity and not_carried is None and ece["report"][1] < ece["report"][0]

