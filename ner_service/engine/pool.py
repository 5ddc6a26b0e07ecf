"""The one cache of loaded models: engines loaded on first use, on one device and dtype, shared
by every caller of a process (the API's engine thread, spaCy components, a pipeline worker).

A pool knows the models it serves (``allowed``: ``NER_MODELS``, by default
:data:`~ner_service.engine.ner_model.CURRENT_MODELS`) and its default model (``NER_MODEL``, which
may be a folder); requests name models from that list only, so no request reaches the file
system (``open_folders=True`` lets a trusted caller such as spaCy's config or the command line
name any model). A text's language picks its model as :func:`model_for_language` says.

Memory: adapters on one base share its weights (:mod:`.shared_bases`), and beyond
``memory_budget_mb`` of weights the least recently used models are unloaded (never the default,
nor the model being loaded), before a load by its estimated cost and after it by its measured
one. Loads hold a lock of their own: a call on a loaded model never waits for one.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch

from ner_service.engine.cpu import configure_threads, configured_dtype, inference_dtype
from ner_service.engine.engine import NEREngine
from ner_service.engine.model_loading import ModelNotFoundError, resolve_model_folder
from ner_service.engine.ner_model import (
    CURRENT_MODELS, DEFAULT_MODEL, NERModel, NERModelConfig, base_chain, load_base, model_for_language, resolve_ner_model,
    shipped_model_names,
)
from ner_service.engine.options import ExtractOptions
from ner_service.engine.results import Extraction
from ner_service.engine.shared_bases import SharedBases, resident_bytes

log = logging.getLogger(__name__)
MB = 1024 * 1024


class UnknownModelError(ModelNotFoundError):
    """A model name that is neither shipped nor the pool's default."""


class ModelLoadError(RuntimeError):
    """A known model whose weights could not be loaded."""


