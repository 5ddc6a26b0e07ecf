"""The autoregressive baseline: the same model writes every mention of every label in one
sequence ("All entities:" answered with ``LABEL: mention`` lines)."""

from __future__ import annotations

from general_decoding import Decoder, StopCriteria, left_pad
from ner_service.engine import prompts
from ner_service.engine.chunking import Window
from ner_service.engine.group_decoding import GroupInputs, batches, count_generation, decode_groups
from ner_service.engine.ner_model import NERModel
from ner_service.engine.results import ExtractionStats
from ner_service.engine.spans import Mention
from ner_service.engine.strategies import register_strategy
from ner_service.engine.strategies.base import Strategy


def answer_mentions(ner_model: NERModel, tokens: list[int], logprobs: list[float], labels: list[str]) -> list[Mention]:
    """The mentions of ``labels`` in an all-entities answer (an open model's lines are read by the labels asked)."""
    lines = prompts.parse_ar_answer(ner_model.tokenizer, tokens, logprobs, labels if ner_model.config.open_labels else None)
    found = [Mention(ner_model.config.label_of(line.label), line.mention, line.logprob) for line in lines]
    return [mention for mention in found if mention.label in labels]


@register_strategy("ar")
class Autoregressive(Strategy):
    """Every window's all-entities answer, decoded as one batch."""

    def mentions(self, windows: list[Window], labels: list[str], decoder: Decoder, stats: ExtractionStats) -> list[list[Mention]]:
        tokenizer, config = self.ner_model.tokenizer, self.ner_model.config
        listed = labels if config.open_labels else None  # an open model is told the labels it is asked for
        ids, mask = left_pad([prompts.ar_prompt_ids(tokenizer, w.text, listed) for w in windows], self.ner_model.pad_token_id)
        # an answer that repeats itself ends at the length its text allows, not only at max_ar_tokens
        names = listed or [config.prompt_name(label) for label in config.labels]
        budgets = [min(config.max_ar_tokens, prompts.ar_answer_budget(tokenizer, names, len(tokenizer(w.text, add_special_tokens=False).input_ids)))
                   for w in windows]
        stop = StopCriteria(max(budgets), self.ner_model.stop_token_ids)
        with stats.phase("answer"):
            out = decode_groups(self.ner_model, decoder, batches(decoder, list(range(len(windows)))), len(windows), stop,
                                lambda rows: GroupInputs(ids[rows], mask[rows]), [], stats)
        for row, budget in enumerate(budgets):  # each row as if decoded alone
            if len(out.tokens[row]) > budget:
                out.tokens[row], out.token_logprobs[row] = out.tokens[row][:budget], out.token_logprobs[row][:budget]
                out.scores[row], out.stopped[row] = sum(out.token_logprobs[row]), False
        count_generation(stats, out)
        return [answer_mentions(self.ner_model, tokens, logprobs, labels) for tokens, logprobs in zip(out.tokens, out.token_logprobs)]
