"""Each label's count bias, chosen on dev for the F1 it gives (``padellm-ner calibrate-counts``).

PaDeLLM's recall is lost mostly to counts too low, and not equally per label (CoNLL-03: ORG and
MISC). A bias moves a label's counts; what a move is worth is the F1 of the entities the engine
then finds, not how near its counts come to the gold ones: a mention counted too many often costs
nothing (the repairs drop a repeated answer, or the extra one is right), one counted too few is
always an entity missed (the counts nearest gold lost to a flat 1.0 twice on English).

One forward per batch of dev windows gives every (window, label) count's first-token
log-probabilities (:class:`CountScores`), so the counts any bias leads to are known without the
model. The engine then finds every dev text's entities under the model's bias, and a coordinate
ascent over :data:`GRID` moves one label's bias at a time while the dev micro-F1 rises; a move
runs the engine again only on the texts whose counts it changes (:class:`EntitiesByCounts`: a
text's entities follow from its counts). The F1 reported is the one ``padellm-ner evaluate``
gives with the chosen bias. A model's biases are chosen on the choose half of dev and kept only
when they carry to the report half (:func:`calibrate_on_halves`, :mod:`corpora.dev_halves`).

The other rule, one count quantile for every label (:mod:`ner_service.engine.count_bias`), is
chosen the same way over :data:`QUANTILE_GRID` (:func:`calibrate_quantile_on_halves`) and kept
only when it carries to the report half better than the model's own rule.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from corpora import Example
from corpora.dev_halves import dev_halves
from ner_service.engine import NEREngine, NERModelConfig
from ner_service.engine.count_bias import CountBias, CountBiasSetting, quantile_digits, reach_probabilities
from ner_service.engine.query_runners import SharedPrefixRunner
from ner_service.engine.results import ExtractionStats
from ner_service.engine.strategies.padellm import PaDeLLM
from training.evaluate import SpanKey, predict, span_f1

#: The biases tried per label (log-probability per unit of a count's first digit).
GRID = tuple(round(0.25 * step, 2) for step in range(-4, 13))
#: The count quantiles tried, surest first (a tie goes to the larger: fewer mentions asked).
QUANTILE_GRID = (0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05)
#: Steps the ascent takes past the best bias before it turns back (a flat step is crossed).
PATIENCE = 2
#: Rounds over the labels at most (a label's best bias moves with the others').
ROUNDS = 3

Biases = dict[str, float]


@dataclass
class CountScores:
    """Every dev (window, label) pair's count scores: ``digits[i, d]`` the log-probability that
    pair i's count starts with digit d, ``other[i]`` that it starts with anything else (no
    count), ``gold[i]`` its gold count, ``labels[i]`` its label, ``texts[i]`` its text's index."""

    digits: torch.Tensor
    other: torch.Tensor
    gold: torch.Tensor
    labels: list[str]
    texts: list[int]

    def counts(self, bias: float, rows: torch.Tensor) -> torch.Tensor:
        """The counts of ``rows`` (a boolean mask) under ``bias``: their first digit (a token
        other than a digit: 0)."""
        values = torch.arange(self.digits.shape[1], dtype=self.digits.dtype)
        scored = self.digits[rows] + bias * values
        best, digit = scored.max(-1)
        return torch.where(best >= self.other[rows], digit, torch.zeros_like(digit))

    def rows(self, label: str) -> torch.Tensor:
        return torch.tensor([lab == label for lab in self.labels], dtype=torch.bool)

    def quantile_counts(self, quantile: float) -> torch.Tensor:
        """Every pair's count under one count quantile: the largest digit the model gives at
        least that probability of being reached (its distribution over the digits alone)."""
        return quantile_digits(reach_probabilities(self.digits), quantile)

    def all_counts(self, biases: Biases) -> torch.Tensor:
        """Every pair's count with each label's bias of ``biases``."""
        counts = torch.zeros(len(self.labels), dtype=torch.long)
        for label, bias in biases.items():
            rows = self.rows(label)
            counts[rows] = self.counts(bias, rows)
        return counts

    def errors(self, label: str, bias: float) -> "CountErrors":
        rows = self.rows(label)
        difference = self.counts(bias, rows) - self.gold[rows]
        return CountErrors(int((-difference).clamp(min=0).sum()), int(difference.clamp(min=0).sum()), int((difference == 0).sum()), int(rows.sum()))


@dataclass(frozen=True)
class CountErrors:
    """Mentions counted too few and too many, and (window, label) pairs counted right, of ``pairs``."""

    too_few: int
    too_many: int
    right: int
    pairs: int


