"""What a caller asks the engine for, validated in one place for the API, spaCy, the pipeline
and the command line: the model, the labels, the strategy (how the model is asked: ``padellm``,
``ar``, ``fast_dllm``), the decoder (how its answers' tokens are produced: a registered
:mod:`general_decoding` decoder) and whether entities may overlap (``flat_ner``).

:meth:`ExtractOptions.validated` is the one rule: it resolves the defaults (no labels: all of the
model's labels; no strategy or decoder: :mod:`.defaults`) and checks every name against the
model. The engine trusts options it validated.
"""

from __future__ import annotations

from dataclasses import dataclass

from general_decoding import UnknownDecoderError, available_decoders
from ner_service.engine.defaults import DEFAULT_DECODER, DEFAULT_STRATEGY
from ner_service.engine.labels import InvalidLabelsError, LabelSpec, label_specs, unfamiliar_names
from ner_service.engine.ner_model import NERModelConfig, shipped_models_that
from ner_service.engine.option_errors import RENAMED_OPTIONS, InvalidOptionsError, refuse_renamed  # noqa: F401 (torch-free)
from ner_service.engine.strategies import UnknownStrategyError, available_strategies, strategy_class

#: Decoders that need more than a name (a loaded draft model): the engine's callers cannot pick them.
CONFIGURED_ONLY = {"speculative": "it needs a loaded draft model"}


class UnknownLabelError(InvalidOptionsError):
    """A requested label that the model does not know."""


class UnsupportedStrategyError(InvalidOptionsError):
    """A strategy the model cannot run (e.g. ``fast_dllm`` without a masked-diffusion model)."""


class UnknownStrategyOptionError(InvalidOptionsError, UnknownStrategyError):
    """A strategy name that is not registered."""


class UnknownDecoderOptionError(InvalidOptionsError, UnknownDecoderError):
    """A decoder name that is not registered."""


@dataclass(frozen=True)
class ExtractOptions:
    """One extraction request's options (hashable: requests with equal options batch together).
    As a caller fills them, None means the default; once :meth:`validated`, every field is set
    (the decoder is None for a strategy that runs none: ``fast_dllm``)."""

    model: str
    #: As a caller fills them: names, ``{"name", "description"}`` mappings or :class:`LabelSpec`
    #: objects; once validated, the names, sorted.
    labels: tuple[str | LabelSpec, ...] | None = None
    strategy: str | None = None
    decoder: str | None = None
    #: ``(name, description)`` of the labels that have one (open-label models; set by :meth:`validated`).
    descriptions: tuple[tuple[str, str], ...] = ()
    #: True: entities never overlap (a span, the surer label; the longer of nested spans). False:
    #: every label's answers, as GLiNER's ``flat_ner=False``: spans may nest and one span may carry
    #: several labels (each label is asked alone, so "person" and "politician" can both hold).
    flat_ner: bool = True

    def validated(self, config: NERModelConfig) -> "ExtractOptions":
        """These options checked against the model's ``ner_model.json``, defaults filled in: no
        labels are the model's (an open model's default labels), given labels are deduplicated
        and sorted; an open model takes any names (:func:`.labels.label_specs`). Raises an
        :class:`InvalidOptionsError` naming what is wrong and what the model supports."""
        specs = _labels(self.labels, config, self.model)
        strategy = _strategy(self.strategy or default_strategy(config), config, self.model)
        if not isinstance(self.flat_ner, bool):
            raise InvalidOptionsError(f"flat_ner must be true or false, not {self.flat_ner!r}")
        return ExtractOptions(self.model, tuple(s.name for s in specs), strategy, _decoder(self.decoder, strategy, config, self.model),
                              tuple((s.name, s.description) for s in specs if s.description), self.flat_ner)

    def label_specs(self) -> tuple[LabelSpec, ...]:
        """The validated labels with their descriptions."""
        described = dict(self.descriptions)
        return tuple(LabelSpec(name, described.get(name)) for name in self.labels or ())

    def unfamiliar_labels(self, config: NERModelConfig) -> list[str]:
        """The validated labels that the open model of ``config`` never trained on, asked without a
        description (:func:`.labels.unfamiliar_names`): what its callers are told of."""
        return unfamiliar_names(self.label_specs(), config.trained_names)


