"""The greedy reference decoder, the shared KV-cache helpers and tree-attention packing,
on real forward passes of the tiny model."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from general_decoding import StopCriteria, UnknownDecoderError, get_decoder, left_pad
from general_decoding.copy_draft import copy_candidates
from general_decoding.constraints import BannedFirstToken, TokenBias, TokenTrie, TrieConstraint, admissible_draft, choose, continued
from general_decoding.draft_verify import DraftLength
from general_decoding.kv_cache import RESERVED_COLUMNS, cache_bytes, keep_first, keep_rows, select_rows, select_visible
from general_decoding.tree_attention import (
    ancestor_mask, build_trie, chain_with_trie, collate_forest_rows, collate_parent_trees, pack_rows,
)

PROMPTS = ["Text: EU rejects German call to boycott British lamb .\nAll entities:", "Text: Peter Blackburn\nPER count:", "Text: a\n"]


def _ids(engine, text: str) -> torch.Tensor:
    return torch.tensor([engine.ner_model.tokenizer(text).input_ids])


def test_greedy_matches_transformers_generate(tiny_engine) -> None:
    model, eos = tiny_engine.ner_model.model, tiny_engine.ner_model.eos_token_id
    for prompt in PROMPTS:
        ids = _ids(tiny_engine, prompt)
        ours = get_decoder("greedy").generate(model, ids, StopCriteria(12, frozenset({eos})))
        theirs = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=eos)[0, ids.shape[1]:].tolist()
        if eos in theirs:
            theirs = theirs[: theirs.index(eos)]
        assert ours.tokens[0] == theirs
        assert ours.forward_passes == len(theirs) + int(ours.stopped[0])


def test_left_padded_batch_equals_rows_decoded_alone(tiny_engine) -> None:
    model, tokenizer, eos = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer, tiny_engine.ner_model.eos_token_id
    rows = [tokenizer(p).input_ids for p in PROMPTS]
    width = max(map(len, rows))
    ids = torch.tensor([[eos] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    stop = StopCriteria(10, frozenset({eos}))
    batched = get_decoder("greedy").generate(model, ids, stop, attention_mask=mask)
    for i, row in enumerate(rows):
        alone = get_decoder("greedy").generate(model, torch.tensor([row]), stop)
        assert batched.tokens[i] == alone.tokens[0]
        assert batched.scores[i] == pytest.approx(alone.scores[0], abs=1e-4)


def test_bad_decoder_inputs_are_clear_errors(tiny_engine) -> None:
    model = tiny_engine.ner_model.model
    with pytest.raises(ValueError, match="max_new_tokens"):
        StopCriteria(0, frozenset({0}))
    with pytest.raises(ValueError, match="non-empty"):
        get_decoder("greedy").generate(model, torch.zeros((1, 0), dtype=torch.long), StopCriteria(3, frozenset({0})))
    with pytest.raises(UnknownDecoderError, match="available: .*greedy"):
        get_decoder("no-such-decoder")


def test_tree_branches_see_only_the_prefix_and_themselves(tiny_engine) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    prefix = tokenizer("Text: Peter Blackburn met EU officials\n").input_ids
    queries = ["PER count: 1", "ORG count: 1", "ORG count: 1\nORG 1: EU", "All entities:"]
    branches = [tokenizer(q, add_special_tokens=False).input_ids for q in queries]
    trie = build_trie(branches)
    assert len(trie.ids) < sum(len(b) for b in branches)  # the ORG branches share their beginning
    ids, positions, mask = collate_parent_trees([chain_with_trie(prefix, trie)], pad_token_id=0)
    with torch.inference_mode():
        packed = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[0]
        for number, branch in enumerate(branches):
            alone = model(input_ids=torch.tensor([prefix + branch])).logits[0, len(prefix):]
            columns = [len(prefix) + node for node in trie.path(number)]
            torch.testing.assert_close(packed[columns], alone, atol=1e-4, rtol=1e-4)


def test_selecting_cache_rows_copies_the_shared_prefix(tiny_engine) -> None:
    model = tiny_engine.ner_model.model
    with torch.inference_mode():
        cache = model(input_ids=_ids(tiny_engine, PROMPTS[0]), use_cache=True).past_key_values
    branched = select_rows(cache, [0, 0, 0])
    length = cache.get_seq_length()
    assert branched.get_seq_length() == length
    assert cache_bytes(branched) == 3 * cache_bytes(cache) * (length + RESERVED_COLUMNS) // length  # room to decode into
    assert torch.equal(branched.layers[0].keys[2], cache.layers[0].keys[0])


def test_a_row_decoded_over_the_columns_it_sees_answers_as_over_its_whole_row(tiny_engine) -> None:
    from general_decoding.base import position_ids_from_mask

    model = tiny_engine.ner_model.model
    with torch.inference_mode():
        cache = model(input_ids=_ids(tiny_engine, PROMPTS[0]), use_cache=True).past_key_values
        length = cache.get_seq_length()
        visible = torch.ones(2, length, dtype=torch.bool)
        visible[0, 3:7] = False  # columns row 0 does not see (another branch's, say)
        visible[1, -2:] = False
        kept, seen = select_visible(cache, [0, 0], visible)
        assert kept.get_seq_length() == length - 2  # the widest row's columns, the other left-padded
        assert seen.tolist() == [[0, 0] + [1] * (length - 4), [1] * (length - 2)]
        assert torch.equal(kept.layers[0].keys[0, :, 2:], cache.layers[0].keys[0][:, visible[0]])
        whole = select_rows(cache, [0, 0])
        assert cache_bytes(kept) < cache_bytes(whole)
        ids = torch.tensor([[42], [42]])
        answers = []
        for rows_cache, mask in ((whole, visible.long()), (kept, seen)):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            answers.append(model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)[:, -1:],
                                 cache=rows_cache, use_cache=True).logits)
        torch.testing.assert_close(answers[1], answers[0])
        assert not torch.allclose(answers[0][0], answers[0][1])  # the rows saw different columns


def test_a_reserved_cache_decodes_in_place_as_a_dynamic_cache_does(tiny_engine) -> None:
    model = tiny_engine.ner_model.model
    with torch.inference_mode():
        cache = model(input_ids=_ids(tiny_engine, PROMPTS[0]), use_cache=True).past_key_values
        length = cache.get_seq_length()
        reserved = select_rows(cache, [0, 0])
        dynamic = DynamicCache(ddp_cache_data=[(layer.keys[[0, 0]], layer.values[[0, 0]]) for layer in cache.layers])
        buffer = reserved.layers[0]._keys.buffer.data_ptr()

        def step(width: int, seed: int) -> None:
            ids = torch.randint(5, 100, (2, width), generator=torch.Generator().manual_seed(seed))
            past = dynamic.get_seq_length()
            positions = torch.arange(past, past + width)[None].expand(2, -1)
            mask = torch.ones(2, past + width, dtype=torch.long)
            outs = [model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=c, use_cache=True).logits
                    for c in (reserved, dynamic)]
            torch.testing.assert_close(outs[0], outs[1])
            for ours, theirs in zip(reserved.layers, dynamic.layers):
                assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)

        for seed in range(3):  # one token per step: written into the reserved room, no copy
            step(1, seed)
        assert reserved.layers[0]._keys.buffer.data_ptr() == buffer
        for c in (reserved, dynamic):  # roll back a rejected draft, then decode over it
            keep_first(c, length + 1)
        step(2, 3)
        assert reserved.layers[0]._keys.buffer.data_ptr() == buffer
        step(RESERVED_COLUMNS + 4, 4)  # more than the room: the buffer grows
        assert reserved.layers[0]._keys.buffer.data_ptr() != buffer
        for c in (reserved, dynamic):  # rows selected (reordered here), as when finished rows leave
            keep_rows(c, torch.tensor([1, 0]))
        step(1, 5)


def test_trees_packed_in_one_row_see_nothing_of_each_other() -> None:
    first = [1, 2, 3, 4, 5], [-1, 0, 1, 1, 3]  # prefix 1 2, branches [3] and [4, 5]
    second = [6, 7], [-1, 0]
    ids, positions, mask, offsets = collate_forest_rows([[first, second], [second]], pad_token_id=0)
    assert offsets == [[0, 5], [0]]
    assert ids.tolist() == [[1, 2, 3, 4, 5, 6, 7], [6, 7, 0, 0, 0, 0, 0]]
    assert positions[0].tolist() == [0, 1, 2, 2, 3, 0, 1]  # the second tree's positions start again
    allowed = mask[0, 0] == 0
    assert allowed[5:, :5].sum() == 0 and allowed[:5, 5:].sum() == 0  # block-diagonal
    assert allowed[6].tolist() == [False] * 5 + [True, True]
    # branches see the prefix and themselves, never each other
    assert allowed[:5, :5].int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]]
    assert (mask[1, 0, 2:, 2:] == 0).int().tolist() == torch.eye(5, dtype=torch.int).tolist()  # padding sees itself only
    single = collate_parent_trees([first, second], pad_token_id=0)
    assert torch.equal(single[2][0, 0, :5, :5], mask[0, 0, :5, :5])


def test_a_prefix_chain_with_a_trie_shares_the_branches_beginnings() -> None:
    trie = build_trie([[3, 4], [3, 5], [6]])
    ids, parents = chain_with_trie([1, 2], trie)
    assert ids == [1, 2, 3, 4, 5, 6] and parents == [-1, 0, 1, 2, 2, 1]
    _, positions, mask, _ = collate_forest_rows([[(ids, parents)]], pad_token_id=0)
    assert positions[0].tolist() == [0, 1, 2, 3, 3, 2]
    assert (mask[0, 0, 4] == 0).tolist() == [True, True, True, False, True, False]  # 5 sees 1 2 3 and itself


def test_pack_rows_fills_rows_up_to_the_longest_item() -> None:
    rows = pack_rows([10, 3, 7, 2, 9, 1])
    assert sorted(i for row in rows for i in row) == list(range(6))
    assert all(sum([10, 3, 7, 2, 9, 1][i] for i in row) <= 10 for row in rows)
    assert len(rows) == 4 and pack_rows([]) == []


def test_a_trie_feeds_shared_beginnings_once_and_each_node_sees_its_ancestors() -> None:
    ids, parents, ends = build_trie([[5, 6, 7], [5, 6, 8], [5, 9], [5, 6, 7]])
    assert ids == [5, 6, 7, 8, 9] and parents == [-1, 0, 1, 1, 0] and ends == [2, 3, 4, 2]
    seen = ancestor_mask(parents)
    assert seen[3].tolist() == [True, True, False, True, False]  # 8 sees 5, 6 and itself, not its sibling 7
    assert seen[4].tolist() == [True, False, False, False, True]
    with pytest.raises(ValueError, match="at least one token"):
        build_trie([[1], []])


def test_draft_length_grows_on_hits_and_stops_drafting_when_drafts_do_not_pay() -> None:
    lengths = DraftLength(rows=2, most=8, start=4, least=3, break_even=0.25, probe_every=8)
    for _ in range(3):  # row 0: every draft accepted whole
        lengths.update(0, lengths.budget(0), lengths.budget(0))
    assert lengths.budget(0) == 8
    lengths.update(0, 8, 5)  # a miss: one fewer, never fewer than accepted
    assert lengths.budget(0) == 7
    misses = 0
    while lengths.budget(1) > 0:  # row 1: nothing is ever accepted
        lengths.update(1, lengths.budget(1), 0)
        misses += 1
    assert misses <= 5
    budgets = [lengths.budget(1) for _ in range(16)]  # greedy steps, a probe every 8th
    assert budgets.count(0) == 14 and budgets.count(3) == 2
    lengths.update(1, 3, 3)  # a probe that hits resumes drafting
    assert lengths.budget(1) >= 3


def test_draft_length_with_a_prior_below_break_even_starts_greedy_and_probes() -> None:
    lengths = DraftLength(rows=1, most=8, start=4, least=3, break_even=0.25, probe_every=8, prior=0.05)
    assert [lengths.budget(0) for _ in range(8)] == [0] * 7 + [3]
    lengths.update(0, 3, 3)  # the probe's draft held: drafting resumes
    assert lengths.budget(0) >= 3


def test_a_decoder_whose_drafts_miss_costs_about_a_greedy_step_per_token(tiny_engine) -> None:
    """Jacobi's guesses rarely hold on the tiny model: it falls back to width-1 forwards."""
    model = tiny_engine.ner_model.model
    ids = _ids(tiny_engine, "Text: EU rejects German call to boycott British lamb .\n")
    stop = StopCriteria(40, frozenset())
    greedy = get_decoder("greedy").generate(model, ids, stop)
    widths: list[int] = []
    original = model.forward

    def counting(*args, **kwargs):
        widths.append(kwargs["input_ids"].shape[1])
        return original(*args, **kwargs)

    model.forward = counting
    try:
        jacobi = get_decoder("jacobi").generate(model, ids, stop)
    finally:
        del model.forward
    assert jacobi.tokens == greedy.tokens
    assert jacobi.forward_passes <= greedy.forward_passes
    assert sum(w == 1 for w in widths[1:]) >= len(widths[1:]) // 2


