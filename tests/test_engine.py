"""The engine's contract on the tiny model: validation, empty and long texts, batching."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.reencoding import ReencodingRunner, reencoding_padellm
from general_decoding import TokenBias, UnknownDecoderError, choose, get_decoder
from ner_service.engine import ExtractionStats, NEREngine, UnknownLabelError, UnknownStrategyError
from ner_service.engine.query_runners import SharedPrefixRunner
from ner_service.engine.model_loading import ModelNotFoundError
from ner_service.engine.count_bias import CountBias
from ner_service.engine.queries import Answer, Branch, MentionQuery, WindowLabel, answer_of, count_query_ids
from ner_service.engine.span_tries import SpanTries
from ner_service.engine.spans import Mention
from ner_service.engine.strategies.padellm import Counts, PaDeLLM
from ner_service.engine.strategies.repairs import Repairs, without_stray_characters
from tests.entity_lists import assert_same_entities

TEXTS = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "", "BRUSSELS 1996-08-22", "   "]


@pytest.mark.parametrize("strategy", ["padellm", "ar"])
def test_empty_text_gives_no_entities_and_no_work(tiny_engine: NEREngine, strategy: str) -> None:
    (result,) = tiny_engine.extract([""], strategy=strategy)
    assert result.entities == [] and result.stats.forward_passes == 0
    assert tiny_engine.extract([], strategy=strategy) == []


def test_unknown_label_lists_the_models_labels(tiny_engine: NEREngine) -> None:
    with pytest.raises(UnknownLabelError, match="'DISEASE'.*LOC, MISC, ORG, PER"):
        tiny_engine.extract(["x"], labels=["PER", "DISEASE"])


def test_unknown_strategy_backend_and_model(tiny_engine: NEREngine) -> None:
    with pytest.raises(UnknownStrategyError, match="padellm, ar"):
        tiny_engine.extract(["x"], strategy="beam")
    with pytest.raises(UnknownDecoderError):
        tiny_engine.extract(["x"], decoder="nope")
    with pytest.raises(TypeError):
        tiny_engine.extract("a string, not a list")
    with pytest.raises(ModelNotFoundError, match="models: .*tiny-conll03"):
        NEREngine.load("no-such-model")


@pytest.mark.parametrize("strategy", ["padellm", "ar"])
def test_batch_equals_one_by_one_and_prefix_sharing_equals_reencoding(tiny_engine: NEREngine, strategy: str) -> None:
    batched = tiny_engine.extract(TEXTS, strategy=strategy)
    alone = [tiny_engine.extract([t], strategy=strategy)[0] for t in TEXTS]
    reencoding = tiny_engine.extract(TEXTS, strategy=reencoding_padellm(tiny_engine) if strategy == "padellm" else strategy)
    assert_same_entities([r.entities for r in batched], [r.entities for r in alone])
    assert_same_entities([r.entities for r in reencoding], [r.entities for r in alone])
    assert batched[0].stats.generated_tokens == sum(r.stats.generated_tokens for r in alone)
    assert batched[0].stats.forward_passes > 0


def test_long_text_is_windowed_with_offsets_kept(tiny_engine: NEREngine) -> None:
    text = " ".join(["Peter Blackburn visited BRUSSELS on Tuesday ."] * 120)
    engine = NEREngine(tiny_engine.ner_model, max_window_tokens=48)
    windows = engine.windows([text])
    assert len(windows) > 10 and all(text[w.offset:w.offset + len(w.text)] == w.text for w in windows)
    for strategy in ("padellm", "ar"):
        (result,) = engine.extract([text], strategy=strategy)
        assert len(result.entities) >= len(windows), "entities found in the windows"
        assert all(text[e.start:e.end] == e.text for e in result.entities)


def test_the_model_says_how_long_a_window_it_reads(tiny_engine: NEREngine) -> None:
    from dataclasses import replace

    from ner_service.engine.ner_model import NERModel

    text = "London ( The Oval ) : Warwickshire 195 , Surrey 429-7 ( C. Lewis 80 not out , M. Butcher 70 , G. Kersey 63 ) ."
    tokens = len(tiny_engine.ner_model.tokenizer(text, add_special_tokens=False).input_ids)
    assert [w.text for w in tiny_engine.windows([text])] == [text]  # the engine's budget holds it whole
    config = replace(tiny_engine.ner_model.config, sentence_windows=True, window_tokens=tokens // 2)
    model = NERModel(tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer, config, tiny_engine.ner_model.path)
    windows = NEREngine(model).windows([text])
    assert len(windows) > 1 and all(w.text.endswith((",", ":", ")", ".")) for w in windows)
    assert " ".join(w.text for w in windows) == text
    assert len(NEREngine(model, max_window_tokens=tokens).windows([text])) == 1  # an engine's own budget wins


def test_an_ar_answer_ends_at_the_length_its_text_allows(tiny_engine: NEREngine, data_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    from corpora import read_corpus
    from ner_service.engine import prompts
    from ner_service.engine.ner_model import NERModel

    tokenizer, config = tiny_engine.ner_model.tokenizer, tiny_engine.ner_model.config
    names = [config.prompt_name(label) for label in config.labels]

    def budget(text: str) -> int:
        return prompts.ar_answer_budget(tokenizer, names, len(tokenizer(text, add_special_tokens=False).input_ids))

    for example in read_corpus(data_dir / "conll2003" / "dev.txt")[:300]:  # every true answer fits
        answer = prompts.ar_answer([(s.label, example.text[s.start:s.end]) for s in example.spans])
        assert len(tokenizer(answer, add_special_tokens=False).input_ids) <= budget(example.text), example.text
    monkeypatch.setattr(NERModel, "stop_token_ids", property(lambda self: frozenset({-1})))  # a model that never ends its answer
    texts = ["EU rejects it .", "Peter Blackburn met John Smith in Brussels on Friday ."]
    batched = tiny_engine.extract(texts, strategy="ar", decoder="greedy")
    alone = [tiny_engine.extract([text], strategy="ar", decoder="greedy")[0] for text in texts]
    for text, one in zip(texts, alone):
        assert one.stats.generated_tokens == budget(text) < config.max_ar_tokens and one.stats.unfinished_answers == 1
    assert_same_entities([r.entities for r in batched], [r.entities for r in alone])  # each row as if decoded alone
    assert batched[0].stats.unfinished_answers == 2


def test_count_bias_favours_larger_counts(tiny_engine: NEREngine) -> None:
    tokenizer = tiny_engine.ner_model.tokenizer
    one, two = tokenizer.convert_tokens_to_ids(["1", "2"])
    logprobs = torch.full((1, len(tokenizer)), -30.0)
    logprobs[0, one], logprobs[0, two] = 1.0, 0.8  # "1" slightly more probable than "2"
    digits = tiny_engine.strategy("padellm").digit_ids
    assert digits[1] == one and digits[2] == two
    assert choose(logprobs.clone(), [TokenBias({t: 0.0 * d for d, t in digits.items()})], [0], [[]]).item() == one
    assert choose(logprobs.clone(), [TokenBias({t: 0.5 * d for d, t in digits.items()})], [0], [[]]).item() == two
    plain = NEREngine(tiny_engine.ner_model, count_bias=0.0).extract(TEXTS[:2])
    eager = NEREngine(tiny_engine.ner_model, count_bias=3.0).extract(TEXTS[:2])  # every count becomes large
    assert eager[0].stats.generated_tokens > plain[0].stats.generated_tokens  # more mention queries were answered
    assert all(TEXTS[i][e.start:e.end] == e.text for i, r in enumerate(eager) for e in r.entities)


def test_a_mention_is_as_probable_as_its_path_its_count_included() -> None:
    """The probability that a label holds the k-th mention a query asks for: at least k mentions,
    past the count at least the count's (the answer says the rest), under a count of 0 certain."""
    at_least = {0: 0.0, 1: -0.1, 2: -0.7, 3: -2.3}  # log P(count >= d)
    counts = Counts({WindowLabel(0, "PER"): 2, WindowLabel(0, "LOC"): 0}, [], {WindowLabel(0, "PER"): at_least, WindowLabel(0, "LOC"): at_least})
    assert [counts.held_logprob(MentionQuery(0, "PER", 2, k)) for k in (1, 2, 3)] == [-0.1, -0.7, -0.7]
    assert counts.held_logprob(MentionQuery(0, "LOC", 0, 1)) == 0.0
    assert counts.held_logprob(MentionQuery(0, "PER", 12, 11)) == -2.3  # a count of two digits: the least probable known


