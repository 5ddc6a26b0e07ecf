"""Which model tags a document, and the version its results are stored under: the configured
model (``NER_MODEL``) for documents without a language or in its language, the shipped default
model of any other language (a ``"zh"`` document goes to the Chinese model), exactly as the REST
API routes its ``language`` field. The engines themselves live in the process's
:class:`~ner_service.engine.EnginePool`."""

from __future__ import annotations

from collections.abc import Iterable

from ner_service.engine import EnginePool, ModelNotFoundError
from ner_service.settings import get_settings
from pipeline.model_version import model_version_of_path


def configured_pool() -> EnginePool:
    """A pool of ``NER_MODEL`` (and ``NER_MODELS``) on ``NER_DEVICE`` in ``NER_DTYPE``, within ``NER_MODEL_MEMORY_MB``."""
    settings = get_settings()
    return EnginePool(settings.ner_model, settings.ner_dtype, settings.ner_device,
                      allowed=settings.served_models(), memory_budget_mb=settings.ner_model_memory_mb)


def version_for(pool: EnginePool, language: str | None) -> str | None:
    """The current model version for documents in ``language``; ``None`` when no model serves it."""
    try:
        return model_version_of_path(pool.model_for(language))
    except ModelNotFoundError:
        return None


def versions_for(pool: EnginePool, languages: Iterable[str | None]) -> str:
    """The model versions serving ``languages``, comma-separated (a job's ``model_version``)."""
    versions = {version_for(pool, language) for language in languages}
    return ",".join(sorted(v for v in versions if v)) or model_version_of_path(pool.default)
