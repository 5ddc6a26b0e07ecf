"""The one cache of loaded models: engines loaded on first use, on one device and dtype, shared
by every caller of a process (the API's engine thread, spaCy components, a pipeline worker).

A pool knows the shipped models and its default model (``NER_MODEL``, which may be a folder);
requests name models from that list only, so no request reaches the file system
(``open_folders=True`` lets a trusted caller such as spaCy's config or the command line name a
model folder). A text's language picks its model as :func:`model_for_language` says.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from ner_service.engine.engine import NEREngine
from ner_service.engine.model_loading import ModelNotFoundError
from ner_service.engine.ner_model import DEFAULT_MODEL, NERModel, NERModelConfig, model_for_language, resolve_ner_model, shipped_model_names
from ner_service.engine.options import ExtractOptions
from ner_service.engine.results import Extraction

log = logging.getLogger(__name__)


class UnknownModelError(ModelNotFoundError):
    """A model name that is neither shipped nor the pool's default."""


class ModelLoadError(RuntimeError):
    """A known model whose weights could not be loaded."""


class EnginePool:
    """Models by name, loaded lazily and once; engines on them by batch size."""

    _shared: "EnginePool | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, default: str | Path = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu", max_batch_texts: int = 16,
                 open_folders: bool = False) -> None:
        self.default = str(default)
        self.dtype, self.device, self.max_batch_texts, self.open_folders = dtype, device, max_batch_texts, open_folders
        self._configs: dict[str, NERModelConfig] = {}
        self._models: dict[str, NERModel] = {}
        self._engines: dict[tuple[str, int], NEREngine] = {}
        self._lock = threading.RLock()

    @classmethod
    def shared(cls) -> "EnginePool":
        """The process-wide pool of trusted callers (spaCy components): folders allowed."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(open_folders=True)
            return cls._shared

    @classmethod
    def serving(cls, engine: NEREngine) -> "EnginePool":
        """A pool whose default is an engine already loaded (other models load on use)."""
        pool = cls(engine.ner_model.path, max_batch_texts=engine.max_batch_texts)
        pool._models[pool.default] = engine.ner_model
        pool._engines[pool.default, engine.max_batch_texts] = engine
        return pool

    def names(self) -> list[str]:
        """Every model a request may name."""
        return sorted({*shipped_model_names(), self.default})

    def config(self, name: str) -> NERModelConfig:
        """The ``ner_model.json`` of ``name`` (read once), without loading weights."""
        with self._lock:
            if name not in self._configs:
                if name not in self.names() and not self.open_folders:
                    raise UnknownModelError(f"unknown model {name!r}; available models: {', '.join(self.names())}")
                self._configs[name] = NERModelConfig.read(resolve_ner_model(name))
            return self._configs[name]

    def model_for(self, language: str | None) -> str:
        """The model for texts in ``language`` (the default's own language, or None: the default)."""
        return model_for_language(language, self.default)

    def options(self, model: str | None = None, language: str | None = None, labels: Sequence[str] | None = None,
                strategy: str | None = None, decoder: str | None = None) -> ExtractOptions:
        """Validated :class:`ExtractOptions` (:meth:`ExtractOptions.validated`) of ``model``, else
        the model of ``language``, else the default; None: the default labels, strategy, decoder."""
        name = model or self.model_for(language)
        return ExtractOptions(name, tuple(labels) if labels is not None else None, strategy, decoder).validated(self.config(name))

    def is_loaded(self, name: str) -> bool:
        return name in self._models

    def ner_model(self, name: str) -> NERModel:
        """The loaded model ``name`` (loaded the first time; :class:`ModelLoadError` if it cannot be)."""
        with self._lock:
            if name not in self._models:
                self.config(name)
                log.info("loading model %s", name)
                try:
                    self._models[name] = NERModel.load(name, dtype=getattr(torch, self.dtype), device=self.device)
                except Exception as error:
                    raise ModelLoadError(f"model {name!r} could not be loaded: {error}") from error
            return self._models[name]

    def engine(self, name: str, max_batch_texts: int | None = None) -> NEREngine:
        """An engine on the shared model ``name`` running batches of ``max_batch_texts`` texts."""
        size = max_batch_texts or self.max_batch_texts
        with self._lock:
            if (name, size) not in self._engines:
                self._engines[name, size] = NEREngine(self.ner_model(name), max_batch_texts=size)
            return self._engines[name, size]

    def extract(self, options: ExtractOptions, texts: Sequence[str], max_batch_texts: int | None = None) -> list[Extraction]:
        """The engine of ``options.model`` run on ``texts`` with ``options`` (from :meth:`options`)."""
        return self.engine(options.model, max_batch_texts).extract_with(options, texts)
