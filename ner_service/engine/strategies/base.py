"""What every extraction strategy is: how the engine asks the model for a batch's mentions."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from general_decoding import Decoder
from ner_service.engine.chunking import Window
from ner_service.engine.count_bias import CountBias
from ner_service.engine.ner_model import NERModel, NERModelConfig
from ner_service.engine.results import ExtractionStats
from ner_service.engine.spans import Mention

if TYPE_CHECKING:
    from general_decoding.diffusion import BlockDiffusionSampler


@dataclass(frozen=True)
class StrategyOptions:
    """The engine's settings that strategies read, resolved against the model's defaults.

    ``count_bias`` favours larger counts (PaDeLLM: a count's first digit d gets ``d`` times its
    label's bias added to its log-probability); ``count_quantile``, where set, replaces it: PaDeLLM's
    count is the largest d the model gives at least that probability of d or more mentions
    (:mod:`ner_service.engine.count_bias`); ``repair_duplicates`` re-asks a mention answered
    more often than the text holds it; ``repair_unaligned`` re-asks one that is not in the text
    at all, restricted to spans of it; ``speculated_counts`` are the counts whose mention queries
    PaDeLLM feeds with the count queries (:mod:`.padellm`); ``diffusion_sampler`` samples
    Fast-dLLM's answers (None: the default sampler); ``restricted_output`` computes PaDeLLM's
    count and mention logits over the tokens their answers may take only
    (:mod:`ner_service.engine.answer_vocabulary`; False: the whole output layer, the old path);
    ``past_count_rounds``: how many mentions past a count PaDeLLM asks one after another while a
    model trained with past-count queries keeps answering a new one (0: only the one past it);
    ``past_count_floor``: the least probability of a further mention (the count distribution's
    mass above the chosen count) for which that question past the count is asked at all."""

    count_bias: CountBias = CountBias()
    repair_duplicates: bool = True
    repair_unaligned: bool = False
    speculated_counts: tuple[int, ...] = ()
    diffusion_sampler: "BlockDiffusionSampler | None" = None
    restricted_output: bool = False
    past_count_rounds: int = 0
    past_count_floor: float = 0.0
    count_quantile: float | None = None


class Strategy(ABC):
    """Asks a loaded model for the mentions of a batch's windows."""

    name: ClassVar[str] = ""
    #: Why this strategy produces its tokens without a token decoder (empty: it runs one), so
    #: that a decoder named with it is refused rather than ignored.
    decoder_ignored: ClassVar[str] = ""

    def __init__(self, ner_model: NERModel, options: StrategyOptions) -> None:
        self.ner_model, self.options = ner_model, options

    @classmethod
    def unsupported_reason(cls, config: NERModelConfig) -> str | None:
        """Why a model of ``config`` cannot run this strategy (None: it can): a masked-diffusion
        model answers by diffusion only (asked token by token, it answers poorly)."""
        if config.mask_token is not None:
            return f"model {config.name!r} is a masked-diffusion model: strategy {cls.name!r} cannot ask it"
        return None

    @abstractmethod
    def mentions(self, windows: list[Window], labels: list[str], decoder: Decoder, stats: ExtractionStats) -> list[list[Mention]]:
        """Each window's mentions of ``labels`` in reading order per label, their answers' tokens
        decoded by ``decoder``; the batch's cost is added to ``stats``."""
