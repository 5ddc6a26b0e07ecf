"""The ``padellm_ner`` spaCy component: ``nlp.add_pipe("padellm_ner")`` sets ``doc.ents`` with the engine.

Registered through the ``spacy_factories`` entry point of the package, so it works in any pipeline
(``spacy.blank("en")``, ``spacy.blank("zh")``...) once the package is installed. Each entity's
probability is kept in ``span._.padellm_score`` and the cost of the engine batch in
``doc._.padellm_stats``. ``nlp.pipe`` runs one engine batch per ``batch_size`` docs (the config's
``batch_size`` bounds it: a larger ``nlp.pipe(batch_size=...)`` does not raise it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.util import filter_spans, minibatch

from general_decoding import available_decoders
from ner_service.engine import DEFAULT_DECODER, STRATEGIES, Extraction, NEREngine, NERModel, NERModelConfig, default_model_for_language
from ner_service.engine.ner_model import resolve_ner_model

FACTORY = "padellm_ner"
SCORE_EXTENSION = "padellm_score"
STATS_EXTENSION = "padellm_stats"
CONFIG_FILE = "padellm_ner.json"
AUTO_MODEL = "auto"  # the shipped default model of the pipeline's language

_models: dict[str, NERModel] = {}
_models_lock = threading.Lock()

if not Span.has_extension(SCORE_EXTENSION):
    Span.set_extension(SCORE_EXTENSION, default=None)
if not Doc.has_extension(STATS_EXTENSION):
    Doc.set_extension(STATS_EXTENSION, default=None)


def _model(name: str) -> NERModel:
    """The process-wide model ``name``, loaded on first use (components of the same model share its weights)."""
    with _models_lock:
        if name not in _models:
            _models[name] = NERModel.load(name)
        return _models[name]


class PaDeLLMNER:
    """Sets ``doc.ents`` from PaDeLLM-NER (or the AR baseline) with the shared engine."""

    def __init__(self, nlp: Language, name: str, model: str, labels: list[str] | None, decoder: str, backend: str, batch_size: int) -> None:
        self.name = name
        self.configure(model, labels, decoder, backend, batch_size)

    def configure(self, model: str, labels: list[str] | None, decoder: str, backend: str, batch_size: int) -> None:
        """Validate and set the options (labels are checked against ``ner_model.json``; weights load on first use)."""
        known = NERModelConfig.read(resolve_ner_model(model)).labels
        unknown = [label for label in labels or [] if label not in known]
        if unknown:
            raise ValueError(f"unknown label(s) {', '.join(map(repr, unknown))} for model {model!r}; it knows: {', '.join(known)}")
        if decoder not in STRATEGIES:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {', '.join(STRATEGIES)}")
        if backend not in available_decoders():
            raise ValueError(f"unknown backend {backend!r}; available: {', '.join(available_decoders())}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.model, self.requested_labels, self.decoder, self.backend, self.batch_size = model, labels, decoder, backend, batch_size
        self._model_labels = list(known)
        self._engine: NEREngine | None = None

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels this component predicts (spaCy lists them in the pipeline's meta)."""
        return tuple(self.requested_labels or self._model_labels)

    @property
    def engine(self) -> NEREngine:
        """The engine on the shared model, batching at most ``batch_size`` texts per forward batch."""
        if self._engine is None:
            self._engine = NEREngine(_model(self.model), max_batch_texts=self.batch_size)
        return self._engine

    def __call__(self, doc: Doc) -> Doc:
        return next(self.pipe([doc]))

    def pipe(self, stream: Iterable[Doc], batch_size: int | None = None) -> Iterator[Doc]:
        """Annotate ``stream``: one engine batch per ``min(batch_size, self.batch_size)`` docs."""
        for batch in minibatch(stream, size=min(batch_size or self.batch_size, self.batch_size)):
            extractions = self.engine.extract([doc.text for doc in batch], labels=self.requested_labels, strategy=self.decoder, decoder=self.backend)
            for doc, extraction in zip(batch, extractions):
                self.set_entities(doc, extraction)
                yield doc

    @staticmethod
    def set_entities(doc: Doc, extraction: Extraction) -> None:
        """Align character spans to tokens (expanding), drop overlaps (longest first; for the same
        tokens, the higher score), keep each score in ``span._.padellm_score`` and the batch's
        cost in ``doc._.padellm_stats``."""
        candidates: list[tuple[Span, float]] = []
        for entity in sorted(extraction.entities, key=lambda e: e.score, reverse=True):
            span = doc.char_span(entity.start, entity.end, label=entity.label, alignment_mode="expand")
            if span is not None:
                candidates.append((span, entity.score))
        scores: dict[tuple[int, int, str], float] = {}
        for span, score in candidates:  # the highest score of the spans that expand to the same tokens
            scores.setdefault((span.start, span.end, span.label_), score)
        # filter_spans sorts stably: among spans of the same tokens the first, highest-scored, one wins
        doc.ents = filter_spans(span for span, _ in candidates)
        for span in doc.ents:
            span._.set(SCORE_EXTENSION, scores[(span.start, span.end, span.label_)])
        doc._.set(STATS_EXTENSION, extraction.stats.to_dict())

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Write the options as a small JSON file (the model itself is shipped with the package)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        options = {"model": self.model, "labels": self.requested_labels, "decoder": self.decoder, "backend": self.backend, "batch_size": self.batch_size}
        (folder / CONFIG_FILE).write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> "PaDeLLMNER":
        """Read the options written by :meth:`to_disk`."""
        options = json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))
        self.configure(**options)
        return self


@Language.factory(
    FACTORY,
    default_config={"model": AUTO_MODEL, "labels": None, "decoder": "padellm", "backend": DEFAULT_DECODER, "batch_size": 16},
    assigns=["doc.ents"],
)
def make_padellm_ner(
    nlp: Language, name: str, model: str, labels: list[str] | None, decoder: str, backend: str, batch_size: int
) -> PaDeLLMNER:
    """spaCy factory of :class:`PaDeLLMNER` (config: model, labels, decoder, backend, batch_size);
    model ``"auto"`` is the shipped default for the pipeline's language (``spacy.blank("zh")`` → zh-resume)."""
    if model == AUTO_MODEL:
        model = default_model_for_language(nlp.lang)
    return PaDeLLMNER(nlp, name, model, labels, decoder, backend, batch_size)
