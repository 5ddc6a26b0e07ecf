"""The models the API serves: their configs, read cheaply for validation and listing, and engines loaded lazily."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from general_decoding import available_decoders
from ner_service.engine import STRATEGIES, Extraction, NEREngine, NERModelConfig, shipped_model_names
from ner_service.engine.ner_model import resolve_ner_model

logger = logging.getLogger(__name__)


class UnknownModelError(ValueError):
    """A model name that is neither shipped nor the configured default."""


class ModelLoadError(RuntimeError):
    """A known model whose weights could not be loaded."""


class ModelRegistry:
    """Shipped models (plus the configured default, which may be a folder), engines cached once loaded.

    ``engine`` and ``extract`` load and run models: call them from the one engine thread only."""

    def __init__(self, default: str, dtype: str = "float32", device: str = "cpu", max_batch_texts: int = 16) -> None:
        self.default = default
        self._dtype = getattr(torch, dtype)
        self._device = device
        self._max_batch_texts = max_batch_texts
        self._configs: dict[str, NERModelConfig] = {}
        self._engines: dict[str, NEREngine] = {}

    def names(self) -> list[str]:
        """Every model a request may name."""
        return sorted({*shipped_model_names(), self.default})

    def config(self, name: str) -> NERModelConfig:
        """The ``ner_model.json`` of ``name`` (read once), without loading weights."""
        if name not in self._configs:
            if name not in self.names():
                raise UnknownModelError(f"unknown model {name!r}; available models: {', '.join(self.names())}")
            self._configs[name] = NERModelConfig.read(resolve_ner_model(name))
        return self._configs[name]

    def validate(self, model: str, labels: Sequence[str] | None, decoder: str, backend: str) -> None:
        """Raise a ``ValueError`` with a clear message for an unknown model, label, decoder or backend."""
        known = self.config(model).labels
        if labels is not None:
            unknown = [label for label in labels if label not in known]
            if unknown:
                raise ValueError(f"unknown label(s) {', '.join(map(repr, unknown))} for model {model!r}; it knows: {', '.join(known)}")
        if decoder not in STRATEGIES:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(STRATEGIES)}")
        if backend not in available_decoders():
            raise ValueError(f"unknown backend {backend!r}; available: {', '.join(available_decoders())}")

    def is_loaded(self, name: str) -> bool:
        return name in self._engines

    def engine(self, name: str) -> NEREngine:
        """The engine of ``name``, loaded on first use."""
        if name not in self._engines:
            self.config(name)
            logger.info("loading model", extra={"model": name})
            try:
                self._engines[name] = NEREngine.load(name, dtype=self._dtype, device=self._device, max_batch_texts=self._max_batch_texts)
            except Exception as error:
                raise ModelLoadError(f"model {name!r} could not be loaded: {error}") from error
            logger.info("model loaded", extra={"model": name})
        return self._engines[name]

    def extract(self, model: str, texts: list[str], labels: Sequence[str] | None, decoder: str, backend: str) -> list[Extraction]:
        """Run ``engine.extract`` of ``model`` on ``texts``."""
        return self.engine(model).extract(texts, labels=labels, strategy=decoder, decoder=backend)
