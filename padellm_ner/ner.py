"""The Python face of the engine, shaped like GLiNER's: load a model by name, ask a text for
entities, get plain dicts back.

    import padellm_ner
    ner = padellm_ner.load("en-conll03")
    ner.predict_entities("Angela Merkel visited Paris .", labels=["PER", "LOC"], threshold=0.5)
    # [{"start": 0, "end": 13, "text": "Angela Merkel", "label": "PER", "score": 0.99...}, ...]

Labels are names, or ``{"name": ..., "description": ...}`` for an open-label model; they go to
the engine's options (:meth:`ner_service.engine.ExtractOptions.validated`) as they are, so a
label the model cannot answer is refused here as everywhere else. ``threshold`` drops entities
whose score (the probability the model gave them) is below it; by default none, as everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ner_service.engine import Extraction, NEREngine

#: The default of every entry point (:func:`ner_service.engine.results.checked_threshold`): every
#: entity the model's counts give. A threshold trades recall for precision, and how much depends
#: on the model: on labels it never saw, ``open`` gives most right mentions less than even odds.
DEFAULT_THRESHOLD = None

Label = str | Mapping[str, str]


def _entity(entity: Any) -> dict[str, Any]:
    return {"start": entity.start, "end": entity.end, "text": entity.text, "label": entity.label, "score": entity.score}


class PadeLLMNER:
    """A loaded model: :meth:`predict_entities` for one text, :meth:`batch_predict_entities` for
    several (one engine call, batched as the engine batches)."""

    def __init__(self, engine: NEREngine, strategy: str | None = None, decoder: str | None = None) -> None:
        self.engine = engine
        self.strategy = strategy
        self.decoder = decoder

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def labels(self) -> list[str]:
        """The labels answered when none are named."""
        return self.engine.labels

    def extract(self, texts: Sequence[str], labels: Sequence[Label] | None = None, threshold: float | None = DEFAULT_THRESHOLD,
                strategy: str | None = None, decoder: str | None = None, flat_ner: bool = True) -> list[Extraction]:
        """The engine's :class:`Extraction` of each text (entities and the batch's cost), below
        ``threshold`` dropped; ``flat_ner`` False keeps overlapping entities (nested spans, and
        one span under several labels)."""
        from ner_service.engine.labels import warn_unfamiliar
        from ner_service.engine.results import checked_threshold

        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings (predict_entities takes one string)")
        threshold = checked_threshold(threshold)
        options = self.engine.options(labels, strategy or self.strategy, decoder or self.decoder, flat_ner)
        warn_unfamiliar(self.name, options.unfamiliar_labels(self.engine.ner_model.config), stacklevel=3)
        return [result.above(threshold) for result in self.engine.extract_with(options, list(texts))]

    def predict_entities(self, text: str, labels: Sequence[Label] | None = None, threshold: float | None = DEFAULT_THRESHOLD,
                         strategy: str | None = None, decoder: str | None = None, flat_ner: bool = True) -> list[dict[str, Any]]:
        """The entities of ``text`` as ``{"start", "end", "text", "label", "score"}`` dicts in
        reading order (``end`` exclusive; ``text[start:end]`` is the mention). ``labels`` None:
        the model's own; ``flat_ner`` False: entities may overlap, as in GLiNER."""
        if not isinstance(text, str):
            raise TypeError("predict_entities takes one string; batch_predict_entities takes a list")
        [result] = self.extract([text], labels, threshold, strategy, decoder, flat_ner)
        return [_entity(e) for e in result.entities]

    def batch_predict_entities(self, texts: Sequence[str], labels: Sequence[Label] | None = None,
                               threshold: float | None = DEFAULT_THRESHOLD, strategy: str | None = None,
                               decoder: str | None = None, flat_ner: bool = True) -> list[list[dict[str, Any]]]:
        """:meth:`predict_entities` of each text, in one engine call."""
        return [[_entity(e) for e in result.entities] for result in self.extract(texts, labels, threshold, strategy, decoder, flat_ner)]

    def __repr__(self) -> str:
        return f"PadeLLMNER({self.name!r}, labels={self.labels})"


def load(model: str | Path = "en-conll03", device: str = "cpu", dtype: str | None = None, strategy: str | None = None,
         decoder: str | None = None, **engine_options: Any) -> PadeLLMNER:
    """A shipped model by name (``padellm-ner models`` lists them) or a folder holding
    ``ner_model.json`` (what ``padellm-ner train`` writes), on ``device`` in ``dtype``
    ("auto", "float32" or "bfloat16"; by default what the command line and the API load in:
    ``NER_DTYPE``, else auto, bfloat16 on a CPU with bfloat16 instructions, as the model cards
    measure). ``strategy`` and ``decoder`` are the defaults of its calls; ``engine_options`` go
    to :class:`ner_service.engine.NEREngine` (``count_bias``, ...)."""
    from ner_service.engine import NEREngine
    from ner_service.engine.cpu import configured_dtype

    engine = NEREngine.load(model, dtype=dtype or configured_dtype(), device=device, **engine_options)  # as the engine pool resolves it
    ner = PadeLLMNER(engine, strategy, decoder)
    engine.options(None, strategy, decoder)  # a strategy or decoder the model cannot run is refused now, not at the first text
    return ner
