"""PaDeLLM's repairs: the mention answers that offset alignment would lose are asked again.

* With ``repair_unaligned``, an answer not in its window (or empty although the count promised
  a mention, from a model not trained to answer nothing) is re-asked restricted to spans of the
  window (:class:`SpanTries`). A weak model writes a mention of its own rather than copying one
  far more often than a strong one. Where the re-asked answer is not kept, the stray CJK characters written before the
  copy are dropped (:func:`without_stray_characters`).
* With ``repair_duplicates``, a surplus copy (an answer repeated under its label more often
  than the window holds it) is re-asked with its first token banned (and within the window's
  spans with ``repair_unaligned``). Such copies mostly come from a model answering the k-th
  query of a long list with a neighbour, or from a count too high. A copy answering the query
  past a count (``answers_past_count``) is not re-asked: the model found no mention more.

A re-asked answer replaces the old one only when its log-probability per token reaches
``REPAIRED_MIN_MEAN_LOGPROB``: otherwise the old one stays, which alignment drops (it is not in
the window, or its occurrences are taken).
"""

from __future__ import annotations

from dataclasses import replace

from general_decoding import BannedFirstToken, Decoder, TokenConstraint, TrieConstraint, get_decoder
from ner_service.engine.query_runners import QueryRunner
from ner_service.engine.chunking import Window
from ner_service.engine.ner_model import NERModel
from ner_service.engine.queries import Answer, Branch, MentionQuery, answer_of
from ner_service.engine.results import ExtractionStats
from ner_service.engine.span_tries import SpanTries
from ner_service.engine.spans import is_cjk, occurrences
from ner_service.engine.strategies.base import StrategyOptions

#: A re-asked mention is kept when its log-probability per token is at least this: below it, few
#: re-asked answers are right and the surplus copies re-asked are mostly one stray character
#: (the measurement: docs/decoders.md).
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
            redo = unaligned(windows, queries, answers, self.ner_model.config.answers_past_count)
            self._keep_confident(answers, redo, self.re_ask(runner, queries, redo, decoder, stats, tries=tries))
            for i in redo:  # an answer still not in its window loses its stray characters
                answers[i] = without_stray_characters(windows[queries[i].window_index].text, answers[i])
        if self.options.repair_duplicates:
            redo = [i for i in surplus_copies(windows, queries, answers) if not queries[i].past_count]
            banned = [answers[i].first_token for i in redo]
            self._keep_confident(answers, redo, self.re_ask(runner, queries, redo, decoder, stats, banned, tries))

    @staticmethod
    def _keep_confident(answers: list[Answer], redo: list[int], again: list[Answer]) -> None:
        """``answers[i]`` becomes its re-asked answer where that one is confident enough."""
        for i, answer in zip(redo, again):
            if answer.mean_logprob >= REPAIRED_MIN_MEAN_LOGPROB:
                answers[i] = answer

    def re_ask(self, runner: QueryRunner, queries: list[MentionQuery], redo: list[int], decoder: Decoder, stats: ExtractionStats,
               banned: list[int | None] | None = None, tries: SpanTries | None = None) -> list[Answer]:
        """Answer the mention queries ``queries[i]`` (i in ``redo``) again, the j-th one's first
        answer token never ``banned[j]`` and, with ``tries``, its answer a span of its window
        (decoded by :data:`CONSTRAINED_DECODER`)."""
        if not redo:
            return []
        asked = [queries[i] for i in redo]
        constraints: list[TokenConstraint] = []
        if banned is not None:
            constraints.append(BannedFirstToken(banned))
        if tries is not None:
            constraints.append(TrieConstraint([tries[q.window_index] for q in asked]))
            decoder = get_decoder(CONSTRAINED_DECODER)
        branches = [Branch(q.window_index, q.label, q.token_ids(self.ner_model)) for q in asked]
        out = runner.decode(branches, decoder, self.ner_model.config.max_mention_tokens, stats, constraints)
        return [answer_of(self.ner_model, q.label, tokens, score) for q, tokens, score in zip(asked, out.tokens, out.scores)]


def unaligned(windows: list[Window], queries: list[MentionQuery], answers: list[Answer], empty_is_an_answer: bool = False) -> list[int]:
    """The answers that are not in their window, and the empty ones unless ``empty_is_an_answer``
    (a model trained to answer nothing when asked past the text's count means it)."""
    return [i for i, (query, answer) in enumerate(zip(queries, answers))
            if (not occurrences(windows[query.window_index].text, answer.mention.text) if answer.mention.text else not empty_is_an_answer)]


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