def test_trie_constrained_decoding_stays_within_each_rows_trie_and_is_greedy_without_one(tiny_engine) -> None:
    model, tokenizer, eos = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer, tiny_engine.ner_model.eos_token_id
    ids = _ids(tiny_engine, PROMPTS[1])
    stop = StopCriteria(24, frozenset({eos}))
    free = get_decoder("greedy").generate(model, ids, stop)
    # answers the model would not give unconstrained (it answers a count), both spans of the prompt:
    # one of them, ended by the stop token, comes out
    answers = [tokenizer(" Peter Blackburn", add_special_tokens=False).input_ids, tokenizer(" Blackburn", add_special_tokens=False).input_ids]
    assert free.tokens[0] not in answers
    trie = TokenTrie(answer + [eos] for answer in answers)
    constrained = get_decoder("greedy").generate(model, ids, stop, constraints=[TrieConstraint([trie])])
    assert constrained.tokens[0] in answers and constrained.stopped[0]
    answer = constrained.tokens[0] + [eos]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.cat([ids, torch.tensor([answer[:-1]])], 1)).logits[0, -len(answer):], -1)
    expected = sum(float(lp[t]) for lp, t in zip(logprobs, answer))
    assert constrained.scores[0] == pytest.approx(expected, abs=1e-3)  # the model's own log-probabilities
    assert get_decoder("greedy").generate(model, ids, stop, constraints=[TrieConstraint([None])]).tokens == free.tokens
    drafted = get_decoder("copy").generate(model, ids, stop, constraints=[TrieConstraint([trie])])  # the answer is in the prompt: copied
    assert drafted.tokens == constrained.tokens and drafted.forward_passes < constrained.forward_passes
    assert drafted.scores[0] == pytest.approx(constrained.scores[0], abs=1e-3)
    assert trie.follow(answers[1]) is not None and trie.follow(answers[1] + answers[1]) is None


