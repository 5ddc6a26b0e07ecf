"""The engine's contract on the tiny model: validation, empty and long texts, batching."""

from __future__ import annotations

import pytest
import torch

from general_decoding import UnknownDecoderError, get_decoder
from ner_service.engine import ExtractionStats, NEREngine, UnknownLabelError
from ner_service.engine.engine import _Answer
from ner_service.engine.span_tries import SpanTries
from ner_service.engine.spans import Mention
from ner_service.engine.model_loading import ModelNotFoundError

TEXTS = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "", "BRUSSELS 1996-08-22", "   "]


@pytest.mark.parametrize("decoder", ["padellm", "ar"])
def test_empty_text_gives_no_entities_and_no_work(tiny_engine: NEREngine, decoder: str) -> None:
    (result,) = tiny_engine.extract([""], strategy=decoder)
    assert result.entities == [] and result.stats.forward_passes == 0
    assert tiny_engine.extract([], strategy=decoder) == []


def test_unknown_label_lists_the_models_labels(tiny_engine: NEREngine) -> None:
    with pytest.raises(UnknownLabelError, match="'DISEASE'.*LOC, MISC, ORG, PER"):
        tiny_engine.extract(["x"], labels=["PER", "DISEASE"])


def test_unknown_strategy_backend_and_model(tiny_engine: NEREngine) -> None:
    with pytest.raises(ValueError, match="padellm, ar"):
        tiny_engine.extract(["x"], strategy="beam")
    with pytest.raises(UnknownDecoderError):
        tiny_engine.extract(["x"], decoder="nope")
    with pytest.raises(TypeError):
        tiny_engine.extract("a string, not a list")
    with pytest.raises(ModelNotFoundError, match="shipped models: .*tiny-conll03"):
        NEREngine.load("no-such-model")


@pytest.mark.parametrize("decoder", ["padellm", "ar"])
def test_batch_equals_one_by_one_and_prefix_sharing_equals_reencoding(tiny_engine: NEREngine, decoder: str) -> None:
    batched = tiny_engine.extract(TEXTS, strategy=decoder)
    alone = [tiny_engine.extract([t], strategy=decoder)[0] for t in TEXTS]
    reencoding = NEREngine(tiny_engine.ner_model, share_prefix=False).extract(TEXTS, strategy=decoder)
    assert [r.entities for r in batched] == [r.entities for r in alone] == [r.entities for r in reencoding]
    assert batched[0].stats.generated_tokens == sum(r.stats.generated_tokens for r in alone)
    assert batched[0].stats.forward_passes > 0


def test_long_text_is_windowed_with_offsets_kept(tiny_engine: NEREngine) -> None:
    text = " ".join(["Peter Blackburn visited BRUSSELS on Tuesday ."] * 120)
    engine = NEREngine(tiny_engine.ner_model, max_window_tokens=48)
    assert len(engine._windows([text])) > 10
    for decoder in ("padellm", "ar"):
        (result,) = engine.extract([text], strategy=decoder)
        assert all(text[e.start:e.end] == e.text for e in result.entities)


def test_count_bias_favours_larger_counts(tiny_engine: NEREngine) -> None:
    tokenizer = tiny_engine.ner_model.tokenizer
    one, two = tokenizer.convert_tokens_to_ids(["1", "2"])
    logits = torch.full((1, len(tokenizer)), -30.0)
    logits[0, one], logits[0, two] = 1.0, 0.8  # "1" slightly more probable than "2"
    assert NEREngine(tiny_engine.ner_model, count_bias=0.0)._biased_counts(logits).argmax(-1).item() == one
    assert NEREngine(tiny_engine.ner_model, count_bias=0.5)._biased_counts(logits).argmax(-1).item() == two
    plain = NEREngine(tiny_engine.ner_model, count_bias=0.0).extract(TEXTS[:2])
    eager = NEREngine(tiny_engine.ner_model, count_bias=3.0).extract(TEXTS[:2])  # every count becomes large
    assert eager[0].stats.generated_tokens > plain[0].stats.generated_tokens  # more mention queries were answered
    assert all(TEXTS[i][e.start:e.end] == e.text for i, r in enumerate(eager) for e in r.entities)


def _asked(model: NEREngine, share_prefix: bool, text: str, labels: list[str], rows: list[tuple[int, str, int, int]]):
    """An engine without the unaligned repair, the text's windows and cached count step, and
    what each mention query of ``rows`` answers unconstrained."""
    engine = NEREngine(model.ner_model, share_prefix=share_prefix, repair_unaligned=False)
    windows = engine._windows([text])
    prefixes, _ = engine._count_step(windows, labels, ExtractionStats())
    plain, _ = engine._mention_step(prefixes, rows, [], get_decoder("greedy"), ExtractionStats())
    return engine, windows, prefixes, plain


