"""PaDeLLM's repairs: the mention answers that offset alignment would lose are asked again.

* With ``repair_unaligned``, an answer not in its window (or empty although the count promised
  a mention) is re-asked restricted to spans of the window (:class:`SpanTries`). A weak
  model (zh-resume-v1) writes a mention of its own rather than copying one far more often than a
  strong one. Where the re-asked answer is not kept, the stray CJK characters written before the
  copy are dropped (:func:`without_stray_characters`).
* With ``repair_duplicates``, a surplus copy (an answer repeated under its label more often
  than the window holds it) is replaced by the query's most probable answer that leaves the copy
  (:meth:`Repairs.other_answers`; within the window's spans with ``repair_unaligned``). Such
  copies mostly come from a model answering the k-th query of a list with a neighbour, which
  often shares its first words ("支部委员" for "支部书记", "New York" for "New Jersey"), or
  from a count too high.

A re-asked answer replaces the old one only when its log-probability per token reaches
``REPAIRED_MIN_MEAN_LOGPROB``: otherwise the old one stays, which alignment drops (it is not in
the window, or its occurrences are taken).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from general_decoding import BannedFirstToken, Decoder, TokenConstraint, TrieConstraint, get_decoder
from general_decoding.constraints import Continued
from ner_service.engine.query_runners import QueryRunner
from ner_service.engine.chunking import Window
from ner_service.engine.ner_model import NERModel
from ner_service.engine.queries import Answer, Branch, MentionQuery, answer_of
from ner_service.engine.results import ExtractionStats
from ner_service.engine.span_tries import SpanTries
from ner_service.engine.spans import is_cjk, occurrences
from ner_service.engine.strategies.base import StrategyOptions

#: A re-asked mention is kept when its log-probability per token is at least this: on
#: zh-resume-v1's dev set (its model card), about 23 % of the unaligned answers re-asked between
#: -2.0 and -1.6 were right (break-even at its F1), 9 % between -2.4 and -2.0; of the surplus
#: copies re-asked, those below it are mostly one stray character (docs/decoders.md).
REPAIRED_MIN_MEAN_LOGPROB = -1.6
#: The decoder of answers restricted to the text's spans: they are copies of the text, so
#: copy drafting gives constrained greedy's tokens in fewer forwards.
CONSTRAINED_DECODER = "copy"


class Repairs:
    """Re-asks, in place, the answers alignment would lose (see the module)."""

    def __init__(self, ner_model: NERModel, options: StrategyOptions) -> None:
        self.ner_model, self.options = ner_model, options

    def apply(self, runner: QueryRunner, windows: list[Window], queries: list[MentionQuery], answers: list[Answer],
              decoder: Decoder, stats: ExtractionStats) -> None:
        """Replace the answers of ``queries`` that need it (``answers`` is changed in place)."""
        tries = SpanTries(self.ner_model.tokenizer, [w.text for w in windows], self.ner_model.eos_token_id,
                          self.ner_model.config.max_mention_tokens) if self.options.repair_unaligned else None
        if tries is not None:
            redo = unaligned(windows, queries, answers)
            self._keep_confident(answers, redo, self.re_ask(runner, queries, redo, decoder, stats, tries=tries))
            for i in redo:  # an answer still not in its window loses its stray characters
                answers[i] = without_stray_characters(windows[queries[i].window_index].text, answers[i])
        if self.options.repair_duplicates:
            redo = surplus_copies(windows, queries, answers)
            self._keep_confident(answers, redo, self.other_answers(runner, queries, answers, redo, decoder, stats, tries))

    @staticmethod
    def _keep_confident(answers: list[Answer], redo: list[int], again: list[Answer]) -> None:
        """``answers[i]`` becomes its re-asked answer where that one is confident enough."""
        for i, answer in zip(redo, again):
            if answer.mean_logprob >= REPAIRED_MIN_MEAN_LOGPROB:
                answers[i] = answer

    def re_ask(self, runner: QueryRunner, queries: list[MentionQuery], redo: list[int], decoder: Decoder, stats: ExtractionStats,
               tries: SpanTries | None = None) -> list[Answer]:
        """Answer the mention queries ``queries[i]`` (i in ``redo``) again; with ``tries``, each
        answer a span of its window."""
        return self._decode([AnswerStart(queries[i]) for i in redo], runner, decoder, stats, tries)

    def other_answers(self, runner: QueryRunner, queries: list[MentionQuery], answers: list[Answer], redo: list[int],
                      decoder: Decoder, stats: ExtractionStats, tries: SpanTries | None = None) -> list[Answer]:
        """For each ``answers[i]`` (i in ``redo``), the most probable answer of ``queries[i]``
        that leaves it: one branch per token of it, which keeps the tokens before that one and
        bans that one, decoded on greedily (all in one batch); the branch whose whole answer is
        the most probable wins. Banning only the first token would lose the list's next item
        where it begins as the copy does. With ``tries``, each answer is a span of its window."""
        starts = [AnswerStart(queries[i], answers[i], kept) for i in redo for kept in range(len(answers[i].tokens))]
        found = iter(self._decode(starts, runner, decoder, stats, tries))
        best: list[Answer] = []
        for i in redo:
            candidates = [next(found) for _ in answers[i].tokens]
            best.append(max(candidates, key=lambda answer: answer.mention.logprob, default=answers[i]))
        return best

    def _decode(self, starts: list[AnswerStart], runner: QueryRunner, decoder: Decoder, stats: ExtractionStats,
                tries: SpanTries | None) -> list[Answer]:
        """Each start's whole answer: its kept tokens, then decoded (the first token decoded never
        the one it bans; with ``tries``, within its window's spans, by :data:`CONSTRAINED_DECODER`)."""
        if not starts:
            return []
        constraints: list[TokenConstraint] = []
        if any(start.banned is not None for start in starts):
            constraints.append(BannedFirstToken([start.banned for start in starts]))
        if tries is not None:
            spans = TrieConstraint([tries[start.query.window_index] for start in starts])
            constraints.append(Continued(spans, range(len(starts)), [start.tokens for start in starts]))
            decoder = get_decoder(CONSTRAINED_DECODER)
        branches = [Branch(s.query.window_index, s.query.label, s.query.token_ids(self.ner_model) + list(s.tokens)) for s in starts]
        out = runner.decode(branches, decoder, self.ner_model.config.max_mention_tokens, stats, constraints)
        return [answer_of(self.ner_model, start.query.label, list(start.tokens) + tokens, sum(start.token_logprobs) + score,
                          list(start.token_logprobs) + logprobs)
                for start, tokens, score, logprobs in zip(starts, out.tokens, out.scores, out.token_logprobs)]