class EnginePool:
    """Models by name, loaded lazily, shared bases, the least recently used unloaded beyond the
    budget; engines on them by batch size."""

    _shared: "EnginePool | None" = None
    _shared_lock = threading.Lock()

    def __init__(self, default: str | Path = DEFAULT_MODEL, dtype: str | None = None, device: str = "cpu", max_batch_texts: int = 16,
                 open_folders: bool = False, allowed: Sequence[str] | None = None, memory_budget_mb: float | None = None) -> None:
        """``allowed``: the model names requests may name (None: :data:`CURRENT_MODELS` that are
        shipped); ``memory_budget_mb``: the weights kept loaded (None: no limit)."""
        self.default = str(default)
        # dtype None: NER_DTYPE, else auto (bfloat16 on a CPU with bfloat16 instructions); threads from the CPU quota (cpu.py)
        self.dtype, self.device, self.max_batch_texts, self.open_folders = inference_dtype(dtype or configured_dtype(), device), device, \
            max_batch_texts, open_folders
        configure_threads()
        shipped = set(shipped_model_names())
        self.allowed = [name for name in CURRENT_MODELS if name in shipped] if allowed is None else list(allowed)
        self.memory_budget_bytes = None if memory_budget_mb is None else int(memory_budget_mb * MB)
        self._configs: dict[str, NERModelConfig] = {}
        self._models: OrderedDict[str, NERModel] = OrderedDict()  # least recently used first
        self._engines: dict[tuple[str, int], NEREngine] = {}
        self._costs: dict[str, int] = {}  # the bytes each model added when it loaded
        self._bases = SharedBases(lambda base: load_base(base, getattr(torch, self.dtype), self.device, self._bases, native=True))
        self._lock = threading.RLock()  # the dictionaries: held for lookups only
        self._loading = threading.Lock()  # one load at a time, beside calls on loaded models

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
        """Every model a request may name: the allowed ones and the default."""
        return sorted({*self.allowed, self.default})

    def config(self, name: str) -> NERModelConfig:
        """The ``ner_model.json`` of ``name`` (read once), without loading weights."""
        with self._lock:
            if name not in self._configs:
                if name not in self.names() and not self.open_folders:
                    raise UnknownModelError(f"unknown model {name!r}; this server serves: {', '.join(self.names())} (NER_MODELS)")
                self._configs[name] = NERModelConfig.read(resolve_ner_model(name))
            return self._configs[name]

    def model_for(self, language: str | None) -> str:
        """The model for texts in ``language`` (the default's own language, or None: the default)."""
        return model_for_language(language, self.default)

    def options(self, model: str | None = None, language: str | None = None, labels: Sequence[str] | None = None,
                strategy: str | None = None, decoder: str | None = None, flat_ner: bool = True) -> ExtractOptions:
        """Validated :class:`ExtractOptions` (:meth:`ExtractOptions.validated`) of ``model``, else
        the model of ``language``, else the default; None: the default labels, strategy, decoder."""
        name = model or self.model_for(language)
        return ExtractOptions(name, tuple(labels) if labels is not None else None, strategy, decoder,
                              flat_ner=flat_ner).validated(self.config(name))

    def is_loaded(self, name: str) -> bool:
        return name in self._models

    def loaded(self) -> list[str]:
        """The loaded models, least recently used first."""
        with self._lock:
            return list(self._models)

    def resident_bytes(self) -> int:
        """The bytes of the weights loaded (models and their shared bases; each tensor once)."""
        with self._lock:
            modules = [model.model for model in self._models.values()]
        return resident_bytes([*modules, *self._bases.models()])

    def ner_model(self, name: str) -> NERModel:
        """The loaded model ``name`` (loaded the first time; :class:`ModelLoadError` if it cannot be)."""
        with self._lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
        self.config(name)
        with self._loading:
            if name not in self._models:
                self._load(name)
        with self._lock:
            self._models.move_to_end(name)
            return self._models[name]

    def _load(self, name: str) -> None:
        """Load ``name`` into the pool, unloading what the budget needs before and after (under ``_loading``)."""
        self._unload_beyond(self._estimate(name), keep=name)
        before = self.resident_bytes()
        log.info("loading model %s", name)
        try:
            model = NERModel.load(name, dtype=getattr(torch, self.dtype), device=self.device, bases=self._bases, native=True)
        except Exception as error:
            self._forget_unused_bases()
            raise ModelLoadError(f"model {name!r} could not be loaded: {error}") from error
        with self._lock:
            self._models[name] = model
        self._costs[name] = max(self.resident_bytes() - before, 0)
        self._unload_beyond(0, keep=name)

    def _estimate(self, name: str) -> int:
        """The bytes loading ``name`` is expected to add: its measured cost if it was loaded before,
        else the size of its weight files and of the bases it stands on that are not loaded yet."""
        if name in self._costs:
            return self._costs[name]
        loaded_bases = set(self._bases.names())
        folders = [resolve_ner_model(name)]
        for base in base_chain(name):
            if base in loaded_bases:
                break
            try:
                folders.append(resolve_ner_model(base))
            except ModelNotFoundError:
                try:
                    folders.append(resolve_model_folder(base))
                except ModelNotFoundError:
                    pass
        return sum(f.stat().st_size for folder in folders for f in folder.glob("*.safetensors"))

    def _unload_beyond(self, extra: int, keep: str) -> None:
        """Unload the least recently used models (never the default nor ``keep``) until the weights
        loaded plus ``extra`` bytes fit the budget."""
        if self.memory_budget_bytes is None:
            return
        unloaded = False
        while self.resident_bytes() + extra > self.memory_budget_bytes:
            with self._lock:
                victims = [n for n in self._models if n not in (self.default, keep)]
                if not victims:
                    break
                victim = victims[0]
                log.info("unloading model %s (weights beyond %d MB)", victim, self.memory_budget_bytes // MB)
                del self._models[victim]
                for key in [key for key in self._engines if key[0] == victim]:
                    del self._engines[key]
            self._forget_unused_bases()
            unloaded = True
        if unloaded:
            _release_memory()

    def _forget_unused_bases(self) -> None:
        """Drop the shared bases no loaded model stands on."""
        with self._lock:
            needed = {base for name in self._models for base in base_chain(name)}
        self._bases.keep_only(needed)

    def engine(self, name: str, max_batch_texts: int | None = None) -> NEREngine:
        """An engine on the shared model ``name`` running batches of ``max_batch_texts`` texts."""
        size = max_batch_texts or self.max_batch_texts
        model = self.ner_model(name)  # loaded outside the dictionaries' lock: other models' calls go on meanwhile
        with self._lock:
            if (name, size) not in self._engines:
                self._engines[name, size] = NEREngine(model, max_batch_texts=size)
            return self._engines[name, size]

    def extract(self, options: ExtractOptions, texts: Sequence[str], max_batch_texts: int | None = None) -> list[Extraction]:
        """The engine of ``options.model`` run on ``texts`` with ``options`` (from :meth:`options`)."""
        return self.engine(options.model, max_batch_texts).extract_with(options, texts)


def _release_memory() -> None:
    """Collect unreachable objects and hand freed heap back to the system (glibc's malloc_trim)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
