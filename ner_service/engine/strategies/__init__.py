"""Extraction strategies, registered by name the way decoders are: ``padellm`` (label-wise
parallel decoding), ``ar`` (the autoregressive baseline) and ``fast_dllm`` (a masked-diffusion
model's all-entities answer)."""

from __future__ import annotations

from general_decoding.registry import Registry, UnknownNameError
from ner_service.engine.strategies.base import Strategy, StrategyOptions


class UnknownStrategyError(UnknownNameError):
    """A strategy name that is not registered."""


STRATEGIES: Registry[type[Strategy]] = Registry("strategy", UnknownStrategyError)
#: Class decorator: make a strategy available as ``strategy_class(name)``.
register_strategy = STRATEGIES.register


def available_strategies() -> list[str]:
    """Names of every registered strategy, the default (``padellm``) first."""
    return STRATEGIES.names()


def strategy_class(name: str) -> type[Strategy]:
    """The strategy registered as ``name``."""
    return STRATEGIES.get(name)


# importing a strategy module registers its strategy
from ner_service.engine.strategies import padellm, autoregressive, fast_dllm  # noqa: E402,F401

__all__ = ["STRATEGIES", "Strategy", "StrategyOptions", "UnknownStrategyError", "available_strategies", "register_strategy", "strategy_class"]
