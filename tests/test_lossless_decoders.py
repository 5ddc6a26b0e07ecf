"""Every lossless decoder reproduces greedy decoding token for token: alone, in left-padded
batches, behind a cached prefix (the engine's mention step), and when drafts are mostly wrong."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from general_decoding import StopCriteria, get_decoder
from general_decoding.base import position_ids_from_mask
from general_decoding.draft_verify import DraftVerifyDecoder
from ner_service.engine import prompts

LOSSLESS = ["jacobi", "gs_jacobi", "anpd", "lookahead", "copy", "speculative"]
TEXTS = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn",
    "BRUSSELS 1996-08-22",
    "The European Commission said on Thursday it disagreed with German advice to consumers to shun British lamb until scientists determine whether mad cow disease can be transmitted to sheep .",
    "Germany 's representative to the European Union 's veterinary committee Werner Zwingmann said on Wednesday consumers should buy sheepmeat from countries other than Britain until the scientific advice was clearer .",
    "Fischler proposed EU-wide measures after reports from Britain and France that under laboratory conditions sheep could contract Bovine Spongiform Encephalopathy ( BSE ) -- mad cow disease .",
    "Leicester : Leicestershire beat Somerset by an innings and 39 runs .",
    "Hove : Sussex 363 ( W. Athey 111 , V. Drakes 52 ; I. Austin 4-37 ) , Lancashire 197-8 ( W. Hegg 54 )",
]


def _queries(tokenizer) -> list[list[int]]:
    """Real NER prompts: AR queries and PaDeLLM mention queries over the texts."""
    rows = []
    for text in TEXTS:
        prefix = tokenizer(prompts.prefix(text)).input_ids
        rows.append(prefix + tokenizer(prompts.ar_query(), add_special_tokens=False).input_ids)
        for label, k in (("PER", 1), ("LOC", 2), ("ORG", 1)):
            rows.append(prefix + tokenizer(prompts.mention_query(label, 2, k), add_special_tokens=False).input_ids)
    return rows


def _decoder(name: str, model):
    """The decoder, drafting from its first step (Jacobi and lookahead would otherwise start
    greedy on these models) and in batches of any size, so that every draft-and-verify path runs."""
    if name != "speculative":
        decoder = get_decoder(name)
        decoder.expected_accepted = 1.0
    else:
        draft = copy.deepcopy(model)  # a perturbed copy: drafts are right only part of the time
        with torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            for parameter in draft.parameters():
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5 * parameter.std().clamp(min=1e-3))
        decoder = get_decoder("speculative", draft_model=draft)
    if isinstance(decoder, DraftVerifyDecoder):
        decoder.verify_tokens = 10_000
    return decoder


def _run(decoder, model, rows: list[list[int]], stop: StopCriteria, pad: int):
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return decoder.generate(model, ids, stop, attention_mask=mask)


@pytest.mark.parametrize("name", LOSSLESS)
def test_each_row_alone_equals_greedy(tiny_engine, name: str) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(40, frozenset({tokenizer.eos_token_id}))
    greedy, decoder = get_decoder("greedy"), _decoder(name, model)
    for row in _queries(tokenizer):
        expected = _run(greedy, model, [row], stop, 0)
        got = _run(decoder, model, [row], stop, 0)
        assert got.tokens == expected.tokens and got.stopped == expected.stopped
        assert got.scores == pytest.approx(expected.scores, abs=1e-3)
        assert got.forward_passes <= expected.forward_passes


@pytest.mark.parametrize("name", LOSSLESS)
def test_left_padded_batch_equals_greedy(tiny_engine, name: str) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(30, frozenset({tokenizer.eos_token_id}))
    rows = _queries(tokenizer)
    decoder = _decoder(name, model)
    if not decoder.supports_batch:  # one sequence at a time: a batch is refused, never mangled
        with pytest.raises(ValueError, match="one sequence at a time"):
            _run(decoder, model, rows, stop, 0)
        return
    expected = _run(get_decoder("greedy"), model, rows, stop, 0)
    got = _run(decoder, model, rows, stop, 0)
    assert got.tokens == expected.tokens
    assert got.stopped == expected.stopped


def test_a_large_batch_verifies_few_drafts_and_finished_rows_leave_it(tiny_engine) -> None:
    """A verification forward feeds at most ``verify_tokens`` tokens (or one per row): a large
    batch decodes greedily, drafts resume as rows finish and leave the batch."""
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(30, frozenset({tokenizer.eos_token_id}))
    rows = _queries(tokenizer)
    decoder = get_decoder("copy")
    decoder.verify_tokens = 48
    fed: list[tuple[int, int]] = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: fed.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        got = _run(decoder, model, rows, stop, 0)
    finally:
        hook.remove()
    expected = _run(get_decoder("greedy"), model, rows, stop, 0)
    assert got.tokens == expected.tokens and got.stopped == expected.stopped
    steps = fed[1:]  # after the prefill
    assert all(batch * width <= max(decoder.verify_tokens, batch) for batch, width in steps)
    assert steps[0] == (len(rows), 1)  # 32 rows: no room to draft
    assert [batch for batch, _ in steps] == sorted((batch for batch, _ in steps), reverse=True)
    assert steps[-1][0] < len(rows) and any(width > 1 for _, width in steps)


@pytest.mark.parametrize("name", LOSSLESS)
def test_behind_a_cached_prefix_equals_greedy(tiny_engine, name: str) -> None:
    """The engine's mention step: the text is in the cache, only the query is fed."""
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    prefix = tokenizer(prompts.prefix(TEXTS[3])).input_ids
    query = tokenizer(prompts.mention_query("ORG", 2, 1), add_special_tokens=False).input_ids
    stop = StopCriteria(24, frozenset({tokenizer.eos_token_id}))
    results = []
    for decoder in (get_decoder("greedy"), _decoder(name, model)):
        cache = DynamicCache()
        mask = torch.ones(1, len(prefix), dtype=torch.long)
        with torch.inference_mode():
            model(input_ids=torch.tensor([prefix]), attention_mask=mask, position_ids=position_ids_from_mask(mask), cache=cache, use_cache=True)
        full_mask = torch.ones(1, len(prefix) + len(query), dtype=torch.long)
        results.append(decoder.generate(model, torch.tensor([query]), stop, attention_mask=full_mask, past_key_values=cache, context_ids=[prefix]))
    assert results[1].tokens == results[0].tokens