@dataclass(frozen=True)
class AnswerStart:
    """Where a mention query is answered again: after the first ``kept`` tokens of an earlier
    ``answer``, the next one of it banned (no answer: from the start, nothing banned)."""

    query: MentionQuery
    answer: Answer | None = None
    kept: int = 0

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.answer.tokens[: self.kept] if self.answer is not None else ()

    @property
    def token_logprobs(self) -> tuple[float, ...]:
        return self.answer.token_logprobs[: self.kept] if self.answer is not None else ()

    @property
    def banned(self) -> int | None:
        return self.answer.tokens[self.kept] if self.answer is not None else None


def unaligned(windows: list[Window], queries: list[MentionQuery], answers: list[Answer]) -> list[int]:
    """The answers that are empty or not in their window."""
    return [i for i, (query, answer) in enumerate(zip(queries, answers))
            if not answer.mention.text or not occurrences(windows[query.window_index].text, answer.mention.text)]


def without_stray_characters(text: str, answer: Answer) -> Answer:
    """``answer``, or where it is not in ``text``, its longest ending that is, once only CJK
    characters are dropped from its start and at least half of it (two characters or more) is
    left: asked for one mention, a model writing Chinese sometimes puts a stray character before
    the copy it meant ("纳出纳" for "出纳", "新瑞士" for "瑞士"). An English answer not in the text
    mixes two names ("Dave Sullivan" for "Mike Sullivan"): no ending of it is better."""
    mention = answer.mention
    if not mention.text or mention.text in text:
        return answer
    length = len(mention.text)
    for cut, char in enumerate(mention.text[:min(length // 2, length - 2)], start=1):
        if not is_cjk(char):
            break
        if mention.text[cut:] in text:
            return replace(answer, mention=replace(mention, text=mention.text[cut:]))
    return answer


def surplus_copies(windows: list[Window], queries: list[MentionQuery], answers: list[Answer]) -> list[int]:
    """The answers that repeat a more probable answer of the same (window, label) beyond the
    number of times the window holds that mention (in order)."""
    copies: dict[tuple[int, str, str], list[int]] = {}
    for i, (query, answer) in enumerate(zip(queries, answers)):
        if answer.mention.text:
            copies.setdefault((query.window_index, query.label, answer.mention.text), []).append(i)
    surplus: list[int] = []
    for (w, _, text), members in copies.items():
        room = len(occurrences(windows[w].text, text))
        if 0 < room < len(members):
            surplus += sorted(members, key=lambda i: answers[i].mention.logprob, reverse=True)[room:]
    return sorted(surplus)
