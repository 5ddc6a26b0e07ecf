"""What the engine returns: a text's entities and the cost of the batch it was processed in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ner_service.engine.spans import Entity

if TYPE_CHECKING:
    from general_decoding import Decoder


@dataclass
class ExtractionStats:
    """Cost of the batch a text was processed in (shared by the texts of that batch)."""

    forward_passes: int = 0
    generated_tokens: int = 0
    #: Answers that ran to their token limit instead of ending with the end token.
    unfinished_answers: int = 0
    unmatched_mentions: int = 0
    latency_ms: float = 0.0
    batch_texts: int = 0
    kv_cache_bytes: int = 0  # peak bytes of KV cache held while decoding (PaDeLLM's branches)
    phase_ms: dict[str, float] = field(default_factory=dict)  # where the time went, by the strategy's phases
    #: The token decoders that produced the batch's answers, in the order they first ran: the one
    #: asked for, and any the strategy used instead (greedy for a constrained re-ask of a decoder
    #: that shares the cache, copy for answers restricted to the text's spans); none for a
    #: strategy without a token decoder (``fast_dllm``).
    decoders: list[str] = field(default_factory=list)

    def ran(self, decoder: "Decoder | str") -> None:
        """Record that ``decoder`` (or the decoder of that name) produced some of the batch's tokens."""
        name = decoder if isinstance(decoder, str) else decoder.name or type(decoder).__name__
        if name not in self.decoders:
            self.decoders.append(name)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to ``phase_ms[name]``."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.phase_ms[name] = self.phase_ms.get(name, 0.0) + (time.perf_counter() - began) * 1000

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "phase_ms": dict(self.phase_ms), "decoders": list(self.decoders)}

    @classmethod
    def combined(cls, parts: "list[ExtractionStats]") -> "ExtractionStats":
        """The cost of one text processed in several calls: counts, times and phases add up; the
        batch size and the cache peak are the largest of them; the decoders are all that ran."""
        stats = cls(
            forward_passes=sum(p.forward_passes for p in parts),
            generated_tokens=sum(p.generated_tokens for p in parts),
            unmatched_mentions=sum(p.unmatched_mentions for p in parts),
            latency_ms=sum(p.latency_ms for p in parts),
            batch_texts=max(p.batch_texts for p in parts),
            kv_cache_bytes=max(p.kv_cache_bytes for p in parts),
        )
        for part in parts:
            for phase, ms in part.phase_ms.items():
                stats.phase_ms[phase] = stats.phase_ms.get(phase, 0.0) + ms
            for decoder in part.decoders:
                stats.ran(decoder)
        return stats


@dataclass
class Extraction:
    """Entities of one text. ``found`` keeps them as the text's windows gave them (raw scores,
    overlaps unresolved; None: ``entities``), so that the pieces the API cut a text into are made
    one text's entities exactly as its windows would be (:meth:`NEREngine.text_entities`)."""

    text: str
    entities: list[Entity]
    stats: ExtractionStats = field(default_factory=ExtractionStats)
    found: list[Entity] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, object]:
        return {"entities": [e.to_dict() for e in self.entities], "stats": self.stats.to_dict()}

    def above(self, threshold: float) -> "Extraction":
        """This text's entities whose score is at least ``threshold`` (:func:`checked_threshold`);
        0 keeps them all."""
        threshold = checked_threshold(threshold)
        if threshold == 0:
            return self
        return Extraction(self.text, [e for e in self.entities if e.score >= threshold], self.stats, self.found)


def checked_threshold(threshold: float | None) -> float:
    """``threshold`` as a float in [0, 1] (None: 0, every entity); a ValueError otherwise. An
    entity's score is the probability the model gave its answer (PaDeLLM: its label's count
    included), so every entry point drops entities below the same number."""
    if threshold is None:
        return 0.0
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be a number from 0 to 1, not {threshold!r}")
    return float(threshold)