@pytest.mark.parametrize("share_prefix", [True, False])
def test_surplus_duplicate_mentions_are_re_asked_with_their_first_token_banned(tiny_engine: NEREngine, share_prefix: bool) -> None:
    text = "Peter Blackburn met Peter Blackburn and John Smith in BRUSSELS ."
    rows = [(0, "PER", 4, 1), (0, "PER", 4, 2), (0, "PER", 4, 3), (0, "PER", 4, 4)]
    engine, windows, prefixes, plain = _asked(tiny_engine, share_prefix, text, ["PER"], rows)
    greedy, stats = get_decoder("greedy"), ExtractionStats()
    first = [a.first_token for a in plain]

    def answer(text: str, logprob: float, row: int) -> _Answer:
        return _Answer(Mention("PER", text, logprob), first[row])

    # "Peter Blackburn" occurs twice (both copies stay); "John Smith" once: the less probable copy is re-asked
    answers = [answer("Peter Blackburn", -0.1, 0), answer("Peter Blackburn", -0.2, 1), answer("John Smith", -0.3, 2), answer("John Smith", -0.9, 3)]
    kept = answers[:3]
    engine._repair(windows, prefixes, rows, answers, greedy, stats)
    assert answers[:3] == kept
    assert answers[3].first_token != first[3]  # the first token it had is banned
    assert answers[3].mention.logprob < 0
    # the cached and the re-encoding engine repair alike
    other, _, other_prefixes, _ = _asked(tiny_engine, not share_prefix, text, ["PER"], rows)
    again = [answer("Peter Blackburn", -0.1, 0), answer("Peter Blackburn", -0.2, 1), answer("John Smith", -0.3, 2), answer("John Smith", -0.9, 3)]
    other._repair(windows, other_prefixes, rows, again, greedy, ExtractionStats())
    assert again[3].mention.text == answers[3].mention.text and again[3].first_token == answers[3].first_token
    assert again[3].mention.logprob == pytest.approx(answers[3].mention.logprob, abs=1e-3)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_re_asked_mentions_restricted_to_the_texts_spans_are_spans_of_it(tiny_engine: NEREngine, share_prefix: bool) -> None:
    text = "Peter Blackburn met John Smith in BRUSSELS ."
    rows = [(0, "PER", 2, 1), (0, "PER", 2, 2), (0, "LOC", 1, 1)]
    engine, _, prefixes, plain = _asked(tiny_engine, share_prefix, text, ["PER", "LOC"], rows)
    greedy, stats = get_decoder("greedy"), ExtractionStats()
    assert any(a.mention.text not in text for a in plain)  # the untrained model writes words of its own
    tries = SpanTries(engine.ner_model.tokenizer, [text], engine.ner_model.eos_token_id, 24)
    spans = engine._re_ask(prefixes, rows, [0, 1, 2], greedy, stats, tries=tries)
    assert all(a.mention.text and a.mention.text in text for a in spans)
    units = {"Peter", "Blackburn", "met", "John", "Smith", "in", "BRUSSELS", "."}
    assert all(set(a.mention.text.split()) <= units for a in spans)  # whole words only
    banned = engine._re_ask(prefixes, rows, [0, 1, 2], greedy, stats, [a.first_token for a in spans], tries)
    assert all(b.first_token != a.first_token and b.mention.text in text for a, b in zip(spans, banned))
    # the cached and the re-encoding engine agree
    other, _, other_prefixes, _ = _asked(tiny_engine, not share_prefix, text, ["PER", "LOC"], rows)
    again = other._re_ask(other_prefixes, rows, [0, 1, 2], greedy, ExtractionStats(), tries=tries)
    assert [a.mention.text for a in again] == [a.mention.text for a in spans]
    assert [a.mention.logprob for a in again] == pytest.approx([a.mention.logprob for a in spans], abs=1e-3)


def test_a_neighbour_answered_twice_is_recovered(en_engine: NEREngine) -> None:
    """On the shipped model, the 4th PER query of this list answers the 5th name, Russ Cochran (a dev sentence)."""
    text = "Wood , Loren Roberts , Steve Stricker , Brian Claar , Russ Cochran"
    plain = NEREngine(en_engine.ner_model, repair_duplicates=False).extract([text])[0]
    (repaired,) = en_engine.extract([text])
    assert "Brian Claar" not in [e.text for e in plain.entities]
    assert [e.text for e in repaired.entities] == ["Wood", "Loren Roberts", "Steve Stricker", "Brian Claar", "Russ Cochran"]
    assert repaired.stats.forward_passes > plain.stats.forward_passes
