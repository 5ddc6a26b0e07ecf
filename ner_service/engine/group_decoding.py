"""Running a :mod:`general_decoding` decoder over groups of the engine's rows, one call per
group, with the batch's cost counted in its :class:`ExtractionStats`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import Cache

from general_decoding import Decoder, Generation, StopCriteria, TokenConstraint
from general_decoding.constraints import continued
from general_decoding.kv_cache import cache_bytes
from general_decoding.row_vocabulary import RowVocabulary
from ner_service.engine.ner_model import NERModel
from ner_service.engine.results import ExtractionStats


@dataclass(frozen=True)
class GroupInputs:
    """One decoder call's inputs: ids not yet cached, the attention mask over cache and ids,
    the cache, and each row's tokens already in it (what a drafter may copy from)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    cache: Cache | None = None
    context_ids: list[list[int]] | None = None


def batches(decoder: Decoder, rows: list[int]) -> list[list[int]]:
    """``rows`` as one batch, or one by one for a decoder that does not batch."""
    if not rows:
        return []
    return [rows] if decoder.supports_batch else [[r] for r in rows]


def empty_generation(rows: int) -> Generation:
    """A generation of ``rows`` rows that emitted nothing yet."""
    return Generation([[] for _ in range(rows)], [[] for _ in range(rows)], [0.0] * rows, [False] * rows)


def decode_groups(
    ner_model: NERModel,
    decoder: Decoder,
    groups: Sequence[list[int]],
    total: int,
    stop: StopCriteria,
    inputs: Callable[[list[int]], GroupInputs],
    held: Sequence[Cache],
    stats: ExtractionStats,
    constraints: Sequence[TokenConstraint] = (),
    vocabulary: RowVocabulary | None = None,
) -> Generation:
    """Decode each group of rows (of ``total``) in one :meth:`Decoder.generate` call;
    ``inputs(group)`` gives its inputs and ``constraints`` and ``vocabulary`` (the tokens each row
    may take, for a decoder that ``supports_vocabulary``; else the whole output layer) number rows
    as ``total`` does.
    ``held`` are the caches kept meanwhile (for ``kv_cache_bytes``); rows in no group stay empty.
    Only ``kv_cache_bytes`` and the decoder that ran are recorded here: callers count forwards
    and tokens once."""
    merged = empty_generation(total)
    if groups:
        stats.ran(decoder)
    for rows in groups:
        group = inputs(rows)
        out = decoder.generate(ner_model.model, group.input_ids.to(ner_model.device), stop,
                               attention_mask=group.attention_mask.to(ner_model.device), past_key_values=group.cache,
                               context_ids=group.context_ids, constraints=continued(constraints, rows, [[] for _ in rows]),
                               vocabulary=vocabulary.rows(rows) if vocabulary is not None and decoder.supports_vocabulary else None)
        for position, row in enumerate(rows):
            merged.tokens[row] = out.tokens[position]
            merged.token_logprobs[row] = out.token_logprobs[position]
            merged.scores[row] = out.scores[position]
            merged.stopped[row] = out.stopped[position]
        extra = [group.cache] if group.cache is not None and all(group.cache is not c for c in held) else []
        stats.kv_cache_bytes = max(stats.kv_cache_bytes, sum(cache_bytes(c) for c in [*held, *extra]))
        merged.forward_passes += out.forward_passes
        merged.accepted_per_pass.extend(out.accepted_per_pass)
    return merged


def count_generation(stats: ExtractionStats, generation: Generation) -> None:
    """Add a generation's forwards, emitted tokens and unfinished answers to ``stats``."""
    stats.forward_passes += generation.forward_passes
    stats.generated_tokens += sum(len(t) for t in generation.tokens)
    stats.unfinished_answers += sum(not stopped for stopped in generation.stopped)
