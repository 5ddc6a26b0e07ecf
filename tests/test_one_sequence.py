"""Parallel branches within one sequence: every branch equals its own greedy decode, the
shared prefix is cached once, and the engine's PaDeLLM steps give the batched results."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from general_decoding import StopCriteria, get_decoder
from general_decoding.kv_cache import cache_bytes
from general_decoding.row_vocabulary import RowVocabulary
from general_decoding.tree_attention import build_trie
from ner_service.engine import prompts

TEXTS = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn met Angela Merkel in Paris and Berlin on Friday .",
    "Hove : Sussex 363 ( W. Athey 111 , V. Drakes 52 ; I. Austin 4-37 ) , Lancashire 197-8 ( W. Hegg 54 )",
]
QUERIES = [("PER", 2, 1), ("PER", 2, 2), ("LOC", 1, 1), ("ORG", 3, 2), ("MISC", 1, 1)]


def _left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _prefix_and_queries(tokenizer, text: str) -> tuple[list[int], list[list[int]]]:
    prefix = tokenizer(prompts.prefix(text)).input_ids
    queries = [tokenizer(prompts.mention_query(label, n, k), add_special_tokens=False).input_ids for label, n, k in QUERIES]
    return prefix, queries


@pytest.mark.parametrize("text", TEXTS)
def test_branches_over_a_shared_prefix_equal_separate_greedy_decodes(tiny_engine, text: str) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(20, frozenset({tokenizer.eos_token_id}))
    prefix, queries = _prefix_and_queries(tokenizer, text)
    expected = [get_decoder("greedy").generate(model, torch.tensor([prefix + q]), stop) for q in queries]

    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prefix]), cache=cache, use_cache=True)
    prefix_bytes = cache_bytes(cache)
    ids, query_mask = _left_pad(queries)
    mask = torch.cat([torch.ones(len(queries), len(prefix), dtype=torch.long), query_mask], dim=1)
    got = get_decoder("one_sequence").generate(model, ids, stop, attention_mask=mask, past_key_values=cache)

    assert got.tokens == [e.tokens[0] for e in expected]
    assert got.stopped == [e.stopped[0] for e in expected]
    assert got.scores == pytest.approx([e.scores[0] for e in expected], abs=1e-3)
    # one sequence: the prefix once, then exactly the tokens fed: the queries as a trie (their
    # shared beginnings once) and the emitted tokens
    trie_nodes = len(build_trie(queries)[0])
    assert trie_nodes < sum(map(len, queries))
    fed = len(prefix) + trie_nodes + sum(len(t) - int(not s) for t, s in zip(got.tokens, got.stopped))
    assert cache.layers[0].keys.shape[0] == 1
    assert cache.get_seq_length() == fed
    assert cache_bytes(cache) == prefix_bytes * fed // len(prefix)


def test_rows_without_a_cache_are_packed_branches_equal_to_greedy(tiny_engine) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(16, frozenset({tokenizer.eos_token_id}))
    rows = [tokenizer(prompts.prefix(t) + prompts.ar_query()).input_ids for t in TEXTS]
    ids, mask = _left_pad(rows)
    expected = get_decoder("greedy").generate(model, ids, stop, attention_mask=mask)
    got = get_decoder("one_sequence").generate(model, ids, stop, attention_mask=mask)
    assert got.tokens == expected.tokens
    assert got.forward_passes == expected.forward_passes


def test_branches_over_their_own_tokens_equal_greedy_over_the_same_vocabulary(tiny_engine) -> None:
    """With a row vocabulary each branch's scores are normalised over its own tokens, as greedy's
    are: the same tokens and scores, not the whole output layer's."""
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    eos = tokenizer.eos_token_id
    stop = StopCriteria(12, frozenset({eos}))
    rows = [tokenizer(prompts.prefix(t) + prompts.ar_query()).input_ids for t in TEXTS]
    allowed = [sorted(set(row) | {eos}) for row in rows]  # each row may copy its own text only
    ids, mask = _left_pad(rows)
    vocabulary = RowVocabulary(allowed, model.get_output_embeddings().weight.shape[0])
    expected = get_decoder("greedy").generate(model, ids, stop, attention_mask=mask, vocabulary=vocabulary)
    got = get_decoder("one_sequence").generate(model, ids, stop, attention_mask=mask, vocabulary=vocabulary)
    whole = get_decoder("one_sequence").generate(model, ids, stop, attention_mask=mask)
    assert got.tokens == expected.tokens
    assert all(set(tokens) <= set(own) for tokens, own in zip(got.tokens, allowed))
    assert got.scores == pytest.approx(expected.scores, abs=1e-3)
    assert got.scores != pytest.approx(whole.scores, abs=1e-3), "the restricted rows are normalised over fewer tokens"


def test_a_cache_of_several_rows_is_refused(tiny_engine) -> None:
    model = tiny_engine.ner_model.model
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 6], [7, 8]]), cache=cache, use_cache=True)
    with pytest.raises(ValueError, match="batch size 1"):
        get_decoder("one_sequence").generate(model, torch.tensor([[9], [10]]), StopCriteria(3, frozenset({0})),
                                             attention_mask=torch.ones(2, 3, dtype=torch.long), past_key_values=cache)


def _spans(extractions) -> list[list[tuple[int, int, str]]]:
    return [[(e.start, e.end, e.label) for e in x.entities] for x in extractions]


@pytest.mark.parametrize("engine_fixture", ["tiny_engine", pytest.param("en_engine", marks=pytest.mark.slow)])
def test_engine_one_sequence_equals_batched_at_batch_one(request, engine_fixture: str) -> None:
    engine = request.getfixturevalue(engine_fixture)
    found = 0
    for text in TEXTS:
        batched = engine.extract([text])
        found += len(batched[0].entities)
        single = engine.extract([text], decoder="one_sequence")
        assert _spans(single) == _spans(batched)
        assert [e.score for e in single[0].entities] == pytest.approx([e.score for e in batched[0].entities], abs=1e-3)
        # one held sequence against a copy of the prefix per row; the repairs after it run as the
        # default runner's (and the sequence's columns are freed before them)
        assert single[0].stats.kv_cache_bytes <= batched[0].stats.kv_cache_bytes
    assert found, "compares entities, not empty lists"


@pytest.mark.slow
def test_engine_one_sequence_handles_several_texts_and_windows(en_engine) -> None:
    texts = TEXTS + [" ".join(TEXTS * 4)]  # the last one spans several windows
    assert _spans(en_engine.extract(texts, decoder="one_sequence")) == _spans(en_engine.extract(texts))