@pytest.mark.parametrize("name", ["copy", "anpd", "jacobi"])
def test_constraints_compose_with_drafting_decoders_as_with_greedy(tiny_engine, name: str) -> None:
    """A banned first token and a trie give the same tokens and scores under greedy and under
    every drafter, in a left-padded batch; drafts never leave the trie."""
    model, tokenizer, eos = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer, tiny_engine.ner_model.eos_token_id
    rows = [tokenizer(p).input_ids for p in PROMPTS[:2]]
    ids, mask = left_pad(rows, eos)
    stop = StopCriteria(16, frozenset({eos}))
    free = get_decoder("greedy").generate(model, ids, stop, attention_mask=mask)
    answers = [tokenizer(" Peter Blackburn", add_special_tokens=False).input_ids, tokenizer(" EU", add_special_tokens=False).input_ids]
    trie = TokenTrie(answer + [eos] for answer in answers)
    constraints = [BannedFirstToken([free.tokens[0][0] if free.tokens[0] else None, answers[0][0]]), TrieConstraint([None, trie])]
    expected = get_decoder("greedy").generate(model, ids, stop, attention_mask=mask, constraints=constraints)
    assert expected.tokens[0][:1] != free.tokens[0][:1]  # the free row's first token was banned
    assert expected.tokens[1] == answers[1] and expected.stopped[1]  # the trie's other answer, then the end
    decoder = get_decoder(name)
    decoder.expected_accepted = 1.0  # draft from the first step
    got = decoder.generate(model, ids, stop, attention_mask=mask, constraints=constraints)
    assert got.tokens == expected.tokens and got.stopped == expected.stopped
    assert got.scores == pytest.approx(expected.scores, abs=1e-3)


