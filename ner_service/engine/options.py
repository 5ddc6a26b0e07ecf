"""What a caller asks the engine for, validated in one place for the API, spaCy, the pipeline
and the command line: the model, the labels, the strategy (how the model is asked: ``padellm``,
``ar``, ``fast_dllm``) and the decoder (how its answers' tokens are produced: a registered
:mod:`general_decoding` decoder).

Callers written before the two words were told apart sent ``decoder`` for the strategy and
``backend`` for the decoder; :func:`resolve_aliases` still reads them (strategy and decoder
names never overlap, so a ``decoder`` that names a strategy is one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from general_decoding import available_decoders
from ner_service.engine.engine import DEFAULT_DECODER, DEFAULT_STRATEGY
from ner_service.engine.ner_model import NERModelConfig
from ner_service.engine.strategies import available_strategies, strategy_class

#: Decoders that need more than a name (a loaded draft model): the engine's callers cannot pick them.
CONFIGURED_ONLY = {"speculative": "it needs a loaded draft model"}


class InvalidOptionsError(ValueError):
    """Options the model cannot run; the message says what it supports."""


@dataclass(frozen=True)
class ExtractOptions:
    """One extraction request's options (hashable: requests with equal options batch together).
    ``labels`` None means every label of the model."""

    model: str
    labels: tuple[str, ...] | None = None
    strategy: str = DEFAULT_STRATEGY
    decoder: str = DEFAULT_DECODER

    def validated(self, config: NERModelConfig) -> "ExtractOptions":
        """These options checked against the model's ``ner_model.json``: labels deduplicated and
        sorted; :class:`InvalidOptionsError` naming what is wrong and what the model supports."""
        labels = None
        if self.labels is not None:
            if not self.labels:
                raise InvalidOptionsError("labels must not be empty (leave them out for all of the model's labels)")
            unknown = [label for label in self.labels if label not in config.labels]
            if unknown:
                raise InvalidOptionsError(f"unknown label(s) {', '.join(map(repr, unknown))} for model {self.model!r}; "
                                          f"it knows: {', '.join(config.labels)}")
            labels = tuple(sorted(set(self.labels)))
        if self.strategy not in available_strategies():
            raise InvalidOptionsError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(available_strategies())}")
        reason = strategy_class(self.strategy).unsupported_reason(config)
        if reason is not None:
            raise InvalidOptionsError(f"{reason}; model {self.model!r} supports the strategies {', '.join(supported_strategies(config))}")
        if self.decoder not in available_decoders():
            raise InvalidOptionsError(f"unknown decoder {self.decoder!r}; available: {', '.join(available_decoders())}")
        reason = decoder_unsupported_reason(self.decoder, config)
        if reason is not None:
            raise InvalidOptionsError(f"decoder {self.decoder!r} cannot run on model {self.model!r}: {reason}; "
                                      f"it supports: {', '.join(supported_decoders(config))}")
        return ExtractOptions(self.model, labels, self.strategy, self.decoder)


def decoder_unsupported_reason(name: str, config: NERModelConfig) -> str | None:
    """Why a model of ``config`` cannot be decoded by the decoder ``name`` (None: it can)."""
    if name in CONFIGURED_ONLY:
        return CONFIGURED_ONLY[name]
    if name == "lud" and config.lud_placeholder is None:
        return "it is not fine-tuned for lexical units (`padellm-ner train-lud`)"
    return None


def supported_decoders(config: NERModelConfig) -> list[str]:
    """The decoders a request may name for a model of ``config``."""
    return [name for name in available_decoders() if decoder_unsupported_reason(name, config) is None]


def supported_strategies(config: NERModelConfig) -> list[str]:
    """The strategies a model of ``config`` can run."""
    return [name for name in available_strategies() if strategy_class(name).unsupported_reason(config) is None]


def resolve_aliases(strategy: str | None = None, decoder: str | None = None, backend: str | None = None) -> tuple[str, str]:
    """``(strategy, decoder)`` from the fields a caller sent, old names included: ``decoder`` with
    a strategy's name and no ``strategy`` is the strategy, ``backend`` is the decoder. Defaults
    fill what is missing; an old and a new name that disagree are an :class:`InvalidOptionsError`."""
    if decoder is not None and decoder in available_strategies():
        if strategy is not None and strategy != decoder:
            raise InvalidOptionsError(f"strategy {strategy!r} and decoder {decoder!r} (the old name of the strategy) disagree")
        strategy, decoder = decoder, None
    if backend is not None:
        if decoder is not None and decoder != backend:
            raise InvalidOptionsError(f"decoder {decoder!r} and backend {backend!r} (the old name of the decoder) disagree")
        decoder = backend
    return strategy or DEFAULT_STRATEGY, decoder or DEFAULT_DECODER


def options_from(model: str, labels: Sequence[str] | None = None, strategy: str | None = None, decoder: str | None = None,
                 backend: str | None = None) -> ExtractOptions:
    """:class:`ExtractOptions` from a caller's fields, old names included (not yet validated)."""
    strategy, decoder = resolve_aliases(strategy, decoder, backend)
    return ExtractOptions(model, tuple(labels) if labels is not None else None, strategy, decoder)
