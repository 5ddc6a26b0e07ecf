"""The NER engine and the model it runs."""

from ner_service.engine.engine import DEFAULT_DECODER, STRATEGIES, available_strategies, Extraction, ExtractionStats, NEREngine, UnknownLabelError
from ner_service.engine.model_loading import ModelNotFoundError
from ner_service.engine.ner_model import DEFAULT_MODEL, NERModel, NERModelConfig, default_model_for_language, model_for_language, shipped_model_names
from ner_service.engine.spans import Entity

__all__ = [
    "DEFAULT_DECODER",
    "DEFAULT_MODEL",
    "STRATEGIES",
    "Entity",
    "Extraction",
    "ExtractionStats",
    "ModelNotFoundError",
    "NEREngine",
    "NERModel",
    "NERModelConfig",
    "UnknownLabelError",
    "available_strategies",
    "default_model_for_language",
    "model_for_language",
    "shipped_model_names",
]
