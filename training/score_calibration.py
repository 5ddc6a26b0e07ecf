"""How far a mention's score can be trusted as the probability that it is right, measured on a
dev set: precision and recall at thresholds, a reliability table and the expected calibration
error (ECE).

A score is the probability the model gave its answer (PaDeLLM: the mention's path, its label's
count included; AR: its line's); a mention is right when its exact ``(start, end, label)`` is
gold. A threshold drops the mentions scored below it (``Extraction.above``), so the table below
says what a user who sets it keeps and loses. :func:`calibrate_on_halves` fits the map from raw
scores to probabilities (:mod:`ner_service.engine.score_calibration`) on dev's choosing half and
measures it on the reporting half; a map that makes the reporting half's ECE worse is not kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from corpora import Example
from corpora.dev_halves import dev_halves
from ner_service.engine import ExtractOptions, NEREngine
from ner_service.engine.score_calibration import ScoreCalibration, logit, sigmoid

#: The thresholds every card reports.
CARD_THRESHOLDS = (0.0, 0.3, 0.5, 0.7)


@dataclass(frozen=True)
class ScoredMention:
    score: float
    right: bool


def scored_mentions(engine: NEREngine, examples: Sequence[Example], options: ExtractOptions,
                    batch_size: int = 16, description: str = "score") -> tuple[list[ScoredMention], int]:
    """Every predicted mention of ``examples`` with its score and whether it is gold, and how many
    gold mentions of the asked labels there are (a progress bar on stderr)."""
    labels = set(options.labels or ())
    mentions: list[ScoredMention] = []
    gold_total = 0
    with tqdm(total=len(examples), desc=description, unit="text") as bar:
        for start in range(0, len(examples), batch_size):
            batch = examples[start:start + batch_size]
            for example, result in zip(batch, engine.extract_with(options, [e.text for e in batch])):
                gold = {(s.start, s.end, s.label) for s in example.spans if s.label in labels}
                gold_total += len(gold)
                mentions.extend(ScoredMention(e.score, (e.start, e.end, e.label) in gold) for e in result.entities)
            bar.update(len(batch))
    return mentions, gold_total


def at_thresholds(mentions: Sequence[ScoredMention], gold_total: int,
                  thresholds: Iterable[float] = CARD_THRESHOLDS) -> list[dict[str, float]]:
    """Precision, recall and F1 (in %) of the mentions scored at least each threshold."""
    rows = []
    for threshold in thresholds:
        kept = [m for m in mentions if m.score >= threshold]
        right = sum(m.right for m in kept)
        precision = 100 * right / len(kept) if kept else 0.0
        recall = 100 * right / gold_total if gold_total else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append({"threshold": threshold, "precision": precision, "recall": recall, "f1": f1, "kept": len(kept)})
    return rows


def reliability(mentions: Sequence[ScoredMention], bins: Sequence[float] = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)
                ) -> tuple[list[dict[str, float]], float]:
    """The mentions binned by score (``bins`` are the edges; a bin holds ``lo <= score < hi``, the
    last one ``score == 1`` too): per bin how many, their mean score and how many are right; and
    the expected calibration error, the mean over mentions of |mean score - share right| of their
    bin (0: a score of 0.8 is right 8 times in 10)."""
    rows, weighted_gap = [], 0.0
    for number, (lo, hi) in enumerate(zip(bins, bins[1:])):
        last = number == len(bins) - 2
        inside = [m for m in mentions if lo <= m.score < hi or (last and m.score == hi)]
        if not inside:
            continue
        mean_score = sum(m.score for m in inside) / len(inside)
        accuracy = sum(m.right for m in inside) / len(inside)
        rows.append({"from": lo, "to": hi, "mentions": len(inside), "mean_score": mean_score, "right": accuracy})
        weighted_gap += len(inside) * abs(mean_score - accuracy)
    return rows, (weighted_gap / len(mentions) if mentions else 0.0)


#: How strongly the fit is held to the identity (an L2 penalty on slope - 1 and intercept, per mention).
PRIOR_WEIGHT = 1.0


def fit_calibration(mentions: Sequence[ScoredMention], steps: int = 100) -> ScoreCalibration:
    """The Platt map that best predicts which ``mentions`` are right (logistic regression on the
    logit of the raw score: Newton steps, halved until the loss falls; held to the identity by
    :data:`PRIOR_WEIGHT`, so that a handful of mentions cannot make it extreme)."""
    xs = [logit(m.score) for m in mentions]
    ys = [1.0 if m.right else 0.0 for m in mentions]

    def loss(slope: float, intercept: float) -> float:
        total = PRIOR_WEIGHT / 2 * ((slope - 1.0) ** 2 + intercept ** 2)
        for x, y in zip(xs, ys):
            z = slope * x + intercept  # log(1 + e^z) - y z, computed stably
            total += (z if z > 0 else 0.0) + math.log1p(math.exp(-abs(z))) - y * z
        return total

    slope, intercept = 1.0, 0.0
    current = loss(slope, intercept)
    for _ in range(steps):
        g_slope, g_intercept = PRIOR_WEIGHT * (slope - 1.0), PRIOR_WEIGHT * intercept
        h_ss, h_si, h_ii = PRIOR_WEIGHT, 0.0, PRIOR_WEIGHT
        for x, y in zip(xs, ys):
            p = sigmoid(slope * x + intercept)
            w = p * (1 - p)
            g_slope, g_intercept = g_slope + (p - y) * x, g_intercept + p - y
            h_ss, h_si, h_ii = h_ss + w * x * x, h_si + w * x, h_ii + w
        det = h_ss * h_ii - h_si * h_si
        d_slope, d_intercept = (h_ii * g_slope - h_si * g_intercept) / det, (h_ss * g_intercept - h_si * g_slope) / det
        step = 1.0
        while step > 1e-6 and loss(slope - step * d_slope, intercept - step * d_intercept) > current:
            step /= 2
        if step <= 1e-6:
            break
        slope, intercept = slope - step * d_slope, intercept - step * d_intercept
        previous, current = current, loss(slope, intercept)
        if previous - current < 1e-10 * max(1.0, abs(current)):
            break
    return ScoreCalibration(round(slope, 6), round(intercept, 6))


def calibrated_mentions(mentions: Sequence[ScoredMention], calibration: ScoreCalibration) -> list[ScoredMention]:
    return [replace(m, score=calibration.probability(m.score)) for m in mentions]


@dataclass(frozen=True)
class StrategyCalibration:
    """One strategy's fitted map and the expected calibration error on each half, before and after it."""

    strategy: str
    calibration: ScoreCalibration
    ece: dict[str, tuple[float, float]]  # half -> (raw, calibrated)
    report_thresholds: list[dict[str, float]]  # precision and recall at the card's thresholds, reporting half, calibrated
    #: The map fitted on the choosing half where it made the reporting half's ECE worse (then not
    #: kept: ``calibration`` is the identity, the raw scores stay); None where it carried.
    not_carried: tuple[ScoreCalibration, float] | None = None  # the fitted map, and the reporting half's ECE under it