def test_token_bias_and_continued_constraints(tiny_engine) -> None:
    logprobs = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5, 0.0]]), -1)
    assert choose(logprobs.clone(), [TokenBias({2: 2.0})], [0], [[]]).item() == 2
    banned = BannedFirstToken([0])
    assert choose(logprobs.clone(), [banned], [0], [[]]).item() == 1
    assert choose(logprobs.clone(), [banned], [0], [[3]]).item() == 0  # only a first token is banned
    assert banned.first_token_only and not TrieConstraint([None]).first_token_only
    trie = TrieConstraint([TokenTrie([[3, 2, 1]])])
    (after,) = continued([trie], [0], [[3]])
    assert choose(logprobs.clone(), [after], [0], [[]]).item() == 2  # row 0 continues its trie after 3
    assert admissible_draft([2, 0, 1], [after], 0, []) == [2]  # 0 may not follow 3, 2


def test_a_decoder_without_constraint_support_refuses_constraints(tiny_engine) -> None:
    model, eos = tiny_engine.ner_model.model, tiny_engine.ner_model.eos_token_id
    with pytest.raises(ValueError, match="does not take token constraints"):
        get_decoder("lookahead").generate(model, _ids(tiny_engine, PROMPTS[0]), StopCriteria(4, frozenset({eos})),
                                          constraints=[BannedFirstToken([eos])])


def test_copy_candidates_are_what_follows_every_occurrence() -> None:
    source = [5, 1, 2, 3, 1, 4, 1]
    assert copy_candidates(source, 1, 2) == [[4, 1], [2, 3]]  # latest first; the last 1 has nothing after it
    assert copy_candidates(source, 9, 2) == []
    assert copy_candidates([1, 2, 1, 2], 1, 1) == [[2]]  # distinct
