"""The shipped English model on real sentences: it finds their entities, and the engine's
fast paths (shared prefix, batching, fused count step) give exactly the reference results."""

from __future__ import annotations

import pytest

from benchmarks.reencoding import reencoding_padellm
from ner_service.engine import NEREngine

pytestmark = pytest.mark.slow

SENTENCES = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn",
    "Japan coach Shu Kamo said : ' The Syrian own goal proved lucky for us .",
    "Results of English first division soccer matches on Saturday : Bolton 2 Norwich 1 , Charlton 3 Ipswich 0 , Sheffield United 1 Tranmere 1",
    "",
]


def test_finds_the_entities_of_a_real_sentence(en_engine: NEREngine) -> None:
    (result,) = en_engine.extract(["Angela Merkel visited Paris on Monday with officials from Siemens ."])
    found = {(e.text, e.label) for e in result.entities}
    assert ("Angela Merkel", "PER") in found
    assert ("Paris", "LOC") in found
    assert all(0 < e.score <= 1 for e in result.entities)


@pytest.mark.parametrize("strategy", ["padellm", "ar"])
def test_batching_and_prefix_sharing_change_nothing(en_engine: NEREngine, strategy: str) -> None:
    batched = en_engine.extract(SENTENCES, strategy=strategy)
    alone = [en_engine.extract([s], strategy=strategy)[0] for s in SENTENCES]
    # PaDeLLM's branches share the text's prefix; re-encoded, each branch reads the whole prompt (AR has one branch)
    reencoding = en_engine.extract(SENTENCES, strategy=reencoding_padellm(en_engine)) if strategy == "padellm" else batched
    key = lambda results: [[(e.start, e.end, e.label) for e in r.entities] for r in results]  # noqa: E731
    assert key(batched) == key(alone) == key(reencoding)
    assert sum(len(r.entities) for r in batched) >= 8
    for result, sentence in zip(batched, SENTENCES):
        assert all(sentence[e.start:e.end] == e.text for e in result.entities)


def test_padellm_needs_fewer_forward_passes_than_ar(en_engine: NEREngine) -> None:
    sentence = SENTENCES[3]
    (parallel,) = en_engine.extract([sentence], strategy="padellm")
    (sequential,) = en_engine.extract([sentence], strategy="ar")
    assert parallel.stats.forward_passes * 2 < sequential.stats.forward_passes
    assert parallel.stats.unfinished_answers == 0  # each mention of the score table ends at its end token or line


def test_label_subset_only_returns_those_labels(en_engine: NEREngine) -> None:
    (result,) = en_engine.extract([SENTENCES[0]], labels=["MISC"])
    assert result.entities and {e.label for e in result.entities} == {"MISC"}


def test_speculated_counts_and_mention_drafts_give_the_same_entities_in_fewer_forwards(en_engine: NEREngine, data_dir) -> None:
    """Speculation is lossless: the mention queries of a count of 1 fed with the count queries,
    and each known mention token followed by the text it is copied from, give the entities (and
    scores) of plain greedy PaDeLLM, one text at a time, in fewer forwards."""
    from corpora import read_corpus

    texts = [e.text for e in read_corpus(data_dir / "conll2003" / "dev.txt") if e.text.strip()][:12]
    whole = 160  # each sentence one window, so that the forwards counted are one text's
    # its count biases (count_quantile 0): counts of 1, the ones speculated, as most of these texts hold
    plain = NEREngine(en_engine.ner_model, max_window_tokens=whole, speculated_counts=(), count_quantile=0)
    speculating = NEREngine(en_engine.ner_model, max_window_tokens=whole, speculated_counts=(1,), count_quantile=0)
    forwards = {"plain": 0, "speculating": 0}
    for text in texts:
        (reference,) = plain.extract([text], decoder="greedy")
        (fast,) = speculating.extract([text], decoder="copy")
        assert [(e.start, e.end, e.label) for e in fast.entities] == [(e.start, e.end, e.label) for e in reference.entities]
        assert [e.score for e in fast.entities] == pytest.approx([e.score for e in reference.entities], abs=1e-3)
        forwards["plain"] += reference.stats.forward_passes
        forwards["speculating"] += fast.stats.forward_passes
    assert forwards["speculating"] <= 3 * len(texts) < forwards["plain"]


def test_a_lone_mention_of_a_speculated_count_takes_two_forwards(en_engine: NEREngine) -> None:
    """A count of 1 is confirmed and its mention begun in the prefix forward; the mention, copied
    from the text, is verified with its end token in the next one."""
    speculating = NEREngine(en_engine.ner_model, speculated_counts=(1,))
    (result,) = speculating.extract(["Angela Merkel arrived on Monday ."], labels=["PER"])
    assert [(e.text, e.label) for e in result.entities] == [("Angela Merkel", "PER")]
    assert result.stats.forward_passes == 2
