"""Which engine tags a document: the configured model (``NER_MODEL``) for documents without a
language or in its language, the shipped default model of any other language (a ``"zh"``
document goes to the Chinese model), exactly as the REST API routes its ``language`` field."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import logging

from ner_service.engine import ModelNotFoundError, NEREngine, model_for_language
from ner_service.settings import get_settings
from pipeline.model_version import model_version, model_version_of_path

log = logging.getLogger(__name__)


def load_engine(model: str) -> NEREngine:
    """Load ``model`` with the configured ``NER_DTYPE`` and ``NER_DEVICE``."""
    import torch

    settings = get_settings()
    engine = NEREngine.load(model, dtype=getattr(torch, settings.ner_dtype), device=settings.ner_device)
    log.info("loaded %s (%s)", engine.name, model_version(engine))
    return engine


class EngineRouter:
    """Engines per model, loaded on first use (``load``) and kept for the process's life."""

    def __init__(self, default: str, load: Callable[[str], NEREngine] = load_engine) -> None:
        self.default = default
        self._load = load
        self._engines: dict[str, NEREngine] = {}

    @classmethod
    def configured(cls) -> "EngineRouter":
        """A router whose default is ``NER_MODEL``."""
        return cls(get_settings().ner_model)

    @classmethod
    def serving(cls, engine: NEREngine, load: Callable[[str], NEREngine] = load_engine) -> "EngineRouter":
        """A router whose default is an engine already loaded (other languages load on use)."""
        router = cls(str(engine.ner_model.path), load)
        router._engines[router.default] = engine
        return router

    def model_for(self, language: str | None) -> str:
        """The model for a document in ``language``; :class:`ModelNotFoundError` when none serves it."""
        return model_for_language(language, self.default)

    def engine(self, model: str) -> NEREngine:
        """The engine of ``model`` (a name from :meth:`model_for`), loading it the first time."""
        if model not in self._engines:
            self._engines[model] = self._load(model)
        return self._engines[model]

    def version(self, model: str) -> str:
        """The model version results of ``model`` are stored under (without loading it)."""
        loaded = self._engines.get(model)
        return model_version(loaded) if loaded is not None else model_version_of_path(model)

    def version_for(self, language: str | None) -> str | None:
        """The current model version for documents in ``language``; ``None`` when no model serves it."""
        try:
            return self.version(self.model_for(language))
        except ModelNotFoundError:
            return None

    def versions_for(self, languages: Iterable[str | None]) -> str:
        """The model versions serving ``languages``, comma-separated (a job's ``model_version``)."""
        versions = {self.version_for(language) for language in languages}
        return ",".join(sorted(v for v in versions if v)) or self.version(self.default)
