"""PaDeLLM-NER: for every label, how many mentions, then each k-th mention, all in parallel.

For a batch of windows:

1. one forward runs every window once as a prefix, with all of its count queries as branches
   (:meth:`QueryRunner.encode`): each (window, label) count's first token (with each label's ``count_bias``,
   larger counts are favoured; with a ``count_quantile``, the largest count the model holds that
   probable or more). Next to each count query it speculates: it also feeds the
   mention queries that the counts in ``speculated_counts`` lead to (``PER count:1\nPER 1:``);
   when the count is one of those, its confirmation and its mentions' first tokens come from
   this forward, and the answers start one forward earlier (the same answers: only where the
   tokens are computed changes). Only a lone window speculates: the forward it saves is saved
   only when every label of every window is a hit, and a batch's extra tokens cost their price;
2. one batch of mention queries, one branch per (window, label, k), each continuing its label's
   cached count branch; the same batch decodes the rest of each count (normally its end token)
   to confirm it: a longer count re-asks that label's mentions. A model trained with past-count
   queries (``answers_past_count``) is also asked, for every count (0 too), the mention one past
   it: the one a count one too low left out, or nothing; with a ``past_count_floor``, only where
   the count's own distribution gives a further mention at least that probability;
3. the answers that offset alignment would lose are re-asked (:mod:`.repairs`).

With ``restricted_output`` (the engine's default) every count and mention answer is computed over
the tokens it may take only: digits and stops, the window's own tokens and stops
(:mod:`ner_service.engine.answer_vocabulary`), not over the whole output layer.

A mention's score is the probability of its path: that its label holds a k-th mention (the
count's own distribution, before any bias) times its answer (:meth:`Counts.held_logprob`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from general_decoding import Decoder
from general_decoding.row_vocabulary import SparseLogprobs
from ner_service.engine import prompts
from ner_service.engine.answer_vocabulary import AnswerVocabulary
from ner_service.engine.query_runners import QueryRunner, SharedPrefixRunner
from ner_service.engine.chunking import Window
from ner_service.engine.count_bias import quantile_digits, reach_probabilities
from ner_service.engine.ner_model import NERModel
from ner_service.engine.queries import Answer, Branch, MentionQuery, WindowLabel, answer_of, count_query_ids, mention_queries
from ner_service.engine.results import ExtractionStats
from ner_service.engine.spans import Mention
from ner_service.engine.strategies import register_strategy
from ner_service.engine.strategies.base import Strategy, StrategyOptions
from ner_service.engine.strategies.repairs import Repairs


@dataclass(frozen=True)
class Counts:
    """A batch's counts: ``chosen`` the count of each (window, label), from its first token under
    the label's bias; ``confirm`` the branches that confirm each count above 0 (its query and that
    token: what follows must be the end token); ``at_least[key][d]`` the model's own
    log-probability, before any bias, that the label holds at least d mentions there (the mass of
    the first digits d and above)."""

    chosen: dict[WindowLabel, int]
    confirm: list[Branch]
    at_least: dict[WindowLabel, dict[int, float]]

    def held_logprob(self, query: MentionQuery) -> float:
        """Log-probability that the label holds the mention ``query`` asks for: at least its k
        mentions (past the count, at least the count's: the answer itself says the rest). Added
        to the answer's, it makes a mention's score the probability of the path to it, as an
        autoregressive answer's line holds its label's tokens: a span under two labels goes to
        the one the model is surer of, counts included."""
        tail = self.at_least[query.window_label]
        return tail.get(min(query.k, query.count), min(tail.values(), default=0.0))

    def further_likely(self, query: MentionQuery, floor: float) -> bool:
        """Whether the model gives the label at least ``floor`` probability of holding the mention
        past its count that ``query`` asks for (a count of 9 or more: always)."""
        tail = self.at_least[query.window_label]
        return query.k not in tail or math.exp(tail[query.k]) >= floor


#: Builds the query runner of a batch's windows (the bool: one cache row, for a decoder that shares it).
RunnerFactory = Callable[[NERModel, list[Window], bool], QueryRunner]


@register_strategy("padellm")
class PaDeLLM(Strategy):
    """Label-wise parallel decoding over shared prefixes. ``runner`` runs the queries (the
    engine's: branches over one prefix cache)."""

    def __init__(self, ner_model: NERModel, options: StrategyOptions, runner: RunnerFactory = SharedPrefixRunner) -> None:
        super().__init__(ner_model, options)
        self.runner = runner
        tokenizer = ner_model.tokenizer
        digit_ids = {digit: tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)}
        self.digit_ids = {d: t for d, t in digit_ids.items() if t is not None and t != tokenizer.unk_token_id}

    def mentions(self, windows: list[Window], labels: list[str], decoder: Decoder, stats: ExtractionStats) -> list[list[Mention]]:
        runner = self.runner(self.ner_model, windows, decoder.shares_cache)
        if self.options.restricted_output and hasattr(runner, "restrict_answers"):  # counts and copies: their tokens' logits only
            runner.restrict_answers(AnswerVocabulary(self.ner_model, windows, [count_query_ids(self.ner_model, label) for label in labels]))
        with stats.phase("prefix+count"):
            counted = self._counts(runner, windows, labels, stats)
        counts = counted.chosen
        # The count's remaining digits (usually just the end token) are decoded in the same
        # batch as the mention queries, which assume the count is complete.
        past_count = self.ner_model.config.answers_past_count
        queries = self._mention_queries(counts, counted)
        with stats.phase("mention"):
            answers, continued = self._ask(runner, queries, counted.confirm, decoder, stats)
            # rare: a count of several tokens; ask that label's mentions again, at most one per
            # character of the window (an untrained model may write any number of digits)
            longer = {key: min(int(f"{counts[key]}{digits}"), len(windows[key.window_index].text)) for key, digits in continued.items()}
            if longer:
                kept = [i for i, q in enumerate(queries) if q.window_label not in longer]
                queries, answers = [queries[i] for i in kept], [answers[i] for i in kept]
                again = self._mention_queries(longer, counted)
                queries += again
                answers += self._ask(runner, again, [], decoder, stats)[0]
            if past_count and self.options.past_count_rounds:
                queries, answers = self._ask_past_new_mentions(runner, windows, queries, answers, decoder, stats)
        with stats.phase("repair"):
            Repairs(self.ner_model, self.options).apply(runner, windows, queries, answers, decoder, stats)
        found: list[list[Mention]] = [[] for _ in windows]
        for query, answer in zip(queries, answers):
            if past_count and not answer.mention.text:
                continue  # such a model's "nothing" (as repairs.unaligned reads it): no mention, none unmatched
            mention = answer.mention
            found[query.window_index].append(replace(mention, logprob=counted.held_logprob(query) + mention.logprob))
        return found

    def _mention_queries(self, counts: dict[WindowLabel, int], counted: Counts) -> list[MentionQuery]:
        """The mention queries of ``counts``: each k up to the count and, for a model trained past its
        counts, the one past it where the model gives a further mention at least ``past_count_floor``."""
        queries = mention_queries(counts, self.ner_model.config.answers_past_count)
        return [q for q in queries if not q.past_count or counted.further_likely(q, self.options.past_count_floor)]

    def _ask_past_new_mentions(self, runner: QueryRunner, windows: list[Window], queries: list[MentionQuery], answers: list[Answer], decoder: Decoder,
                               stats: ExtractionStats) -> tuple[list[MentionQuery], list[Answer]]:
        """A count too low by more than one: while the answer past a label's count names a mention
        its other answers do not, ask the one past that (its count raised by one), at most
        ``past_count_rounds`` times (and never more mentions than the window has characters). The model's own empty answer past a count ends the chain, so
        no per-label setting decides how far it goes; each round is one batch of the labels still
        finding mentions, over the same cached prefixes."""
        queries, answers = list(queries), list(answers)
        for _ in range(self.options.past_count_rounds):
            texts: dict[WindowLabel, list[str]] = {}
            last: dict[WindowLabel, tuple[MentionQuery, Answer]] = {}
            for query, answer in zip(queries, answers):
                texts.setdefault(query.window_label, []).append(answer.mention.text)
                if query.past_count and (query.window_label not in last or query.k > last[query.window_label][0].k):
                    last[query.window_label] = (query, answer)
            further = [MentionQuery(q.window_index, q.label, q.k, q.k + 1) for key, (q, a) in last.items()
                       if a.mention.text and texts[key].count(a.mention.text) == 1 and q.k < len(windows[q.window_index].text)]
            if not further:
                break
            queries += further
            answers += self._ask(runner, further, [], decoder, stats)[0]
        return queries, answers

    def _speculated(self, windows: list[Window], labels: list[str]) -> list[list[int]]:
        """The branches the counts of ``speculated_counts`` lead to, for a lone window: each
        count's confirmation (its query and the count) and its mention queries."""
        paths: list[list[int]] = []
        if len(windows) != 1:
            return paths
        for label in labels:
            for count in self.options.speculated_counts:
                if count in self.digit_ids:
                    paths.append(count_query_ids(self.ner_model, label) + [self.digit_ids[count]])
                    paths += [MentionQuery(0, label, count, k).token_ids(self.ner_model) for k in range(1, count + 1)]
        return paths

    def count_log_probs(self, runner: QueryRunner, windows: list[Window], labels: list[str], stats: ExtractionStats) -> SparseLogprobs:
        """A row per (window, label), window by window in the order of ``labels``: the
        log-probabilities of its count's first token (one forward: the windows encoded with
        their count queries and any speculated branches)."""
        counting = [count_query_ids(self.ner_model, label) for label in labels]
        return runner.encode(counting + self._speculated(windows, labels), stats)[:, : len(labels)].flat()

    def biased(self, log_probs: SparseLogprobs, labels: list[str]) -> SparseLogprobs:
        """``log_probs`` (rows as :meth:`count_log_probs` orders them) with each label's
        ``count_bias`` per unit of a first digit added."""
        digits = sorted(self.digit_ids)
        per_label = torch.tensor([[self.options.count_bias.for_label(label) * d for d in digits] for label in labels])
        if not bool(per_label.any()):
            return log_probs
        return log_probs.plus([self.digit_ids[d] for d in digits], per_label.repeat(len(log_probs) // len(labels), 1))

    def _counts(self, runner: QueryRunner, windows: list[Window], labels: list[str], stats: ExtractionStats) -> Counts:
        """Each (window, label)'s count from its first token (biased; or, with a ``count_quantile``,
        the largest digit that probable or more: :mod:`ner_service.engine.count_bias`), the branches that confirm
        each count above 0, and the model's own belief in each count (:class:`Counts`)."""
        log_probs = self.count_log_probs(runner, windows, labels, stats)
        digits = sorted(self.digit_ids)
        tail = reach_probabilities(log_probs.of([self.digit_ids[d] for d in digits]))
        at_least = tail.clamp_min(1e-9).log().tolist()
        if self.options.count_quantile is not None:
            first = [self.digit_ids[digits[i]] for i in quantile_digits(tail, self.options.count_quantile).tolist()]
        else:
            first = self.biased(log_probs, labels).argmax().tolist()
        decode = self.ner_model.tokenizer.decode
        keys = [WindowLabel(w, label) for w in range(len(windows)) for label in labels]
        chosen: dict[WindowLabel, int] = {}
        confirm: list[Branch] = []
        for key, token in zip(keys, first):
            count = chosen[key] = prompts.parse_count(decode([token], skip_special_tokens=True)) or 0
            if count:
                confirm.append(Branch(key.window_index, key.label, count_query_ids(self.ner_model, key.label) + [token]))
        return Counts(chosen, confirm, {key: dict(zip(digits, tail)) for key, tail in zip(keys, at_least)})

    def _ask(self, runner: QueryRunner, queries: list[MentionQuery], confirm: list[Branch], decoder: Decoder,
             stats: ExtractionStats) -> tuple[list[Answer], dict[WindowLabel, str]]:
        """Decode every mention query, plus the count continuations to confirm; return the
        answers and the digits that continued a count."""
        branches = [Branch(q.window_index, q.label, q.token_ids(self.ner_model)) for q in queries] + confirm
        if not branches:
            return [], {}
        out = runner.decode(branches, decoder, self.ner_model.config.max_mention_tokens, stats)
        answers = [answer_of(self.ner_model, q.label, tokens, score) for q, tokens, score in zip(queries, out.tokens, out.scores)]
        decode = self.ner_model.tokenizer.decode
        continued = {}
        for branch, tokens in zip(confirm, out.tokens[len(queries):]):
            digits = re.match(r"\d*", decode(tokens, skip_special_tokens=True))[0]  # type: ignore[index]
            if digits:
                continued[branch.window_label] = digits
        return answers, continued
