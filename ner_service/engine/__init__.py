"""The NER engine and the model it runs."""

from ner_service.engine.engine import DEFAULT_DECODER, DEFAULT_STRATEGY, NEREngine, UnknownLabelError, UnsupportedStrategyError
from ner_service.engine.model_loading import ModelNotFoundError
from ner_service.engine.ner_model import DEFAULT_MODEL, NERModel, NERModelConfig, default_model_for_language, model_for_language, shipped_model_names
from ner_service.engine.options import ExtractOptions, InvalidOptionsError, options_from, resolve_aliases
from ner_service.engine.pool import EnginePool, ModelLoadError, UnknownModelError
from ner_service.engine.results import Extraction, ExtractionStats
from ner_service.engine.spans import Entity
from ner_service.engine.strategies import Strategy, StrategyOptions, UnknownStrategyError, available_strategies

__all__ = [
    "DEFAULT_DECODER",
    "DEFAULT_MODEL",
    "DEFAULT_STRATEGY",
    "EnginePool",
    "Entity",
    "Extraction",
    "ExtractOptions",
    "ExtractionStats",
    "InvalidOptionsError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NEREngine",
    "NERModel",
    "NERModelConfig",
    "Strategy",
    "StrategyOptions",
    "UnknownLabelError",
    "UnknownModelError",
    "UnknownStrategyError",
    "UnsupportedStrategyError",
    "available_strategies",
    "default_model_for_language",
    "model_for_language",
    "options_from",
    "resolve_aliases",
    "shipped_model_names",
]
