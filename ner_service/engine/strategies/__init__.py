"""Extraction strategies, registered by name the way decoders are: ``padellm`` (label-wise
parallel decoding), ``ar`` (the autoregressive baseline) and ``fast_dllm`` (a masked-diffusion
model's all-entities answer). Their names are listed without importing them (or torch)."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from general_decoding.registry import Registry, UnknownNameError

if TYPE_CHECKING:
    from ner_service.engine.strategies.base import Strategy, StrategyOptions


class UnknownStrategyError(UnknownNameError):
    """A strategy name that is not registered."""


#: Each strategy and the module that registers it, the default (``padellm``) first.
STRATEGY_MODULES = {"padellm": "ner_service.engine.strategies.padellm", "ar": "ner_service.engine.strategies.autoregressive",
                    "fast_dllm": "ner_service.engine.strategies.fast_dllm"}
STRATEGIES: "Registry[type[Strategy]]" = Registry("strategy", UnknownStrategyError, STRATEGY_MODULES)
#: Class decorator: make a strategy available as ``strategy_class(name)``.
register_strategy = STRATEGIES.register


def available_strategies() -> list[str]:
    """Names of every registered strategy, the default (``padellm``) first."""
    return STRATEGIES.names()


def strategy_class(name: str) -> "type[Strategy]":
    """The strategy registered as ``name``."""
    return STRATEGIES.get(name)


def __getattr__(name: str) -> Any:  # the base classes, imported on first use (they need torch)
    if name in ("Strategy", "StrategyOptions"):
        return getattr(import_module("ner_service.engine.strategies.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["STRATEGIES", "Strategy", "StrategyOptions", "UnknownStrategyError", "available_strategies", "register_strategy", "strategy_class"]
