"""The NER engine and the model it runs.

The names below are imported on first use (PEP 562), so that ``from ner_service.engine.ner_model
import ...`` or a command that only reads ``ner_model.json`` files does not load torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["DEFAULT_DECODER", "DEFAULT_STRATEGY"], "ner_service.engine.defaults"),
    "NEREngine": "ner_service.engine.engine",
    "ModelNotFoundError": "ner_service.engine.model_loading",
    **dict.fromkeys(["DEFAULT_MODEL", "NERModel", "NERModelConfig", "default_model_for_language", "model_for_language",
                     "shipped_model_names"], "ner_service.engine.ner_model"),
    **dict.fromkeys(["ExtractOptions", "InvalidOptionsError", "UnknownLabelError", "UnsupportedStrategyError"], "ner_service.engine.options"),
    **dict.fromkeys(["EnginePool", "ModelLoadError", "UnknownModelError"], "ner_service.engine.pool"),
    **dict.fromkeys(["Extraction", "ExtractionStats"], "ner_service.engine.results"),
    "Entity": "ner_service.engine.spans",
    **dict.fromkeys(["Strategy", "StrategyOptions", "UnknownStrategyError", "available_strategies"], "ner_service.engine.strategies"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