def _labels(labels: tuple[object, ...] | None, config: NERModelConfig, model: str) -> tuple[LabelSpec, ...]:
    if labels is None:
        return tuple(LabelSpec(label) for label in config.labels)
    try:
        specs = label_specs(labels, config.open_labels)
    except InvalidLabelsError as error:
        raise InvalidOptionsError(str(error)) from None
    if config.open_labels:
        return tuple(sorted(specs, key=lambda s: s.name))
    unknown = [s.name for s in specs if s.name not in config.labels]
    if unknown:
        raise UnknownLabelError(f"unknown label(s) {', '.join(map(repr, unknown))} for model {model!r}; it knows: {', '.join(config.labels)} "
                                f"(an open-label model takes any: {', '.join(shipped_models_that(lambda c: c.open_labels)) or 'none shipped yet'})")
    return tuple(LabelSpec(name) for name in sorted({s.name for s in specs}))


def _strategy(name: str, config: NERModelConfig, model: str) -> str:
    try:
        reason = strategy_class(name).unsupported_reason(config)
    except UnknownStrategyError as error:
        raise UnknownStrategyOptionError(str(error)) from None
    if reason is not None:
        raise UnsupportedStrategyError(f"{reason}; model {model!r} supports the strategies {', '.join(supported_strategies(config))}")
    return name


def default_strategy(config: NERModelConfig) -> str:
    """The strategy of a request that names none: :data:`DEFAULT_STRATEGY`, or the first the model
    runs when it cannot (a masked-diffusion model: ``fast_dllm``)."""
    supported = supported_strategies(config)
    return DEFAULT_STRATEGY if DEFAULT_STRATEGY in supported or not supported else supported[0]


def _decoder(name: str | None, strategy: str, config: NERModelConfig, model: str) -> str | None:
    """The decoder ``name`` (None: the default) checked against the model and the strategy; None
    for a strategy that produces its tokens without one, which refuses a decoder named rather
    than ignore it."""
    ignored_by = strategy_class(strategy).decoder_ignored
    if ignored_by:
        if name is None:
            return None
        takers = [s for s in supported_strategies(config) if not strategy_class(s).decoder_ignored]
        raise InvalidOptionsError(f"strategy {strategy!r} takes no decoder ({ignored_by}): leave `decoder` out"
                                  + (f", or ask with a strategy that takes one: {', '.join(takers)}" if takers else
                                     f"; model {model!r} runs no strategy that takes one"))
    name = name or DEFAULT_DECODER
    if name not in available_decoders():
        hint = f" ({name!r} is a strategy: send it as `strategy`)" if name in available_strategies() else ""
        raise UnknownDecoderOptionError(f"unknown decoder {name!r}{hint}; available: {', '.join(available_decoders())}")
    reason = decoder_unsupported_reason(name, config)
    if reason is not None:
        raise InvalidOptionsError(f"decoder {name!r} cannot run on model {model!r}: {reason}; it supports: {', '.join(supported_decoders(config))}")
    return name


def decoder_unsupported_reason(name: str, config: NERModelConfig) -> str | None:
    """Why a model of ``config`` cannot be decoded by the decoder ``name`` (None: it can)."""
    if name in CONFIGURED_ONLY:
        return CONFIGURED_ONLY[name]
    if name == "lud" and config.lud_placeholder is None:
        fine_tuned = shipped_models_that(lambda c: c.lud_placeholder is not None)
        return (f"it is not fine-tuned for lexical units; the shipped models that are: {', '.join(fine_tuned) or 'none'} "
                "(`padellm-ner train --recipe en-conll03-lud` builds one)")
    return None


def supported_decoders(config: NERModelConfig) -> list[str]:
    """The decoders a request may name for a model of ``config``."""
    return [name for name in available_decoders() if decoder_unsupported_reason(name, config) is None]


def supported_strategies(config: NERModelConfig) -> list[str]:
    """The strategies a model of ``config`` can run."""
    return [name for name in available_strategies() if strategy_class(name).unsupported_reason(config) is None]

