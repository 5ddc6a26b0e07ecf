"""Each label's count bias, chosen on dev (``padellm-ner calibrate-counts``).

PaDeLLM's recall is lost mostly to counts too low, and not equally per label (CoNLL-03: ORG and
MISC). One forward per batch of dev windows gives every (window, label) count's first-token
log-probabilities; a window's gold count is the number of its gold entities of that label wholly
inside it. For each label, the bias of the grid whose counts miss the gold counts by the fewest
mentions (``|count - gold|`` summed: a mention counted too few is an entity missed, one too many
a false one) is chosen, the one nearest 0 among equals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from corpora import Example
from ner_service.engine import NEREngine
from ner_service.engine.count_bias import CountBias, CountBiasSetting
from ner_service.engine.query_runners import SharedPrefixRunner
from ner_service.engine.results import ExtractionStats
from ner_service.engine.strategies.padellm import PaDeLLM

#: The biases tried per label (log-probability per unit of a count's first digit).
GRID = tuple(round(0.25 * step, 2) for step in range(-4, 13))


@dataclass
class CountScores:
    """Every dev (window, label) pair's count scores: ``digits[i, d]`` the log-probability that
    pair i's count starts with digit d, ``other[i]`` that it starts with anything else (no
    count), ``gold[i]`` its gold count, ``labels[i]`` its label."""

    digits: torch.Tensor
    other: torch.Tensor
    gold: torch.Tensor
    labels: list[str]

    def counts(self, bias: float, rows: torch.Tensor) -> torch.Tensor:
        """The counts of ``rows`` (a boolean mask) under ``bias``: their first digit (a token
        other than a digit: 0)."""
        values = torch.arange(self.digits.shape[1], dtype=self.digits.dtype)
        scored = self.digits[rows] + bias * values
        best, digit = scored.max(-1)
        return torch.where(best >= self.other[rows], digit, torch.zeros_like(digit))

    def errors(self, label: str, bias: float) -> "CountErrors":
        rows = torch.tensor([lab == label for lab in self.labels], dtype=torch.bool)
        difference = self.counts(bias, rows) - self.gold[rows]
        return CountErrors(int((-difference).clamp(min=0).sum()), int(difference.clamp(min=0).sum()), int((difference == 0).sum()), int(rows.sum()))


@dataclass(frozen=True)
class CountErrors:
    """Mentions counted too few and too many, and (window, label) pairs counted right, of ``pairs``."""

    too_few: int
    too_many: int
    right: int
    pairs: int

    @property
    def total(self) -> int:
        return self.too_few + self.too_many


@dataclass(frozen=True)
class LabelCalibration:
    """One label's chosen bias, with its counts' errors under the model's bias and under it."""

    label: str
    bias: float
    before: CountErrors
    after: CountErrors


def count_scores(engine: NEREngine, examples: Sequence[Example], batch_size: int = 16, progress: bool = True) -> CountScores:
    """The count scores of every (window, label) pair of ``examples`` as the engine reads them."""
    strategy = engine.strategy("padellm")
    assert isinstance(strategy, PaDeLLM)
    labels = engine.labels
    if sorted(strategy.digit_ids) != list(range(10)):
        raise ValueError(f"calibrating counts needs a token for each digit 0-9; model {engine.name!r} has {sorted(strategy.digit_ids)}")
    digit_tokens = [strategy.digit_ids[d] for d in range(10)]
    digits, other, gold = [], [], []
    with tqdm(total=len(examples), desc="count scores", unit="text", disable=not progress) as bar:
        for start in range(0, len(examples), batch_size):
            batch = examples[start:start + batch_size]
            windows = engine.windows([e.text for e in batch])
            if windows:
                log_probs = strategy.count_log_probs(SharedPrefixRunner(engine.ner_model, windows), windows, labels, ExtractionStats())
                digits.append(log_probs[:, digit_tokens])
                log_probs[:, digit_tokens] = float("-inf")
                other.append(log_probs.max(-1).values)
                for window in windows:
                    end = window.offset + len(window.text)
                    spans = batch[window.text_index].spans
                    gold.extend(sum(s.label == label and window.offset <= s.start and s.end <= end for s in spans) for label in labels)
            bar.update(len(batch))
    if not digits:
        raise ValueError("no text to calibrate the counts on")
    pair_labels = [label for _ in range(len(gold) // len(labels)) for label in labels]
    return CountScores(torch.cat(digits), torch.cat(other), torch.tensor(gold), pair_labels)


def calibrate(scores: CountScores, current: CountBias, labels: Sequence[str], grid: Sequence[float] = GRID) -> list[LabelCalibration]:
    """Each label's bias of ``grid`` with the fewest count errors (nearest 0 among equals)."""
    chosen = []
    for label in labels:
        bias = min(grid, key=lambda b: (scores.errors(label, b).total, abs(b)))
        chosen.append(LabelCalibration(label, bias, scores.errors(label, current.for_label(label)), scores.errors(label, bias)))
    return chosen


def choose_count_bias(engine: NEREngine, examples: Sequence[Example], batch_size: int = 16) -> tuple[CountBiasSetting, list[LabelCalibration]]:
    """The ``count_bias`` setting chosen on ``examples`` for the engine's model, and each label's calibration."""
    calibrations = calibrate(count_scores(engine, examples, batch_size), engine.count_bias, engine.labels)
    return CountBias.of({c.label: c.bias for c in calibrations}).setting(engine.labels), calibrations


def table(calibrations: Sequence[LabelCalibration], current: CountBias) -> str:
    lines = ["| label | pairs | bias (was) | counted too few | too many | pairs right |", "| --- | --- | --- | --- | --- | --- |"]
    for c in calibrations:
        lines.append(f"| {c.label} | {c.after.pairs} | {c.bias:g} ({current.for_label(c.label):g}) | {c.after.too_few} ({c.before.too_few}) "
                     f"| {c.after.too_many} ({c.before.too_many}) | {c.after.right} ({c.before.right}) |")
    return "\n".join(lines)