def test_a_mentions_score_holds_the_models_belief_in_its_count_not_the_bias(tiny_engine: NEREngine) -> None:
    """Each mention PaDeLLM returns has its answer's log-probability plus its label's
    :meth:`Counts.held_logprob`; under a bias that makes every count large, the counts the bias
    pushed past the model's belief score below their answers."""

    class Recording(PaDeLLM):
        def _counts(self, *args):
            self.counted = super()._counts(*args)
            return self.counted

        def _ask(self, runner, queries, confirm, decoder, stats):
            answers, continued = super()._ask(runner, queries, confirm, decoder, stats)
            self.asked += list(zip(queries, answers))
            return answers, continued

    options = replace(tiny_engine.strategy_options(), count_bias=CountBias(3.0), repair_duplicates=False, repair_unaligned=False)
    strategy = Recording(tiny_engine.ner_model, options)
    strategy.asked = []
    windows = tiny_engine.windows([TEXTS[0]])
    (found,) = strategy.mentions(windows, list(tiny_engine.labels), get_decoder("greedy"), ExtractionStats())
    final_count = {}  # a count of several digits asks its label again: the last count asked is the one answered
    for query, _ in strategy.asked:
        final_count[query.label] = max(final_count.get(query.label, 0), query.count)
    answered = [(q, a) for q, a in strategy.asked if q.count == final_count[q.label]]
    held = [strategy.counted.held_logprob(q) for q, _ in answered]
    expected = sorted((a.mention.label, a.mention.text, round(a.mention.logprob + h, 4)) for (_, a), h in zip(answered, held))
    assert found and sorted((m.label, m.text, round(m.logprob, 4)) for m in found) == expected
    assert all(h <= 1e-6 for h in held) and min(held) < -0.1