@pytest.fixture(scope="module")
def shipped_greedy(en_engine) -> list[tuple[list[int], list[list[int]]]]:
    """The shipped model's first 4 query rows (one text's AR query and three mention queries) and
    greedy's tokens for each, decoded once for every decoder compared with them."""
    model, tokenizer = en_engine.ner_model.model, en_engine.ner_model.tokenizer
    stop = StopCriteria(48, frozenset({tokenizer.eos_token_id}))
    return [(row, _run(get_decoder("greedy"), model, [row], stop, 0).tokens) for row in _queries(tokenizer)[:4]]


@pytest.mark.slow
@pytest.mark.parametrize("name", LOSSLESS)
def test_shipped_model_decoders_equal_greedy(en_engine, shipped_greedy, name: str) -> None:
    model, tokenizer = en_engine.ner_model.model, en_engine.ner_model.tokenizer
    stop = StopCriteria(48, frozenset({tokenizer.eos_token_id}))
    rows = shipped_greedy[:2 if name == "speculative" else 4]  # a draft model as large as the model: each row costs twice
    for row, expected in rows:
        assert _run(_decoder(name, model), model, [row], stop, 0).tokens == expected


@pytest.mark.slow
def test_copy_drafting_accepts_several_tokens_per_forward_on_copied_mentions(en_engine) -> None:
    model, tokenizer = en_engine.ner_model.model, en_engine.ner_model.tokenizer
    stop = StopCriteria(40, frozenset({tokenizer.eos_token_id}))
    forwards = {"greedy": 0, "copy": 0}
    for row in _queries(tokenizer)[:4]:
        outputs = {name: _run(get_decoder(name), model, [row], stop, 0) for name in forwards}
        assert outputs["copy"].tokens == outputs["greedy"].tokens
        for name, out in outputs.items():
            forwards[name] += out.forward_passes
    assert forwards["copy"] < forwards["greedy"]


def test_gs_jacobi_reports_iterations_per_block(tiny_engine) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    row = _queries(tokenizer)[0]
    out = _run(get_decoder("gs_jacobi", block_size=4), model, [row], StopCriteria(20, frozenset({tokenizer.eos_token_id})), 0)
    blocks = out.details["iterations_per_block"]
    assert blocks and all(1 <= n <= 4 for n in blocks)
    assert sum(blocks) == out.forward_passes  # every forward belongs to one block


def test_speculative_without_a_draft_model_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="draft model"):
        get_decoder("speculative")


def _spans(extractions) -> list[list[tuple[int, int, str]]]:
    return [[(e.start, e.end, e.label) for e in x.entities] for x in extractions]


@pytest.fixture(scope="module")
def greedy_entities(en_engine) -> dict[str, list[list[tuple[int, int, str]]]]:
    """The shipped model's entities in the first 4 texts under each strategy with the greedy decoder."""
    return {strategy: _spans(en_engine.extract(TEXTS[:4], strategy=strategy)) for strategy in ("padellm", "ar")}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["jacobi", "gs_jacobi", "anpd", "lookahead", "copy"])
def test_engine_backends_give_the_greedy_entities(en_engine, greedy_entities, name: str) -> None:
    for strategy, expected in greedy_entities.items():
        assert _spans(en_engine.extract(TEXTS[:4], strategy=strategy, decoder=name)) == expected


@pytest.mark.slow
def test_copy_drafting_finishes_a_copied_mention_in_its_first_forward(en_engine) -> None:
    """Drafting starts with the first forward: a mention's first token fed with what follows it
    in the text verifies the rest of the mention and its end token at once."""
    model, tokenizer = en_engine.ner_model.model, en_engine.ner_model.tokenizer
    stop = StopCriteria(24, frozenset({tokenizer.eos_token_id}))
    prompt = tokenizer(prompts.prefix("Angela Merkel arrived on Monday .")).input_ids
    prompt += tokenizer(prompts.mention_query("PER", 1, 1), add_special_tokens=False).input_ids
    expected = _run(get_decoder("greedy"), model, [prompt], stop, 0)
    assert len(expected.tokens[0]) >= 2 and expected.stopped[0]
    first, rest = expected.tokens[0][0], expected.tokens[0][1:]
    got = _run(get_decoder("copy"), model, [prompt + [first]], stop, 0)
    assert got.tokens[0] == rest and got.stopped[0]
    assert got.forward_passes == 1
