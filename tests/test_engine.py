"""The engine's contract on the tiny model: validation, empty and long texts, batching."""

from __future__ import annotations

import pytest
import torch

from general_decoding import UnknownDecoderError
from ner_service.engine import NEREngine, UnknownLabelError
from ner_service.engine.model_loading import ModelNotFoundError

TEXTS = ["EU rejects German call to boycott British lamb .", "Peter Blackburn", "", "BRUSSELS 1996-08-22", "   "]


@pytest.mark.parametrize("decoder", ["padellm", "ar"])
def test_empty_text_gives_no_entities_and_no_work(tiny_engine: NEREngine, decoder: str) -> None:
    (result,) = tiny_engine.extract([""], decoder=decoder)
    assert result.entities == [] and result.stats.forward_passes == 0
    assert tiny_engine.extract([], decoder=decoder) == []


def test_unknown_label_lists_the_models_labels(tiny_engine: NEREngine) -> None:
    with pytest.raises(UnknownLabelError, match="'DISEASE'.*LOC, MISC, ORG, PER"):
        tiny_engine.extract(["x"], labels=["PER", "DISEASE"])


def test_unknown_strategy_backend_and_model(tiny_engine: NEREngine) -> None:
    with pytest.raises(ValueError, match="padellm, ar"):
        tiny_engine.extract(["x"], decoder="beam")
    with pytest.raises(UnknownDecoderError):
        tiny_engine.extract(["x"], backend="nope")
    with pytest.raises(TypeError):
        tiny_engine.extract("a string, not a list")
    with pytest.raises(ModelNotFoundError, match="shipped models: .*tiny-conll03"):
        NEREngine.load("no-such-model")


@pytest.mark.parametrize("decoder", ["padellm", "ar"])
def test_batch_equals_one_by_one_and_prefix_sharing_equals_reencoding(tiny_engine: NEREngine, decoder: str) -> None:
    batched = tiny_engine.extract(TEXTS, decoder=decoder)
    alone = [tiny_engine.extract([t], decoder=decoder)[0] for t in TEXTS]
    reencoding = NEREngine(tiny_engine.ner_model, share_prefix=False).extract(TEXTS, decoder=decoder)
    assert [r.entities for r in batched] == [r.entities for r in alone] == [r.entities for r in reencoding]
    assert batched[0].stats.generated_tokens == sum(r.stats.generated_tokens for r in alone)
    assert batched[0].stats.forward_passes > 0


def test_long_text_is_windowed_with_offsets_kept(tiny_engine: NEREngine) -> None:
    text = " ".join(["Peter Blackburn visited BRUSSELS on Tuesday ."] * 120)
    engine = NEREngine(tiny_engine.ner_model, max_window_tokens=48)
    assert len(engine._windows([text])) > 10
    for decoder in ("padellm", "ar"):
        (result,) = engine.extract([text], decoder=decoder)
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
