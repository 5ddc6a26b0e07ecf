"""The ``padellm_ner`` spaCy component: ``nlp.add_pipe("padellm_ner")`` sets ``doc.ents`` with the engine.

Registered through the ``spacy_factories`` entry point of the package, so it works in any pipeline
(``spacy.blank("en")``, ``spacy.blank("zh")``...) once the package is installed. Each entity's
probability is kept in ``span._.padellm_score`` (``threshold`` in the config drops entities scored
below it) and the cost of the engine batch in ``doc._.padellm_stats``. With ``flat_ner`` false,
every label's entities, overlapping ones too, go to the span group ``doc.spans["padellm_ner"]``
(``doc.ents`` cannot overlap: it keeps the flat ones). ``nlp.pipe`` runs one engine batch per ``batch_size`` docs (the config's
``batch_size`` bounds it: a larger ``nlp.pipe(batch_size=...)`` does not raise it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from spacy.language import Language
from spacy.tokens import Doc, Span
from spacy.util import filter_spans, minibatch

from ner_service.engine import EnginePool, Extraction, ExtractOptions, default_model_for_language
from ner_service.engine.labels import warn_unfamiliar
from ner_service.engine.options import refuse_renamed
from ner_service.engine.results import checked_threshold

FACTORY = "padellm_ner"
SCORE_EXTENSION = "padellm_score"
SPANS_KEY = "padellm_ner"  # doc.spans[SPANS_KEY]: every entity, overlaps kept (flat_ner false)
STATS_EXTENSION = "padellm_stats"
CONFIG_FILE = "padellm_ner.json"
AUTO_MODEL = "auto"  # the shipped default model of the pipeline's language

if not Span.has_extension(SCORE_EXTENSION):
    Span.set_extension(SCORE_EXTENSION, default=None)
if not Doc.has_extension(STATS_EXTENSION):
    Doc.set_extension(STATS_EXTENSION, default=None)


class PaDeLLMNER:
    """Sets ``doc.ents`` from PaDeLLM-NER (or another strategy) with the process's engine pool:
    components of the same model share its weights."""

    def __init__(self, nlp: Language, name: str, model: str, labels: list[str | dict[str, str]] | None, strategy: str | None,
                 decoder: str | None, batch_size: int, threshold: float = 0.0, flat_ner: bool = True) -> None:
        self.name = name
        self.configure(model, labels, strategy, decoder, batch_size, threshold, flat_ner)

    def configure(self, model: str, labels: list[str | dict[str, str]] | None, strategy: str | None = None,
                  decoder: str | None = None, batch_size: int = 16, threshold: float = 0.0, flat_ner: bool = True) -> None:
        """Validate and set the options (:meth:`EnginePool.options`, against ``ner_model.json``;
        weights load on first use); ``threshold`` from 0 to 1 (:func:`checked_threshold`)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.threshold = checked_threshold(threshold)
        self.pool = EnginePool.shared()
        self.options: ExtractOptions = self.pool.options(model, labels=labels, strategy=strategy, decoder=decoder, flat_ner=flat_ner)
        self.configured_labels = labels  # as given (None: the model's labels; an open model takes any names), for to_disk
        self.batch_size = batch_size
        # once, when the pipeline is built: its labels do not change between docs
        warn_unfamiliar(self.options.model, self.options.unfamiliar_labels(self.pool.config(self.options.model)), stacklevel=2)

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels this component predicts (spaCy lists them in the pipeline's meta)."""
        return self.options.labels or ()

    def __call__(self, doc: Doc) -> Doc:
        return next(self.pipe([doc]))

    def pipe(self, stream: Iterable[Doc], batch_size: int | None = None) -> Iterator[Doc]:
        """Annotate ``stream``: one engine batch per ``min(batch_size, self.batch_size)`` docs."""
        for batch in minibatch(stream, size=min(batch_size or self.batch_size, self.batch_size)):
            extractions = self.pool.extract(self.options, [doc.text for doc in batch], self.batch_size)
            for doc, extraction in zip(batch, extractions):
                self.set_entities(doc, extraction.above(self.threshold), self.options.flat_ner)
                yield doc

    @staticmethod
    def set_entities(doc: Doc, extraction: Extraction, flat_ner: bool = True) -> None:
        """Align character spans to tokens (expanding), drop overlaps (longest first; for the same
        tokens, the higher score), keep each score in ``span._.padellm_score`` and the batch's
        cost in ``doc._.padellm_stats``; with ``flat_ner`` off, every span in ``doc.spans``."""
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
        if not flat_ner:
            doc.spans[SPANS_KEY] = sorted({(s.start, s.end, s.label_): s for s, _ in candidates}.values(), key=lambda s: (s.start, s.end, s.label_))
        for span in [*doc.ents, *doc.spans.get(SPANS_KEY, [])]:
            span._.set(SCORE_EXTENSION, scores[(span.start, span.end, span.label_)])
        doc._.set(STATS_EXTENSION, extraction.stats.to_dict())

    def to_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> None:
        """Write the options as a small JSON file (the model itself is shipped with the package)."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        labels = list(self.configured_labels) if self.configured_labels is not None else None
        options = {"model": self.options.model, "labels": labels, "strategy": self.options.strategy, "decoder": self.options.decoder,
                   "batch_size": self.batch_size, "threshold": self.threshold, "flat_ner": self.options.flat_ner}
        (folder / CONFIG_FILE).write_text(json.dumps(options, indent=2) + "\n", encoding="utf-8")

    def from_disk(self, path: str | Path, *, exclude: Iterable[str] = ()) -> "PaDeLLMNER":
        """Read the options written by :meth:`to_disk` (an old option name is a ``ValueError``
        naming the new one)."""
        options = json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))
        refuse_renamed(options, where=f" in {CONFIG_FILE}")
        self.configure(**options)
        return self


@Language.factory(
    FACTORY,
    default_config={"model": AUTO_MODEL, "labels": None, "strategy": None, "decoder": None, "batch_size": 16, "threshold": 0.0,
                    "flat_ner": True},
    assigns=["doc.ents", "doc.spans"],
)
def make_padellm_ner(
    nlp: Language, name: str, model: str, labels: list[str | dict[str, str]] | None, strategy: str | None, decoder: str | None,
    batch_size: int, threshold: float, flat_ner: bool
) -> PaDeLLMNER:
    """spaCy factory of :class:`PaDeLLMNER` (config: model, labels, strategy (default
    ``padellm``), decoder (default ``copy``), batch_size, threshold (default 0: every entity),
    flat_ner (default true; false: every entity also in ``doc.spans["padellm_ner"]``, overlaps
    kept)); model ``"auto"`` is the shipped default for the pipeline's language
    (``spacy.blank("zh")`` → zh-resume)."""
    if model == AUTO_MODEL:
        model = default_model_for_language(nlp.lang)
    return PaDeLLMNER(nlp, name, model, labels, strategy, decoder, batch_size, threshold, flat_ner)
