"""The one NER engine: texts in, entities with character offsets out.

The path of a batch of texts: long texts are cut into windows (:mod:`.chunking`); a
strategy (:mod:`.strategies`: ``padellm``, ``ar``, ``fast_dllm``) asks the model for every
window's mentions, its answers' tokens produced by a :mod:`general_decoding` decoder; the
mentions are mapped to character offsets, and a span predicted under two labels keeps the
more probable label (:mod:`.spans`); where the model says so, a name found in a text keeps one
label throughout it and is tagged wherever it recurs (:mod:`.document_consistency`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from general_decoding import Decoder, get_decoder
from ner_service.engine import prompts
from ner_service.engine.chunking import Window, windows_of
from ner_service.engine.count_bias import CountBias, CountBiasSetting, checked_quantile
from ner_service.engine.defaults import DEFAULT_DECODER, PAST_COUNT_ROUNDS
from ner_service.engine.cpu import torch_dtype
from ner_service.engine.document_consistency import consistent_entities
from ner_service.engine.ner_model import DEFAULT_MODEL, NERModel
from ner_service.engine.options import ExtractOptions
from ner_service.engine.results import Extraction, ExtractionStats
from ner_service.engine.score_calibration import ScoreCalibration
from ner_service.engine.spans import Entity, align_mentions, distinct_spans, resolve_overlaps
from ner_service.engine.strategies import Strategy, StrategyOptions, strategy_class

if TYPE_CHECKING:
    from general_decoding.diffusion import BlockDiffusionSampler

#: The counts whose mention queries PaDeLLM feeds with the count queries, by device. On a GPU a
#: forward's width is nearly free and the forward it saves is not; on this project's 2-core CPU
#: the 25 tokens it adds to a sentence's first forward cost about what the saved forward gains
#: (``benchmarks/padellm_vs_ar.py``: 2.53 against 2.97 forwards, 381 against 365 ms).
SPECULATED_COUNTS = {"cuda": (1,), "cpu": ()}
#: The longest window, in text tokens, of a model that does not say (``window_tokens``).
MAX_WINDOW_TOKENS = 160


class NEREngine:
    """Extract entities with a loaded :class:`NERModel`; shared by CLI, API, spaCy and workers."""

    def __init__(self, ner_model: NERModel, max_window_tokens: int | None = None, max_batch_texts: int = 16,
                 count_bias: CountBiasSetting | CountBias | None = None,
                 repair_duplicates: bool = True, repair_unaligned: bool | None = None,
                 speculated_counts: tuple[int, ...] | None = None, document_consistency: bool | None = None,
                 diffusion_sampler: "BlockDiffusionSampler | None" = None, restricted_output: bool = True,
                 calibrated_scores: bool = True, past_count_rounds: int = PAST_COUNT_ROUNDS,
                 past_count_floor: float | None = None, count_quantile: float | None = None) -> None:
        """``max_window_tokens``, ``count_bias``, ``count_quantile`` (0: none, the count bias
        decides), ``repair_unaligned``, ``document_consistency`` and ``past_count_floor`` default to
        the model's (``ner_model.json``: ``window_tokens``, else :data:`MAX_WINDOW_TOKENS`), ``speculated_counts`` to the device's
        (:data:`SPECULATED_COUNTS`); see :class:`StrategyOptions` for what each strategy setting
        does (``restricted_output`` False: PaDeLLM's answers over the whole output layer, the path
        before issue 78), :mod:`.document_consistency` for ``document_consistency``. With
        ``calibrated_scores``, scores go through the model's calibration of the strategy
        (:mod:`.score_calibration`; False: the raw scores, which a calibration is fitted on)."""
        self.ner_model = ner_model
        self.max_window_tokens = max_window_tokens or ner_model.config.window_tokens or MAX_WINDOW_TOKENS
        self.max_batch_texts = max_batch_texts
        self.count_bias = CountBias.of(ner_model.config.count_bias if count_bias is None else count_bias).checked(ner_model.config.labels)
        self.repair_duplicates = repair_duplicates
        self.repair_unaligned = ner_model.config.repair_unaligned if repair_unaligned is None else repair_unaligned
        self.speculated_counts = SPECULATED_COUNTS.get(ner_model.device.type, ()) if speculated_counts is None else tuple(speculated_counts)
        self.document_consistency = ner_model.config.document_consistency if document_consistency is None else document_consistency
        self.diffusion_sampler = diffusion_sampler
        self.restricted_output = restricted_output
        self.past_count_rounds = past_count_rounds
        self.past_count_floor = ner_model.config.past_count_floor if past_count_floor is None else past_count_floor
        quantile = ner_model.config.count_quantile if count_quantile is None else count_quantile
        self.count_quantile = checked_quantile(quantile or None)  # 0: no quantile, the count bias decides
        self.score_calibrations = {strategy: ScoreCalibration.of(setting) for strategy, setting in ner_model.config.score_calibration.items()
                                   } if calibrated_scores else {}

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT_MODEL, dtype: torch.dtype | str = torch.float32, device: str = "cpu",
             native: bool = True, **options: Any) -> "NEREngine":
        """Load a shipped model by name (or a model folder) and wrap it in an engine; ``dtype``
        ``"auto"`` is bfloat16 where the CPU has bfloat16 instructions, else float32 (:mod:`.cpu`;
        the default of the service's entry points); ``native=False`` keeps transformers' model
        class where this package has its own (:meth:`NERModel.load`)."""
        return cls(NERModel.load(name_or_path, dtype=torch_dtype(dtype, device), device=device, native=native), **options)

    @property
    def labels(self) -> list[str]:
        return list(self.ner_model.config.labels)

    @property
    def name(self) -> str:
        return self.ner_model.config.name

    def options(self, labels: Sequence[object] | None = None, strategy: str | None = None, decoder: str | None = None,
                flat_ner: bool = True) -> ExtractOptions:
        """Options for this engine's model, validated (:meth:`ExtractOptions.validated`; None: the default)."""
        return ExtractOptions(self.name, tuple(labels) if labels is not None else None, strategy, decoder,
                              flat_ner=flat_ner).validated(self.ner_model.config)

    def strategy_options(self) -> StrategyOptions:
        """The engine's settings as its strategies read them."""
        return StrategyOptions(self.count_bias, self.repair_duplicates, self.repair_unaligned, self.speculated_counts, self.diffusion_sampler,
                               restricted_output=self.restricted_output, past_count_rounds=self.past_count_rounds,
                               past_count_floor=self.past_count_floor, count_quantile=self.count_quantile)

    def strategy(self, name: str) -> Strategy:
        """The strategy registered as ``name``, on this engine's model and settings (a name that
        :meth:`ExtractOptions.validated` accepted for the model)."""
        return strategy_class(name)(self.ner_model, self.strategy_options())

    def windows(self, texts: Sequence[str]) -> list[Window]:
        """The windows the texts are read in: each at most ``max_window_tokens`` tokens, and one
        sentence for a model trained on single sentences (``sentence_windows``)."""
        tokenizer = self.ner_model.tokenizer
        return windows_of(texts, lambda piece: prompts.text_token_count(tokenizer, piece), self.max_window_tokens,
                          self.ner_model.config.sentence_windows)

    def extract(
        self,
        texts: Sequence[str],
        labels: Sequence[str] | None = None,
        strategy: str | Strategy | None = None,
        decoder: str | Decoder | None = None,
        flat_ner: bool = True,
    ) -> list[Extraction]:
        """Entities of every text, in batches of ``max_batch_texts``. ``strategy`` is how the
        model is asked: a registered name (``padellm``, ``ar``, ``fast_dllm``) or a configured
        :class:`Strategy`; ``decoder`` how its answers' tokens are produced: a registered
        decoder's name or a configured :class:`Decoder` (e.g. speculative with its draft model).
        Labels and names are validated by :meth:`options` (None: the default); configured
        instances are used as they are. ``flat_ner`` False keeps overlapping entities
        (:attr:`ExtractOptions.flat_ner`)."""
        if isinstance(strategy, Strategy):
            configured_strategy, strategy = strategy, None
        else:
            configured_strategy = None
        if isinstance(decoder, Decoder):
            configured_decoder, decoder = decoder, None
        else:
            configured_decoder = None
        return self.extract_with(self.options(labels, strategy, decoder, flat_ner), texts, configured_strategy, configured_decoder)

    def extract_with(self, options: ExtractOptions, texts: Sequence[str], strategy: Strategy | None = None,
                     decoder: Decoder | None = None) -> list[Extraction]:
        """Entities of every text with ``options`` as :meth:`ExtractOptions.validated` returned
        them for this model (trusted: not checked again); ``strategy`` and ``decoder``, when
        given, are configured instances used instead of the options' names."""
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a string")
        if options.labels is None or options.strategy is None:
            raise ValueError(f"{options} are not validated: ExtractOptions.validated sets every field")
        asking = strategy or self.strategy(options.strategy)
        generator = decoder or get_decoder(options.decoder or DEFAULT_DECODER)  # None: a strategy that runs no decoder
        # an open model is asked each label as its query writes it (with its description), answered under its name
        specs = options.label_specs()
        asked = {(s.prompt if self.ner_model.config.open_labels else s.name): s.name for s in specs}
        results: list[Extraction] = []
        for start in range(0, len(texts), self.max_batch_texts):
            results.extend(self._extract_batch(list(texts[start:start + self.max_batch_texts]), asked, asking, generator, options.flat_ner))
        return results

    def _extract_batch(self, texts: list[str], asked: dict[str, str], strategy: Strategy, decoder: Decoder,
                       flat_ner: bool = True) -> list[Extraction]:
        """``asked`` maps each label as the strategy asks it to the name it comes back under."""
        began = time.perf_counter()
        stats = ExtractionStats(batch_texts=len(texts))
        windows = self.windows(texts)
        mentions = strategy.mentions(windows, list(asked), decoder, stats) if windows else []
        per_text: list[list[Entity]] = [[] for _ in texts]
        for window, found in zip(windows, mentions):
            entities, missing = align_mentions(window.text, found)
            stats.unmatched_mentions += missing
            per_text[window.text_index].extend(
                Entity(e.start + window.offset, e.end + window.offset, e.text, asked.get(e.label, e.label), e.score) for e in entities
            )
        stats.latency_ms = (time.perf_counter() - began) * 1000
        return [Extraction(text, self.text_entities(text, found, strategy.name, flat_ner), stats, found)
                for text, found in zip(texts, per_text)]

    def text_entities(self, text: str, found: list[Entity], strategy: str, flat_ner: bool = True) -> list[Entity]:
        """A text's entities from those found in its windows (or in the pieces the API cut it
        into), offsets in ``text``: flat and consistent where the model says so (``flat_ner``
        False: every label's, overlaps kept), and their scores calibrated for ``strategy``."""
        if flat_ner:
            entities = resolve_overlaps(found, self.ner_model.config.shorter_span_margin)
            if self.document_consistency:
                entities = consistent_entities(text, entities)
        else:
            entities = distinct_spans(found)
        return calibrated(entities, self.score_calibrations.get(strategy, ScoreCalibration()))


def calibrated(entities: list[Entity], calibration: ScoreCalibration) -> list[Entity]:
    """``entities`` with their scores calibrated (after overlaps and consistency, which read the raw ones)."""
    if calibration.is_identity:
        return entities
    return [replace(e, score=calibration.probability(e.score)) for e in entities]

