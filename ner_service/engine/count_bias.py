"""How PaDeLLM reads a count from the model's distribution over a count's first digit.

Two rules, both chosen on dev by ``padellm-ner calibrate-counts``:

* a **count bias** (``count_bias``): a model that under-counts (its recall trails its precision)
  answers more mentions when its count's first digit d gets ``d * bias`` added to its
  log-probability, and the most probable token is the count. Labels under-count unequally
  (CoNLL-03: ORG and MISC more than PER), so the bias may be per label: ``ner_model.json`` holds one
  number for every label or a ``{label: bias}`` table (labels left out: 0);
* a **count quantile** (``count_quantile``, where set it replaces the bias): the count is the
  largest d that the model gives at least that probability of holding d or more mentions. One
  number for every label, a label never seen in training included: the model's own uncertainty
  decides how far each count reaches, where a bias shifts every label's counts alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine's config reads this module without loading torch
    import torch

#: What ``ner_model.json``'s ``count_bias`` holds: one bias for every label, or one per label.
CountBiasSetting = float | dict[str, float]


class InvalidCountBiasError(ValueError):
    """A count bias that names an unknown label or is not a number."""


@dataclass(frozen=True)
class CountBias:
    """Log-probability added per unit of a count's first digit: ``default`` for every label but
    those of ``per_label`` (a tuple of pairs, so that options stay hashable)."""

    default: float = 0.0
    per_label: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, setting: "CountBiasSetting | CountBias") -> "CountBias":
        """The bias a ``count_bias`` setting holds (a number for all labels, or a table)."""
        if isinstance(setting, CountBias):
            return setting
        if isinstance(setting, Mapping):
            return cls(0.0, tuple(sorted((str(label), _number(bias)) for label, bias in setting.items())))
        return cls(_number(setting))

    def for_label(self, label: str) -> float:
        return dict(self.per_label).get(label, self.default)

    def checked(self, labels: Iterable[str]) -> "CountBias":
        """This bias, when every label it names is one of ``labels``; else :class:`InvalidCountBiasError`."""
        known = list(labels)
        unknown = sorted({label for label, _ in self.per_label} - set(known))
        if unknown:
            raise InvalidCountBiasError(f"count bias for unknown label(s) {', '.join(map(repr, unknown))}; the model's labels: {', '.join(known)}")
        return self

    def setting(self, labels: Iterable[str]) -> CountBiasSetting:
        """This bias as ``ner_model.json`` writes it for a model of ``labels``: one number when every
        label has the same."""
        biases = {label: self.for_label(label) for label in labels}
        return next(iter(biases.values())) if len(set(biases.values())) == 1 else biases

    def overridden(self, spec: str, labels: Iterable[str]) -> "CountBias":
        """This bias with a command line's ``spec`` applied: ``0.5`` for every label, or
        ``ORG=1,MISC=0.75`` for those labels only. Raises :class:`InvalidCountBiasError`."""
        known = list(labels)
        if "=" not in spec:
            return CountBias(_number(spec))
        table = {label: self.for_label(label) for label in known}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            label, _, value = item.partition("=")
            table[label.strip()] = _number(value)
        return CountBias.of(table).checked(known)


class InvalidCountQuantileError(ValueError):
    """A count quantile outside (0, 1]."""


def checked_quantile(quantile: float | None) -> float | None:
    """``quantile`` when it is None or in (0, 1]; else :class:`InvalidCountQuantileError`."""
    if quantile is not None and not 0.0 < quantile <= 1.0:
        raise InvalidCountQuantileError(f"a count quantile is a probability in (0, 1], not {quantile!r}")
    return quantile


def parse_quantiles(spec: str) -> list[float]:
    """Comma-separated count quantiles (``0.4,0.2``), each in (0, 1]; else :class:`InvalidCountQuantileError`."""
    quantiles = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        try:
            quantiles.append(float(item))
        except ValueError:
            raise InvalidCountQuantileError(f"a count quantile is a probability in (0, 1], not {item!r}") from None
        checked_quantile(quantiles[-1])
    if not quantiles:
        raise InvalidCountQuantileError("give at least one count quantile")
    return quantiles


def reach_probabilities(digit_log_probs: "torch.Tensor") -> "torch.Tensor":
    """Per row of a count's first-digit log-probabilities (``[rows, digits]``, digits 0 up), the
    probability that the count reaches each digit: the mass of that digit and those above it,
    over the digits alone."""
    return digit_log_probs.softmax(-1).flip(-1).cumsum(-1).flip(-1)


def quantile_digits(at_least: "torch.Tensor", quantile: float) -> "torch.Tensor":
    """Per row of ``at_least`` (``[rows, digits]``: the probability of a count of at least each
    digit, non-increasing along a row), the index of the largest digit whose probability is at
    least ``quantile`` (digit 0, with probability 1, when none above it is)."""
    return (at_least >= quantile).sum(-1).sub(1).clamp_min(0)


def _number(value: object) -> float:
    if isinstance(value, bool):
        value = str(value)
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidCountBiasError(f"a count bias is a number or LABEL=NUMBER pairs, not {value!r}") from None