def calibrate_on_halves(engine: NEREngine, path: str | Path, strategies: Sequence[str], batch_size: int = 16,
                        limit: int | None = None) -> list[StrategyCalibration]:
    """Fit each strategy's map on the raw scores of dev's choosing half (its first ``limit``
    texts), and measure it on both halves. ``engine`` must give raw scores (``calibrated_scores=False``)."""
    halves = dev_halves(path)
    found = []
    for strategy in strategies:
        options = engine.options(None, strategy, None)
        scored = {half: scored_mentions(engine, examples[:limit], options, batch_size, f"{strategy} {half} half")
                  for half, examples in (("choose", halves.choose), ("report", halves.report))}
        found.append(measured_calibration(strategy, scored["choose"][0], *scored["report"]))
    return found


def measured_calibration(strategy: str, choose: Sequence[ScoredMention], report: Sequence[ScoredMention],
                         report_gold: int) -> StrategyCalibration:
    """The map fitted on ``choose`` where it carries to ``report`` (:func:`fit_where_it_carries`), with
    the precision and recall it gives ``report`` (``report_gold`` gold mentions) at the card's thresholds."""
    calibration, ece, not_carried = fit_where_it_carries(choose, report)
    return StrategyCalibration(strategy, calibration, ece, at_thresholds(calibrated_mentions(report, calibration), report_gold), not_carried)


def calibration_setting(current: dict[str, dict[str, float]], found: Sequence[StrategyCalibration]) -> dict[str, dict[str, float]]:
    """A model's ``score_calibration`` with the fitted maps of ``found`` in place of its own for those strategies."""
    return {**current, **{f.strategy: f.calibration.as_dict() for f in found}}


def fit_where_it_carries(choose: Sequence[ScoredMention], report: Sequence[ScoredMention]
                         ) -> tuple[ScoreCalibration, dict[str, tuple[float, float]], tuple[ScoreCalibration, float] | None]:
    """The map fitted on ``choose``, the ECE of each half before and after it, and None; or, where
    it makes ``report``'s ECE worse, the identity (raw scores), the ECE unchanged, and the fitted
    map with the ECE it gave ``report``: a setting that does not carry to the other half is not kept."""
    calibration = fit_calibration(choose)
    ece = {half: (reliability(mentions)[1], reliability(calibrated_mentions(mentions, calibration))[1])
           for half, mentions in (("choose", choose), ("report", report))}
    if ece["report"][1] <= ece["report"][0]:
        return calibration, ece, None
    return ScoreCalibration(), {half: (raw, raw) for half, (raw, _) in ece.items()}, (calibration, ece["report"][1])


def calibration_table(found: Sequence[StrategyCalibration]) -> str:
    """A Markdown table: each strategy's map, ECE before and after on both halves, P / R at the card's thresholds."""
    lines = ["| strategy | slope | intercept | ECE choose (raw -> calibrated) | ECE report (raw -> calibrated) | "
             + " | ".join(f"report P / R at {t:g}" for t in CARD_THRESHOLDS) + " |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in CARD_THRESHOLDS) + " |"]
    for f in found:
        cells = " | ".join(f"{row['precision']:.1f} / {row['recall']:.1f}" for row in f.report_thresholds)
        lines.append(f"| {f.strategy} | {f.calibration.slope:.3f} | {f.calibration.intercept:.3f} | "
                     f"{f.ece['choose'][0]:.3f} -> {f.ece['choose'][1]:.3f} | {f.ece['report'][0]:.3f} -> {f.ece['report'][1]:.3f} | {cells} |")
    for f in found:
        if f.not_carried:
            fitted, worse = f.not_carried
            lines.append(f"\n{f.strategy}: the map fitted on the choosing half (slope {fitted.slope:.3f}, intercept "
                         f"{fitted.intercept:.3f}) made the reporting half's ECE worse ({f.ece['report'][0]:.3f} -> {worse:.3f}): "
                         "not kept, its scores stay raw.")
    return "\n".join(lines)