RUNNERS = {"shared_prefix": SharedPrefixRunner, "reencoding": ReencodingRunner}


def _asked(engine: NEREngine, runner_name: str, text: str, labels: list[str], queries: list[MentionQuery]):
    """The text's windows, a runner that encoded them with their count queries, and what each
    mention query answers unconstrained."""
    windows = engine.windows([text])
    runner = RUNNERS[runner_name](engine.ner_model, windows)
    runner.encode([count_query_ids(engine.ner_model, label) for label in labels], ExtractionStats())
    branches = [Branch(q.window_index, q.label, q.token_ids(engine.ner_model)) for q in queries]
    out = runner.decode(branches, get_decoder("greedy"), engine.ner_model.config.max_mention_tokens, ExtractionStats())
    plain = [answer_of(engine.ner_model, q.label, tokens, score) for q, tokens, score in zip(queries, out.tokens, out.scores)]
    return windows, runner, plain


def _repairs(engine: NEREngine, **options: object) -> Repairs:
    return Repairs(engine.ner_model, replace(engine.strategy_options(), **options))


@pytest.mark.parametrize("runner", ["shared_prefix", "reencoding"])
def test_surplus_duplicate_mentions_are_re_asked_with_their_first_token_banned(tiny_engine: NEREngine, runner: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ner_service.engine.strategies import repairs as repairs_module

    text = "Peter Blackburn met Peter Blackburn and John Smith in BRUSSELS ."
    queries = [MentionQuery(0, "PER", 4, k) for k in (1, 2, 3, 4)]
    windows, asking, plain = _asked(tiny_engine, runner, text, ["PER"], queries)
    greedy, repairs = get_decoder("greedy"), _repairs(tiny_engine, repair_unaligned=False)
    first = [a.first_token for a in plain]

    def answers() -> list[Answer]:
        # "Peter Blackburn" occurs twice (both copies stay); "John Smith" once: the less probable copy is re-asked
        found = [("Peter Blackburn", -0.1), ("Peter Blackburn", -0.2), ("John Smith", -0.3), ("John Smith", -0.9)]
        return [Answer(Mention("PER", mention, logprob), first[row]) for row, (mention, logprob) in enumerate(found)]

    (again,) = repairs.re_ask(asking, queries, [3], greedy, ExtractionStats(), [first[3]])
    assert again.first_token != first[3]  # the first token it had is banned
    monkeypatch.setattr(repairs_module, "REPAIRED_MIN_MEAN_LOGPROB", again.mean_logprob + 0.01)
    kept = answers()
    repairs.apply(asking, windows, queries, kept, greedy, ExtractionStats())
    assert kept == answers()  # a re-asked answer less sure than the threshold: the copy stays, which alignment drops
    monkeypatch.setattr(repairs_module, "REPAIRED_MIN_MEAN_LOGPROB", again.mean_logprob - 0.01)
    repaired = answers()
    repairs.apply(asking, windows, queries, repaired, greedy, ExtractionStats())
    assert repaired[:3] == answers()[:3]
    assert (repaired[3].mention.text, repaired[3].first_token) == (again.mention.text, again.first_token)
    # the cached and the re-encoding runners repair alike
    _, other, _ = _asked(tiny_engine, "reencoding" if runner == "shared_prefix" else "shared_prefix", text, ["PER"], queries)
    again = answers()
    repairs.apply(other, windows, queries, again, greedy, ExtractionStats())
    assert again[3].mention.text == repaired[3].mention.text and again[3].first_token == repaired[3].first_token
    assert again[3].mention.logprob == pytest.approx(repaired[3].mention.logprob, abs=1e-3)


def test_a_model_trained_with_past_count_queries_is_asked_one_mention_past_every_count(tiny_engine: NEREngine) -> None:
    """For such a model PaDeLLM asks each (window, label) for the k-th mentions up to its count
    and one more, under a count of 0 too; for any other model only up to the count."""
    asked: list[list[int]] = []

    class Recording(SharedPrefixRunner):
        def decode(self, branches, decoder, max_new_tokens, stats, constraints=()):
            asked.extend(b.tokens for b in branches)
            return super().decode(branches, decoder, max_new_tokens, stats, constraints)

    text, labels = "Peter Blackburn met John Smith in BRUSSELS .", ["LOC", "MISC", "ORG", "PER"]

    def queries_asked(answers_past_count: bool) -> tuple[dict[str, int], set[tuple[str, int, int]]]:
        model = replace(tiny_engine.ner_model, config=replace(tiny_engine.ner_model.config, answers_past_count=answers_past_count))
        options = replace(tiny_engine.strategy_options(), repair_duplicates=False, past_count_rounds=0)
        strategy = PaDeLLM(model, options, runner=lambda m, w, _: Recording(m, w))
        windows = tiny_engine.windows([text])
        asked.clear()
        runner = SharedPrefixRunner(model, windows)
        counts = strategy._counts(runner, windows, labels, ExtractionStats()).chosen
        strategy.mentions(windows, labels, get_decoder("greedy"), ExtractionStats())
        every = {(label, n, k) for label in labels for n in range(10) for k in range(1, 11)}
        found = {key for key in every if MentionQuery(0, key[0], key[1], key[2]).token_ids(model) in asked}
        return {key.label: n for key, n in counts.items()}, found

    counts, plain = queries_asked(False)
    assert plain == {(label, n, k) for label, n in counts.items() for k in range(1, n + 1)}
    counts, past = queries_asked(True)
    assert past == {(label, n, k) for label, n in counts.items() for k in range(1, n + 2)}
    assert len(past) == len(plain) + len(labels)


@pytest.mark.parametrize("floor", [0.0, 0.01, 0.4])
def test_padellm_asks_past_a_count_only_where_the_model_gives_a_further_mention_that_chance(
        tiny_engine: NEREngine, floor: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The question past a count is asked where the count's own distribution puts at least
    ``past_count_floor`` on more mentions: LOC (0 chosen, 0.5 on 1 or more) always, PER (1 chosen,
    0.3 on 2 or more) under a floor up to 0.3, MISC (0 chosen, 0.001 on more) only with no floor."""
    import math

    asked: list[MentionQuery] = []
    further = {"LOC": (0, 0.5), "PER": (1, 0.3), "MISC": (0, 0.001)}  # label: (count, probability of more)

    def scripted_ask(self, runner, queries, confirm, decoder, stats):
        asked.extend(queries)
        return [Answer(Mention(q.label, "", -0.1), None) for q in queries], {}

    def scripted_counts(self, runner, windows, labels, stats):
        keys = [WindowLabel(0, label) for label in labels]
        tails = {key: {d: 0.0 if d <= further[key.label][0] else math.log(further[key.label][1]) for d in range(10)} for key in keys}
        return Counts({key: further[key.label][0] for key in keys}, [], tails)

    monkeypatch.setattr(PaDeLLM, "_ask", scripted_ask)
    monkeypatch.setattr(PaDeLLM, "_counts", scripted_counts)
    model = replace(tiny_engine.ner_model, config=replace(tiny_engine.ner_model.config, answers_past_count=True, repair_unaligned=False))
    options = replace(tiny_engine.strategy_options(), repair_duplicates=False, repair_unaligned=False, past_count_floor=floor)
    PaDeLLM(model, options).mentions(tiny_engine.windows(["Ann met Bob in Rome ."]), list(further), get_decoder("greedy"), ExtractionStats())
    past = {q.label for q in asked if q.past_count}
    assert past == {label for label, (_, more) in further.items() if more >= floor}
    assert [(q.count, q.k) for q in asked if not q.past_count] == [(1, 1)]  # the count's own mentions are always asked
    with_floor = replace(model, config=replace(model.config, past_count_floor=0.3))
    assert NEREngine(with_floor).strategy_options().past_count_floor == 0.3  # the model's ner_model.json, unless the call says
    assert NEREngine(with_floor, past_count_floor=floor).strategy_options().past_count_floor == floor


@pytest.mark.parametrize("rounds", [0, 1, 3, 5])
def test_past_a_count_padellm_asks_on_while_the_model_answers_a_new_mention(tiny_engine: NEREngine, rounds: int,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A count of 1 where the text holds four names: the answer past the count is a new name, so
    PaDeLLM asks the one past that under the count raised by one, and so on, until the model
    answers nothing, repeats a name it gave, or ``past_count_rounds`` asks have been made."""
    text = "Ann , Bob , Cy and Dee met ."
    names = ["Ann", "Bob", "Cy", "Dee", "Bob"]  # the k-th answer, whatever the count: a fifth repeats the second
    asked: list[MentionQuery] = []

    def scripted_ask(self, runner, queries, confirm, decoder, stats):
        asked.extend(queries)
        answers = [Answer(Mention(q.label, names[q.k - 1] if q.label == "PER" and q.k <= len(names) else "", -0.1), None)
                   for q in queries]
        return answers, {}

    def one_per(self, runner, windows, labels, stats):
        keys = [WindowLabel(0, label) for label in labels]
        return Counts({key: 1 if key.label == "PER" else 0 for key in keys}, [], {key: {d: -0.1 * d for d in range(10)} for key in keys})

    monkeypatch.setattr(PaDeLLM, "_ask", scripted_ask)
    monkeypatch.setattr(PaDeLLM, "_counts", one_per)
    model = replace(tiny_engine.ner_model, config=replace(tiny_engine.ner_model.config, answers_past_count=True, repair_unaligned=False))
    options = replace(tiny_engine.strategy_options(), repair_duplicates=False, repair_unaligned=False, past_count_rounds=rounds)
    found = PaDeLLM(model, options).mentions(tiny_engine.windows([text]), ["LOC", "PER"], get_decoder("greedy"), ExtractionStats())[0]
    per_asked = sorted((q.count, q.k) for q in asked if q.label == "PER")
    chained = [(k, k + 1) for k in range(2, 2 + rounds)][:3]  # the fifth answer repeats "Bob": no sixth is asked
    assert per_asked == [(1, 1), (1, 2)] + chained
    assert [m.text for m in found if m.label == "PER"] == names[:2 + len(chained)]
    assert [(q.count, q.k) for q in asked if q.label == "LOC"] == [(0, 1)]  # nothing past a count of 0: no chain


def test_an_empty_answer_is_re_asked_unless_the_model_was_trained_to_answer_nothing_past_its_count(
        tiny_engine: NEREngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for the third of three PER, an answer of nothing is a lost mention to a model that
    was never taught to say so (re-asked within the text's spans), and the model's word to one
    trained with past-count queries (``answers_past_count``: kept); an answer not in the text is
    re-asked for both."""
    from ner_service.engine.strategies import repairs as repairs_module

    monkeypatch.setattr(repairs_module, "REPAIRED_MIN_MEAN_LOGPROB", float("-inf"))  # every re-asked answer is kept
    text = "Peter Blackburn met John Smith in BRUSSELS ."
    queries = [MentionQuery(0, "PER", 3, k) for k in (1, 2, 3)]
    windows, asking, _ = _asked(tiny_engine, "shared_prefix", text, ["PER"], queries)
    greedy = get_decoder("greedy")

    def repaired(answers_past_count: bool) -> list[str]:
        model = replace(tiny_engine.ner_model, config=replace(tiny_engine.ner_model.config, answers_past_count=answers_past_count))
        answers = [Answer(Mention("PER", "Peter Blackburn", -0.1), 1), Answer(Mention("PER", "Jon Smyth", -0.5), 2), Answer(Mention("PER", "", -0.2), None)]
        Repairs(model, replace(tiny_engine.strategy_options(), repair_unaligned=True, repair_duplicates=False)).apply(
            asking, windows, queries, answers, greedy, ExtractionStats())
        return [a.mention.text for a in answers]

    untaught, taught = repaired(False), repaired(True)
    assert untaught[0] == taught[0] == "Peter Blackburn"
    assert untaught[1] in text and taught[1] in text and untaught[1] and taught[1]  # re-asked within the text's spans
    assert untaught[2] and untaught[2] in text
    assert taught[2] == ""


def test_a_copy_answering_past_the_count_is_not_re_asked(tiny_engine: NEREngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second "John Smith" where the text holds one: re-asked (first token banned) when its
    query is within the count, left to alignment (which drops it) when it asks past the count."""
    from ner_service.engine.strategies import repairs as repairs_module

    monkeypatch.setattr(repairs_module, "REPAIRED_MIN_MEAN_LOGPROB", float("-inf"))  # every re-asked answer is kept
    text = "Peter Blackburn met John Smith in BRUSSELS ."
    greedy = get_decoder("greedy")

    def repaired(queries: list[MentionQuery]) -> list[Answer]:
        windows, asking, plain = _asked(tiny_engine, "shared_prefix", text, ["PER"], queries)
        answers = [Answer(Mention("PER", "John Smith", -0.1), plain[0].first_token), Answer(Mention("PER", "John Smith", -0.5), plain[0].first_token)]
        _repairs(tiny_engine, repair_unaligned=False).apply(asking, windows, queries, answers, greedy, ExtractionStats())
        return answers

    within = repaired([MentionQuery(0, "PER", 2, 1), MentionQuery(0, "PER", 2, 2)])
    past = repaired([MentionQuery(0, "PER", 1, 1), MentionQuery(0, "PER", 1, 2)])
    assert within[1].first_token != within[0].first_token  # re-asked with its first token banned
    assert past[1] == Answer(Mention("PER", "John Smith", -0.5), within[0].first_token)


def test_stray_cjk_characters_before_a_copy_are_dropped_but_never_half_the_mention() -> None:
    """An answer not in the text loses CJK characters from its start until it is, while at least
    half of it (two characters or more) is left; English answers are never cut ("Dave Sullivan"
    mixes two names) and "主任" is not made "任"; an answer in the text stays as it is."""
    text = "华夏控股出纳、会计；项目负责人；任 Mike Sullivan"

    def cut(answer: str) -> str:
        return without_stray_characters(text, Answer(Mention("TITLE", answer, -0.5), 7)).mention.text

    assert [cut(a) for a in ("纳出纳", "总项目负责人", "项目负责人", "主任", "Dave Sullivan", "总经理会计", "")] == [
        "出纳", "项目负责人", "项目负责人", "主任", "Dave Sullivan", "总经理会计", ""]
    kept = without_stray_characters(text, Answer(Mention("TITLE", "纳出纳", -0.5), 7, 4))
    assert kept == Answer(Mention("TITLE", "出纳", -0.5), 7, 4)


def test_constrained_copy_drafting_answers_as_constrained_greedy(tiny_engine: NEREngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers restricted to the text's spans are copies of it: drafted by copy, they are
    constrained greedy's, in fewer forwards."""
    from ner_service.engine.strategies import repairs as repairs_module

    text = "Peter Blackburn met John Smith in BRUSSELS ."
    queries = [MentionQuery(0, "PER", 2, 1), MentionQuery(0, "PER", 2, 2), MentionQuery(0, "LOC", 1, 1)]
    _, asking, _ = _asked(tiny_engine, "shared_prefix", text, ["PER", "LOC"], queries)
    tries = SpanTries(tiny_engine.ner_model.tokenizer, [text], tiny_engine.ner_model.eos_token_id, 24)
    drafted_stats, reference_stats = ExtractionStats(), ExtractionStats()
    drafted = _repairs(tiny_engine).re_ask(asking, queries, [0, 1, 2], get_decoder("greedy"), drafted_stats, tries=tries)
    monkeypatch.setattr(repairs_module, "CONSTRAINED_DECODER", "greedy")
    reference = _repairs(tiny_engine).re_ask(asking, queries, [0, 1, 2], get_decoder("greedy"), reference_stats, tries=tries)
    assert [(a.mention.text, a.first_token) for a in drafted] == [(a.mention.text, a.first_token) for a in reference]
    assert drafted_stats.forward_passes < reference_stats.forward_passes


@pytest.mark.parametrize("runner", ["shared_prefix", "reencoding"])
def test_re_asked_mentions_restricted_to_the_texts_spans_are_spans_of_it(tiny_engine: NEREngine, runner: str) -> None:
    text = "Peter Blackburn met John Smith in BRUSSELS ."
    queries = [MentionQuery(0, "PER", 2, 1), MentionQuery(0, "PER", 2, 2), MentionQuery(0, "LOC", 1, 1)]
    _, asking, plain = _asked(tiny_engine, runner, text, ["PER", "LOC"], queries)
    greedy, stats, repairs = get_decoder("greedy"), ExtractionStats(), _repairs(tiny_engine)
    assert any(a.mention.text not in text for a in plain)  # the untrained model writes words of its own
    tries = SpanTries(tiny_engine.ner_model.tokenizer, [text], tiny_engine.ner_model.eos_token_id, 24)
    spans = repairs.re_ask(asking, queries, [0, 1, 2], greedy, stats, tries=tries)
    assert all(a.mention.text and a.mention.text in text for a in spans)
    units = {"Peter", "Blackburn", "met", "John", "Smith", "in", "BRUSSELS", "."}
    assert all(set(a.mention.text.split()) <= units for a in spans)  # whole words only
    banned = repairs.re_ask(asking, queries, [0, 1, 2], greedy, stats, [a.first_token for a in spans], tries)
    assert all(b.first_token != a.first_token and b.mention.text in text for a, b in zip(spans, banned))
    # the cached and the re-encoding runners agree
    _, other, _ = _asked(tiny_engine, "reencoding" if runner == "shared_prefix" else "shared_prefix", text, ["PER", "LOC"], queries)
    again = repairs.re_ask(other, queries, [0, 1, 2], greedy, ExtractionStats(), tries=tries)
    assert [a.mention.text for a in again] == [a.mention.text for a in spans]
    assert [a.mention.logprob for a in again] == pytest.approx([a.mention.logprob for a in spans], abs=1e-3)


def test_a_neighbour_answered_twice_is_recovered(en_engine: NEREngine) -> None:
    """On the English model, one PER query of this list answers a neighbour of Tiger Woods (a dev sentence)."""
    text = "Mike Hulbert , Brian Henninger , Tiger Woods , Steve Jurgenson ,"
    plain = NEREngine(en_engine.ner_model, repair_duplicates=False).extract([text])[0]
    (repaired,) = en_engine.extract([text])
    assert "Tiger Woods" not in [e.text for e in plain.entities]
    assert [e.text for e in repaired.entities] == ["Mike Hulbert", "Brian Henninger", "Tiger Woods", "Steve Jurgenson"]
    assert repaired.stats.forward_passes > plain.stats.forward_passes


@pytest.mark.parametrize("runner", ["shared_prefix", "reencoding"])
def test_a_query_answer_ends_at_a_line_break(tiny_engine: NEREngine, runner: str) -> None:
    """A count or mention answer stops at the end token or at a token that holds a line break (a
    mention lies on one line of its text); the autoregressive answer, a line per mention, does not."""
    model = tiny_engine.ner_model
    newline = model.tokenizer("\n", add_special_tokens=False).input_ids[-1]
    assert {newline, model.eos_token_id} <= model.query_stop_token_ids
    assert not model.query_stop_token_ids & set(model.tokenizer(" Paris", add_special_tokens=False).input_ids)
    assert newline not in model.stop_token_ids
    windows = tiny_engine.windows([TEXTS[0]])
    asking = RUNNERS[runner](model, windows)
    asking.encode([count_query_ids(model, "PER")], ExtractionStats())
    branch = Branch(0, "PER", MentionQuery(0, "PER", 1, 1).token_ids(model))
    out = asking.decode([branch], get_decoder("greedy"), 8, ExtractionStats(), [TokenBias({newline: 100.0})])
    assert out.tokens == [[]] and out.stopped == [True]  # a line break first: nothing said, and said all
