"""What the engine returns: a text's entities and the cost of the batch it was processed in."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ner_service.engine.spans import Entity


@dataclass
class ExtractionStats:
    """Cost of the batch a text was processed in (shared by the texts of that batch)."""

    forward_passes: int = 0
    generated_tokens: int = 0
    unmatched_mentions: int = 0
    latency_ms: float = 0.0
    batch_texts: int = 0
    kv_cache_bytes: int = 0  # peak bytes of KV cache held while decoding (PaDeLLM's branches)
    phase_ms: dict[str, float] = field(default_factory=dict)  # where the time went, by the strategy's phases

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to ``phase_ms[name]``."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.phase_ms[name] = self.phase_ms.get(name, 0.0) + (time.perf_counter() - began) * 1000

    def to_dict(self) -> dict[str, object]:
        return {**self.__dict__, "phase_ms": dict(self.phase_ms)}


@dataclass
class Extraction:
    """Entities of one text."""

    text: str
    entities: list[Entity]
    stats: ExtractionStats = field(default_factory=ExtractionStats)

    def to_dict(self) -> dict[str, object]:
        return {"entities": [e.to_dict() for e in self.entities], "stats": self.stats.to_dict()}
