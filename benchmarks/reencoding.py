"""The re-encoding reference of PaDeLLM: every query re-encodes its window's text, as the
paper's reference implementation does (no prefix cache, no branches).

It plugs into the engine's PaDeLLM strategy as its query runner, so the benchmark and the tests
compare the same strategy with and without the shared prefix:
``engine.extract(texts, strategy=reencoding_padellm(engine))``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from general_decoding import Decoder, Generation, StopCriteria, TokenConstraint, get_decoder, left_pad
from general_decoding.base import position_ids_from_mask
from general_decoding.row_vocabulary import SparseLogprobs, next_logprobs
from ner_service.engine import NEREngine, prompts
from ner_service.engine.chunking import Window
from ner_service.engine.group_decoding import GroupInputs, batches, count_generation, decode_groups
from ner_service.engine.ner_model import NERModel
from ner_service.engine.queries import Branch
from ner_service.engine.results import ExtractionStats
from ner_service.engine.strategies.padellm import PaDeLLM


class ReencodingRunner:
    """A query runner that feeds each query behind its window's whole prefix, from scratch."""

    def __init__(self, ner_model: NERModel, windows: list[Window], one_row: bool = False) -> None:
        self.ner_model = ner_model
        self.prefixes = [prompts.prefix_ids(ner_model.tokenizer, w.text) for w in windows]
        self.vocabulary = None

    def restrict_answers(self, vocabulary) -> None:
        """Answers' logits over the tokens ``vocabulary`` gives each branch, as the engine's runner computes them."""
        self.vocabulary = vocabulary

    def encode(self, branches: list[list[int]], stats: ExtractionStats) -> SparseLogprobs:
        ids, mask = left_pad([p + b for p in self.prefixes for b in branches], self.ner_model.pad_token_id)
        device = self.ner_model.device
        rows = None if self.vocabulary is None else self.vocabulary.rows([(w, b) for w in range(len(self.prefixes)) for b in branches])
        with torch.inference_mode():
            logits = next_logprobs(self.ner_model.model, rows, 1, input_ids=ids.to(device), attention_mask=mask.to(device),
                                   position_ids=position_ids_from_mask(mask).to(device))[:, -1]
        stats.forward_passes += 1
        return SparseLogprobs.dense(logits.view(len(self.prefixes), len(branches), -1))

    def decode(self, branches: list[Branch], decoder: Decoder, max_new_tokens: int, stats: ExtractionStats,
               constraints: Sequence[TokenConstraint] = ()) -> Generation:
        """Each branch re-encoded behind its prefix; a decoder that cannot take the constraints
        (or shares a cache) hands constrained branches to greedy."""
        if constraints and not decoder.supports_constraints:
            decoder = get_decoder("greedy")
        stop = StopCriteria(max_new_tokens, self.ner_model.query_stop_token_ids)
        rows = [self.prefixes[b.window_index] + b.tokens for b in branches]

        def inputs(group: list[int]) -> GroupInputs:
            ids, mask = left_pad([rows[r] for r in group], self.ner_model.pad_token_id)
            return GroupInputs(ids, mask)

        vocabulary = None if self.vocabulary is None else self.vocabulary.rows([(b.window_index, b.tokens) for b in branches])
        out = decode_groups(self.ner_model, decoder, batches(decoder, list(range(len(rows)))), len(rows), stop, inputs, [], stats, constraints,
                            vocabulary)
        count_generation(stats, out)
        return out


def reencoding_padellm(engine: NEREngine) -> PaDeLLM:
    """The engine's PaDeLLM strategy (same settings) with every query re-encoded."""
    return PaDeLLM(engine.ner_model, engine.strategy_options(), runner=ReencodingRunner)