@dataclass(frozen=True)
class LabelCalibration:
    """One label's chosen bias, its counts' errors and its F1 under the model's bias and under it."""

    label: str
    bias: float
    was: float
    before: CountErrors
    after: CountErrors
    f1_before: float
    f1_after: float


@dataclass(frozen=True)
class Calibration:
    """The biases chosen on dev: per label, and dev micro-F1 (P / R) with the model's and with them."""

    labels: list[LabelCalibration]
    before: dict[str, float]
    after: dict[str, float]

    @property
    def biases(self) -> Biases:
        return {c.label: c.bias for c in self.labels}

    def setting(self) -> CountBiasSetting:
        """The chosen biases as ``ner_model.json`` writes them."""
        return CountBias.of(self.biases).setting([c.label for c in self.labels])

    def table(self) -> str:
        lines = ["| label | pairs | bias (was) | F1 (was) | counted too few (was) | too many (was) | pairs right (was) |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in self.labels:
            lines.append(f"| {c.label} | {c.after.pairs} | {c.bias:g} ({c.was:g}) | {c.f1_after:.2f} ({c.f1_before:.2f}) "
                         f"| {c.after.too_few} ({c.before.too_few}) | {c.after.too_many} ({c.before.too_many}) | {c.after.right} ({c.before.right}) |")
        lines += ["", f"micro-F1 {_prf(self.after)} (was {_prf(self.before)})"]
        return "\n".join(lines)


def _prf(scores: dict[str, float]) -> str:
    return f"{scores['f1']:.2f} (P {scores['precision']:.2f} / R {scores['recall']:.2f})"


def count_scores(engine: NEREngine, examples: Sequence[Example], batch_size: int = 16, progress: bool = True,
                 labels: Sequence[str] | None = None) -> CountScores:
    """The count scores of every (window, label) pair of ``examples`` as the engine reads them
    (``labels``: those an open model is asked; None: the model's)."""
    strategy = engine.strategy("padellm")
    assert isinstance(strategy, PaDeLLM)
    labels = list(labels or engine.labels)
    if sorted(strategy.digit_ids) != list(range(10)):
        raise ValueError(f"calibrating counts needs a token for each digit 0-9; model {engine.name!r} has {sorted(strategy.digit_ids)}")
    digit_tokens = [strategy.digit_ids[d] for d in range(10)]
    digits, other, gold, texts = [], [], [], []
    with tqdm(total=len(examples), desc="count scores", unit="text", disable=not progress) as bar:
        for start in range(0, len(examples), batch_size):
            batch = examples[start:start + batch_size]
            windows = engine.windows([e.text for e in batch])
            if windows:
                log_probs = strategy.count_log_probs(SharedPrefixRunner(engine.ner_model, windows), windows, labels, ExtractionStats()).to_dense()
                digits.append(log_probs[:, digit_tokens])
                log_probs[:, digit_tokens] = float("-inf")
                other.append(log_probs.max(-1).values)
                for window in windows:
                    end = window.offset + len(window.text)
                    spans = batch[window.text_index].spans
                    gold.extend(sum(s.label == label and window.offset <= s.start and s.end <= end for s in spans) for label in labels)
                    texts.extend([start + window.text_index] * len(labels))
            bar.update(len(batch))
    if not digits:
        raise ValueError("no text to calibrate the counts on")
    pair_labels = [label for _ in range(len(gold) // len(labels)) for label in labels]
    return CountScores(torch.cat(digits), torch.cat(other), torch.tensor(gold), pair_labels, texts)


class EntitiesByCounts:
    """The engine's PaDeLLM entities of each text under any count bias: a text's entities follow
    from its counts, so the engine runs again only on a text whose counts are new."""

    def __init__(self, engine: NEREngine, examples: Sequence[Example], scores: CountScores, batch_size: int = 16,
                 labels: Sequence[str] | None = None) -> None:
        """``labels``: those an open model is asked, as ``scores`` were (None: the model's)."""
        self.engine, self.examples, self.scores, self.batch_size = engine, examples, scores, batch_size
        self.labels = list(labels) if labels else None
        self.found: list[dict[tuple[int, ...], list[SpanKey]]] = [{} for _ in examples]
        wanted = set(self.labels or engine.labels)
        self.gold = [[(s.start, s.end, s.label) for s in e.spans if s.label in wanted] for e in examples]

    def signatures(self, biases: Biases, quantile: float | None = None) -> list[tuple[int, ...]]:
        """Each text's counts under ``biases`` (or, where set, one count ``quantile``), pair by pair."""
        counts = self.scores.all_counts(biases) if quantile is None else self.scores.quantile_counts(quantile)
        per_text: list[list[int]] = [[] for _ in self.examples]
        for text, count in zip(self.scores.texts, counts.tolist()):
            per_text[text].append(count)
        return [tuple(counts) for counts in per_text]

    def entities(self, biases: Biases, progress: bool = False, quantile: float | None = None) -> list[list[SpanKey]]:
        signatures = self.signatures(biases, quantile)
        new = [i for i, signature in enumerate(signatures) if signature not in self.found[i]]
        engine = copy.copy(self.engine)
        engine.count_bias, engine.count_quantile = CountBias.of(biases), quantile
        found = predict(engine, [self.examples[i] for i in new], engine.options(self.labels, strategy="padellm"), self.batch_size, progress)
        for i, entities in zip(new, found.entities):
            self.found[i][signatures[i]] = entities
        return [self.found[i][signature] for i, signature in enumerate(signatures)]

    def f1(self, biases: Biases, progress: bool = False, quantile: float | None = None) -> dict:
        """``span_f1`` of the entities under ``biases`` (or one count ``quantile``) against the gold spans."""
        return span_f1(self.gold, self.entities(biases, progress, quantile))


def ascend(labels: Sequence[str], start: Biases, score: Callable[[Biases], float], grid: Sequence[float] = GRID) -> Biases:
    """Coordinate ascent: each label's bias moved along ``grid`` (both ways, :data:`PATIENCE`
    steps past the best) while ``score`` rises strictly; rounds over the labels until none moves."""
    best = dict(start)
    best_score = score(best)
    for _ in range(ROUNDS):
        moved = False
        for label in labels:
            steps = sorted(set(grid) | {best[label]})
            for direction in (1, -1):
                position, misses = steps.index(best[label]), 0
                while misses < PATIENCE and 0 <= position + direction < len(steps):
                    position += direction
                    trial = {**best, label: steps[position]}
                    trial_score = score(trial)
                    if trial_score > best_score:
                        best, best_score, misses, moved = trial, trial_score, 0, True
                    else:
                        misses += 1
        if not moved:
            break
    return best


def calibrate(engine: NEREngine, examples: Sequence[Example], batch_size: int = 16, progress: bool = True) -> Calibration:
    """Each label's count bias of :data:`GRID` with the highest micro-F1 on ``examples`` (see the module)."""
    labels = engine.labels
    scores = count_scores(engine, examples, batch_size, progress)
    found = EntitiesByCounts(engine, examples, scores, batch_size)
    was = {label: engine.count_bias.for_label(label) for label in labels}
    before = found.f1(was, progress)
    with tqdm(desc="count bias", unit="try", disable=not progress) as bar:
        def score(biases: Biases) -> float:
            bar.update(1)
            return float(found.f1(biases)["micro_f1"])

        chosen = ascend(labels, was, score)
    after = found.f1(chosen)
    per_label = [LabelCalibration(label, chosen[label], was[label], scores.errors(label, was[label]), scores.errors(label, chosen[label]),
                                  _label_f1(before, label), _label_f1(after, label)) for label in labels]
    return Calibration(per_label, _summary(before), _summary(after))


@dataclass(frozen=True)
class HalvesCalibration:
    """Biases chosen on the dev file's choose half, and what they do on its report half: a
    choice that lowers the report half's micro-F1 does not carry, and the model's biases stay."""

    chosen: Calibration
    report_before: dict[str, float] | None  # None: the file has no report half (one document)
    report_after: dict[str, float] | None

    @property
    def carried(self) -> bool:
        return self.report_after is None or self.report_before is None or self.report_after["f1"] >= self.report_before["f1"]

    @property
    def biases(self) -> Biases:
        return self.chosen.biases if self.carried else {c.label: c.was for c in self.chosen.labels}

    def setting(self) -> CountBiasSetting:
        return CountBias.of(self.biases).setting([c.label for c in self.chosen.labels])

    def table(self) -> str:
        chosen = f"Chosen on the choose half of dev:\n\n{self.chosen.table()}\n\n"
        if self.report_after is None or self.report_before is None:
            return chosen + "Report half: none (the file is one document)"
        verdict = "kept" if self.carried else "not kept: it does not carry to the report half"
        return chosen + f"Report half: micro-F1 {_prf(self.report_after)} (was {_prf(self.report_before)}); {verdict}"


def calibrate_on_halves(engine: NEREngine, dev: str | Path, batch_size: int = 16, limit: int | None = None,
                        progress: bool = True) -> HalvesCalibration:
    """Choose each label's count bias on the choose half of ``dev`` (:mod:`corpora.dev_halves`;
    its first ``limit`` texts) and score the choice on the report half."""
    halves = dev_halves(dev)
    chosen = calibrate(engine, halves.choose[:limit], batch_size, progress)
    report = halves.report[:limit]
    if not report:
        return HalvesCalibration(chosen, None, None)
    found = EntitiesByCounts(engine, report, count_scores(engine, report, batch_size, progress), batch_size)
    was = {c.label: c.was for c in chosen.labels}
    return HalvesCalibration(chosen, _summary(found.f1(was, progress)), _summary(found.f1(chosen.biases, progress)))


@dataclass(frozen=True)
class QuantileCalibration:
    """One count quantile chosen on the choose half of dev (the micro-F1 of each one tried), and
    what it and the model's own rule (``was``: its count quantile, or its biases where None) give
    on the report half: the quantile is kept only where it gives the report half more."""

    tried: dict[float, dict[str, float]]
    quantile: float
    was: float | None
    choose_before: dict[str, float]
    report_before: dict[str, float] | None  # None: the file has no report half (one document)
    report_after: dict[str, float] | None

    @property
    def carried(self) -> bool:
        if self.report_after is None or self.report_before is None:
            return self.tried[self.quantile]["f1"] > self.choose_before["f1"]
        return self.report_after["f1"] > self.report_before["f1"]

    def setting(self) -> float | None:
        """The model's ``count_quantile`` after this calibration."""
        return self.quantile if self.carried else self.was

    def table(self) -> str:
        was = "its count bias" if self.was is None else f"count quantile {self.was:g}"
        lines = ["| count quantile | choose half micro-F1 (P / R) |", "| --- | --- |"]
        lines += [f"| {q:g}{' (chosen)' if q == self.quantile else ''} | {_prf(scores)} |" for q, scores in self.tried.items()]
        lines += ["", f"The model's rule ({was}) on the choose half: {_prf(self.choose_before)}"]
        if self.report_after is None or self.report_before is None:
            return "\n".join(lines + ["Report half: none (the file is one document)"])
        verdict = "kept" if self.carried else "not kept: it does not carry to the report half"
        return "\n".join(lines + [f"Report half: micro-F1 {_prf(self.report_after)} with quantile {self.quantile:g} "
                                  f"(the model's rule: {_prf(self.report_before)}); {verdict}"])


def best_quantile(f1_by_quantile: Mapping[float, float]) -> float:
    """The count quantile of the highest F1; of equal ones the larger (fewer mentions asked)."""
    return max(f1_by_quantile, key=lambda q: (f1_by_quantile[q], q))


def calibrate_quantile_on_halves(engine: NEREngine, dev: str | Path, batch_size: int = 16, limit: int | None = None,
                                 progress: bool = True, grid: Sequence[float] = QUANTILE_GRID) -> QuantileCalibration:
    """Choose one count quantile of ``grid`` on the choose half of ``dev`` (its first ``limit``
    texts) and score it and the model's own rule on the report half."""
    halves = dev_halves(dev)
    was_biases = {label: engine.count_bias.for_label(label) for label in engine.labels}
    choose = halves.choose[:limit]
    found = EntitiesByCounts(engine, choose, count_scores(engine, choose, batch_size, progress), batch_size)
    choose_before = _summary(found.f1(was_biases, progress, engine.count_quantile))
    tried = {q: _summary(found.f1(was_biases, progress, q)) for q in tqdm(grid, desc="count quantile", unit="try", disable=not progress)}
    best = best_quantile({q: scores["f1"] for q, scores in tried.items()})
    report = halves.report[:limit]
    if not report:
        return QuantileCalibration(tried, best, engine.count_quantile, choose_before, None, None)
    found = EntitiesByCounts(engine, report, count_scores(engine, report, batch_size, progress), batch_size)
    return QuantileCalibration(tried, best, engine.count_quantile, choose_before, _summary(found.f1(was_biases, progress, engine.count_quantile)),
                               _summary(found.f1(was_biases, progress, best)))


def calibrate_model(engine: NEREngine, ner_config: NERModelConfig, dev: str | Path, batch_size: int = 16, limit: int | None = None) -> str:
    """Choose the count biases of ``engine``'s model on the choose half of the dev file (its first
    ``limit`` texts), set them in ``ner_config`` when they carry to the report half, and return
    the table of both halves: a trainer's last step."""
    calibration = calibrate_on_halves(engine, dev, batch_size, limit)
    ner_config.count_bias = calibration.setting()
    return calibration.table()


def _label_f1(scores: dict, label: str) -> float:
    return float(scores["per_label"].get(label, {}).get("f1", 0.0))


def _summary(scores: dict) -> dict[str, float]:
    return {"f1": float(scores["micro_f1"]), "precision": float(scores["precision"]), "recall": float(scores["recall"])}
