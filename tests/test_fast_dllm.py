"""Masked-diffusion sampling (LLaDA baseline, Fast-dLLM cache and parallel unmasking) and the
``fast_dllm`` NER strategy, with real forward passes of a small diffusion model trained by the recipe."""

from __future__ import annotations

import json

from pathlib import Path

import pytest
import torch

from general_decoding import left_pad
from general_decoding.diffusion import (
    BlockDiffusionSampler,
    FactorUnmasking,
    FixedStepsUnmasking,
    LeftToRightUnmasking,
    ThresholdUnmasking,
    bidirectional_mask,
    block_bounds,
    causal_prompt_mask,
    fast_dllm_sampler,
    llada_sampler,
)
from general_decoding.diffusion.sampler import BlockStartCache
from ner_service.engine import NEREngine, prompts
from ner_service.engine import UnsupportedStrategyError
from corpora import Example, Span

TEXTS = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn",
    "BRUSSELS 1996-08-22",
    "Germany 's representative to the European Union 's veterinary committee Werner Zwingmann said on Wednesday consumers should buy sheepmeat from countries other than Britain .",
    "Leicester : Leicestershire beat Somerset by an innings and 39 runs .",
]


GOLD = {  # the mentions of TEXTS, for a small diffusion model trained on them in seconds
    0: [("EU", "ORG"), ("German", "MISC"), ("British", "MISC")],
    1: [("Peter Blackburn", "PER")],
    2: [("BRUSSELS", "LOC")],
    3: [("Germany", "LOC"), ("European Union", "ORG"), ("Werner Zwingmann", "PER"), ("Britain", "LOC")],
    4: [("Leicester", "LOC"), ("Leicestershire", "ORG"), ("Somerset", "ORG")],
}


@pytest.fixture(scope="module")
def diffusion_engine(tmp_path_factory: pytest.TempPathFactory) -> NEREngine:
    """A masked-diffusion NER model trained (memorising TEXTS) by the real recipe, ~30 s on the CPU."""
    from training.diffusion import DiffusionConfig, train_diffusion

    folder = tmp_path_factory.mktemp("diffusion")
    records = []
    for index, text in enumerate(TEXTS):
        entities = [{"start": text.index(m), "end": text.index(m) + len(m), "label": label} for m, label in GOLD[index]]
        records.append(json.dumps({"text": text, "entities": entities}))
    (folder / "train.jsonl").write_text("\n".join(records * 8) + "\n", encoding="utf-8")
    train_diffusion(DiffusionConfig(train=str(folder / "train.jsonl"), output=str(folder / "model"), name="tiny-diffusion",
                                    answer_tokens=32, vocab_size=400, hidden_size=64, layers=2, heads=4, batch_rows=16,
                                    max_steps=800, warmup_steps=10, lr=3e-3))
    return NEREngine.load(folder / "model")


@pytest.fixture(scope="module")
def batch(diffusion_engine: NEREngine) -> dict:
    """Real prompts (left-padded in the sampler) and the ids the sampler needs."""
    ner_model = diffusion_engine.ner_model
    tokenizer = ner_model.tokenizer
    query = tokenizer(prompts.ar_query(), add_special_tokens=False).input_ids
    return {
        "model": ner_model.model,
        "prompts": [tokenizer(prompts.prefix(t)).input_ids + query for t in TEXTS],
        "answer_length": ner_model.config.max_ar_tokens,
        "mask_id": tokenizer.mask_token_id,
        "eos_id": ner_model.eos_token_id,
    }


def _run(sampler: BlockDiffusionSampler, batch: dict, rows: slice = slice(None)):
    return sampler.sample(batch["model"], batch["prompts"][rows], batch["answer_length"], batch["mask_id"], batch["eos_id"])


# -- layout and unmasking rules on hand-built cases -------------------------------------------


def test_block_bounds_cover_the_answer_in_order() -> None:
    assert block_bounds(5, 10, 4) == [(5, 9), (9, 13), (13, 15)]
    assert block_bounds(0, 8, 8) == [(0, 8)]
    assert block_bounds(3, 2, 16) == [(3, 5)]
    with pytest.raises(ValueError):
        block_bounds(0, 8, 0)


def test_a_causal_prompt_never_sees_the_answer_and_the_answer_sees_everything() -> None:
    key_mask = torch.tensor([[0, 1, 1, 1, 1, 1]])  # one padding column, prompt = columns 1-2, answer = 3-5
    seen = causal_prompt_mask(key_mask, torch.float32, answer_start=3)[0, 0] == 0
    assert seen[1].tolist() == [False, True, False, False, False, False]
    assert seen[2].tolist() == [False, True, True, False, False, False]
    assert seen[4].tolist() == [False, True, True, True, True, True]
    # a cached step: queries = columns 2-3, keys = cached columns 0-1 then 2-3
    step = causal_prompt_mask(key_mask[:, :4], torch.float32, 3, query_columns=[2, 3], key_columns=[0, 1, 2, 3])[0, 0] == 0
    assert step.tolist() == [[False, True, True, False], [False, True, True, True]]


def test_prompts_are_right_aligned_and_padding_is_never_attended() -> None:
    ids, mask = left_pad([[7, 8, 9], [5]], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    keys = torch.cat([mask, torch.ones(2, 2, dtype=torch.long)], dim=1)
    full = bidirectional_mask(keys, torch.float32)
    assert full.shape == (2, 1, 5, 5)
    blocked = torch.finfo(torch.float32).min
    assert (full[0] == 0).all()  # no padding: every query sees every key, later ones included
    assert (full[1, 0, :, :2] == blocked).all() and (full[1, 0, :, 2:] == 0).all()
    assert bidirectional_mask(keys, torch.float32, queries=2).shape == (2, 1, 2, 5)


def test_fixed_steps_follow_lladas_schedule_most_confident_first() -> None:
    rule = FixedStepsUnmasking(steps=3)
    initial = torch.tensor([8, 4])
    assert rule.counts(initial, 0).tolist() == [3, 2] and rule.counts(initial, 1).tolist() == [3, 1]
    confidence = torch.tensor([[0.1, 0.9, 0.5, 0.7, 0.2, 0.3, 0.8, 0.6], [0.9, 0.1, 0.8, 0.3, 0.2, 0.2, 0.2, 0.2]])
    masked = torch.tensor([[True] * 8, [True, True, True, True, False, False, False, False]])
    chosen = rule.select(confidence, masked, 0, initial)
    assert chosen[0].nonzero().flatten().tolist() == [1, 3, 6]
    assert chosen[1].nonzero().flatten().tolist() == [0, 2]
    last = rule.select(confidence, masked, 2, initial)  # the last step fills whatever is left
    assert last.equal(masked)


def test_threshold_takes_everything_above_it_and_at_least_one() -> None:
    confidence = torch.tensor([[0.95, 0.2, 0.91, 0.99], [0.3, 0.6, 0.5, 0.1], [0.99, 0.99, 0.99, 0.99]])
    masked = torch.tensor([[True, True, True, False], [True, True, True, True], [False, False, False, False]])
    chosen = ThresholdUnmasking(0.9).select(confidence, masked, 0, masked.sum(-1))
    assert chosen.tolist() == [[True, False, True, False], [False, True, False, False], [False, False, False, False]]
    one = ThresholdUnmasking(1.0).select(confidence, masked, 0, masked.sum(-1))
    assert one.sum(-1).tolist() == [1, 1, 0]


def test_left_to_right_takes_the_first_masked_position_and_the_confident_run_after_it() -> None:
    confidence = torch.tensor([[0.2, 0.95, 0.3, 0.99, 0.99], [0.99, 0.99, 0.95, 0.5, 0.99], [0.1, 0.1, 0.1, 0.1, 0.1]])
    masked = torch.tensor([[True, True, True, True, True], [False, True, False, True, True], [False, False, False, False, False]])
    chosen = LeftToRightUnmasking(0.9).select(confidence, masked, 0, masked.sum(-1))
    # row 0: the first position (however unsure), then 0.95; 0.3 ends the run, 0.99 after it waits
    # row 1: position 1 first; position 2 is known, so the run goes on to 3, which is below the threshold
    assert chosen.tolist() == [[True, True, False, False, False], [False, True, False, False, False], [False] * 5]
    assert LeftToRightUnmasking(1.0).select(confidence, masked, 0, masked.sum(-1)).sum(-1).tolist() == [1, 1, 0]


def test_factor_rule_accepts_the_leading_run_that_meets_its_bound() -> None:
    # bounds for factor 1: n=1 -> 0.5, n=2 -> 0.667, n=3 -> 0.75, n=4 -> 0.8
    confidence = torch.tensor([[0.9, 0.7, 0.76, 0.1], [0.4, 0.3, 0.2, 0.1], [0.8, 0.9, 0.1, 0.76]])
    masked = torch.ones(3, 4, dtype=torch.bool)
    chosen = FactorUnmasking(1.0).select(confidence, masked, 0, masked.sum(-1))
    # row 0: 0.9, 0.76 pass, 0.7 < 0.75 stops the run; row 1: at least one; row 2: 0.9, 0.8, 0.76
    assert chosen.tolist() == [[True, False, True, False], [True, False, False, False], [True, True, False, True]]


# -- samplers with the shipped diffusion model ------------------------------------------------


@pytest.mark.parametrize(("shift", "causal_prompt"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refreshed_every_step_reproduces_the_uncached_sampler(batch: dict, cache: str, shift: bool, causal_prompt: bool) -> None:
    layout = {"shift": shift, "causal_prompt": causal_prompt}
    uncached = _run(BlockDiffusionSampler(8, ThresholdUnmasking(0.9), cache="none", **layout), batch)
    refreshed = _run(BlockDiffusionSampler(8, ThresholdUnmasking(0.9), cache=cache, refresh_every=1, **layout), batch)
    assert refreshed.tokens == uncached.tokens
    assert refreshed.token_logprobs == uncached.token_logprobs
    assert refreshed.steps_per_block == uncached.steps_per_block


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_fresh_cache_gives_the_full_forward_logits(batch: dict, cache: str, shift: bool) -> None:
    """The cached block forward equals the full forward while the cache is up to date (with
    ``shift`` the block is read from the column before each position, which runs with it)."""
    sampler = BlockDiffusionSampler(8, ThresholdUnmasking(0.9), cache=cache, shift=shift)
    model = batch["model"]
    ids, key_mask = left_pad(batch["prompts"], batch["eos_id"])
    start = ids.shape[1]
    ids = torch.cat([ids, torch.full((len(ids), 16), batch["mask_id"])], dim=1)
    ids[:, start:start + 3] = batch["eos_id"]  # some answer tokens already decided
    key_mask = torch.cat([key_mask, torch.ones(len(ids), 16, dtype=torch.long)], dim=1)
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        full, kv, kept = sampler._full(model, ids, positions, key_mask, bidirectional_mask(key_mask, model.dtype), start + 8, start + 16)
        cached = sampler._cached(model, ids, positions, key_mask, kv, kept, start + 8, start + 16, start)
        assert kv.get_seq_length() == kept.shape[1]  # cut back after the block forward
    torch.testing.assert_close(cached, full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shift", [False, True])
def test_a_causal_prompt_encoded_once_gives_the_full_forward(batch: dict, shift: bool) -> None:
    """With a causal prompt the full forward of a block runs the answer alone against the
    prompt's keys and values, computed once: the same hidden states and cache as running it all."""
    sampler = BlockDiffusionSampler(8, ThresholdUnmasking(0.9), cache="dual", shift=shift, causal_prompt=True)
    model = batch["model"]
    ids, key_mask = left_pad(batch["prompts"], batch["eos_id"])
    start = ids.shape[1]
    ids = torch.cat([ids, torch.full((len(ids), 16), batch["mask_id"])], dim=1)
    key_mask = torch.cat([key_mask, torch.ones(len(ids), 16, dtype=torch.long)], dim=1)
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    mask = causal_prompt_mask(key_mask, model.dtype, start)
    rows = torch.tensor([3, 0])  # the rows still decoding
    with torch.inference_mode():
        prompt = sampler._encode_prompt(model, ids, positions, mask, start - int(shift))
        whole, whole_kv, kept = sampler._full(model, ids[rows], positions[rows], key_mask[rows], mask[rows], start + 8, start + 16)
        reused, reused_kv, _ = sampler._full(model, ids[rows], positions[rows], key_mask[rows], mask[rows], start + 8, start + 16,
                                             prompt.for_rows(rows))
    assert prompt.columns == start - int(shift)
    torch.testing.assert_close(reused, whole, atol=2e-5, rtol=1e-4)
    real = kept.bool()  # a padding column's keys are never attended
    for mine, theirs in zip(reused_kv.layers, whole_kv.layers):
        torch.testing.assert_close(mine.keys.transpose(1, 2)[real], theirs.keys.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)


def test_one_token_per_step_reproduces_the_baseline_sampler(batch: dict) -> None:
    baseline = _run(llada_sampler(block_size=8), batch)
    parallel = _run(BlockDiffusionSampler(8, ThresholdUnmasking(1.0), cache="none"), batch)
    assert parallel.tokens == baseline.tokens
    assert parallel.forward_passes == baseline.forward_passes
    assert baseline.steps_per_block and all(steps == 8 for steps in baseline.steps_per_block)


def test_padding_in_a_batch_does_not_change_a_row(batch: dict) -> None:
    together = _run(llada_sampler(block_size=8), batch)
    alone = _run(llada_sampler(block_size=8), batch, slice(3, 4))
    assert alone.tokens[0] == together.tokens[3]


@pytest.mark.parametrize(("shift", "causal_prompt"), [(False, False), (True, False), (True, True)])
def test_a_block_started_from_the_block_befores_cache_gives_the_full_forward(batch: dict, shift: bool, causal_prompt: bool) -> None:
    """Starting a block from the cache the block before started with (``full_forward_every``) reruns
    only the columns that changed: where nothing else changed since, it is the full forward, its
    hidden states and the cache of the block's later steps alike."""
    sampler = BlockDiffusionSampler(8, ThresholdUnmasking(0.9), cache="dual", shift=shift, causal_prompt=causal_prompt, full_forward_every=None)
    model = batch["model"]
    ids, key_mask = left_pad(batch["prompts"], batch["eos_id"])
    start = ids.shape[1]
    ids = torch.cat([ids, torch.full((len(ids), 24), batch["mask_id"])], dim=1)
    ids[:, start:start + 8] = batch["eos_id"]  # the first block decoded; the second next
    key_mask = torch.cat([key_mask, torch.ones(len(ids), 24, dtype=torch.long)], dim=1)
    positions = (key_mask.cumsum(-1) - 1).clamp(min=0)
    mask = causal_prompt_mask(key_mask, model.dtype, start) if causal_prompt else bidirectional_mask(key_mask, model.dtype)
    rows = torch.tensor([0, 2, 3])  # row 1 finished with the first block
    with torch.inference_mode():
        _, first, first_mask = sampler._full(model, ids, positions, key_mask, mask, start, start + 8)
        carried = BlockStartCache.of(first, sampler._cached_columns(start, start + 8, ids.shape[1]), torch.arange(len(ids)), first_mask, 0)
        full, full_kv, full_kept = sampler._full(model, ids[rows], positions[rows], key_mask[rows], mask[rows], start + 8, start + 16)
        restarted, kv, kept = sampler._restart(model, ids[rows], positions[rows], key_mask[rows], carried, rows, start + 8, start + 16, start)
    torch.testing.assert_close(restarted, full, atol=2e-5, rtol=1e-4)
    assert torch.equal(kept, full_kept)
    real = kept.bool()  # a padding column's keys are never attended
    for mine, theirs in zip(kv.layers, full_kv.layers):
        torch.testing.assert_close(mine.keys.transpose(1, 2)[real], theirs.keys.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(mine.values.transpose(1, 2)[real], theirs.values.transpose(1, 2)[real], atol=2e-5, rtol=1e-4)


def test_blocks_started_from_the_block_befores_cache_run_narrow_and_keep_the_answers(batch: dict) -> None:
    """After the first block, a block starts with a forward of two blocks rather than of the
    whole answer, and every ``full_forward_every``-th block runs the whole answer again."""
    widths: list[int] = []
    hook = batch["model"].get_decoder().register_forward_hook(lambda module, args, kwargs, out: widths.append(kwargs["input_ids"].shape[1]),
                                                              with_kwargs=True)
    try:
        exact = _run(BlockDiffusionSampler(8, LeftToRightUnmasking(0.9), cache="dual"), batch)
        full_starts = [w for w in widths if w > 8]
        widths.clear()
        reused = _run(BlockDiffusionSampler(8, LeftToRightUnmasking(0.9), cache="dual", full_forward_every=3), batch)
    finally:
        hook.remove()
    # the same answers; a block may take a step fewer or more, as the stale suffix moves its confidences
    assert reused.tokens == exact.tokens
    starts = [w for w in widths if w > 8]
    assert len(starts) == len(full_starts) >= 3  # one forward wider than a block per block start, as before
    assert starts[0] == full_starts[0] >= batch["answer_length"]  # the first runs the whole answer
    assert starts[1:3] == [16, 16] and starts[3:4] == full_starts[3:4]  # two blocks start narrow, then a full forward
    with pytest.raises(ValueError, match="dual"):
        BlockDiffusionSampler(8, cache="prefix", full_forward_every=None)
    with pytest.raises(ValueError, match=">= 1"):
        BlockDiffusionSampler(8, cache="dual", full_forward_every=0)


@pytest.mark.parametrize("full_forward_every", [1, None], ids=["full-starts", "first-full-only"])
@pytest.mark.parametrize("unmasking", [ThresholdUnmasking(0.9), LeftToRightUnmasking(0.9)], ids=["threshold", "left-to-right"])
def test_each_row_of_a_cached_batch_gets_the_answer_it_gets_alone(batch: dict, unmasking, full_forward_every: int | None) -> None:
    # rows finish a block at different steps and leave the cached steps; the others go on exactly
    sampler = BlockDiffusionSampler(8, unmasking, cache="dual", full_forward_every=full_forward_every)
    together = _run(sampler, batch)
    assert len(set(map(len, together.tokens))) > 1, "the rows should end at different lengths"
    for row in range(len(TEXTS)):
        assert _run(sampler, batch, slice(row, row + 1)).tokens[0] == together.tokens[row]


def test_fast_dllm_never_needs_more_forwards_than_the_baseline(batch: dict) -> None:
    baseline = _run(llada_sampler(block_size=8), batch)
    fast = _run(BlockDiffusionSampler(8, ThresholdUnmasking(0.9), cache="dual"), batch)
    assert all(stopped for stopped in fast.stopped)  # every answer closed with the end token
    # a model sure of its answers unmasks several tokens per step: fewer forwards, same answers
    assert fast.forward_passes < baseline.forward_passes
    assert fast.tokens == baseline.tokens


# -- the NER strategy and the training objective ----------------------------------------------


def test_engine_decoder_fast_dllm_returns_aligned_entities(diffusion_engine: NEREngine) -> None:
    results = diffusion_engine.extract(TEXTS, strategy="fast_dllm")
    assert len(results) == len(TEXTS)
    entities = [e for r in results for e in r.entities]
    assert entities, "the diffusion model found no entity at all"
    for text, result in zip(TEXTS, results):
        for entity in result.entities:
            assert text[entity.start:entity.end] == entity.text and entity.label in diffusion_engine.labels
            assert 0 < entity.score <= 1
        assert result.stats.forward_passes > 0
    only_per = diffusion_engine.extract(TEXTS, labels=["PER"], strategy="fast_dllm")
    assert all(e.label == "PER" for r in only_per for e in r.entities)


def test_the_engine_samples_at_the_models_threshold(diffusion_engine: NEREngine) -> None:
    config = diffusion_engine.ner_model.config
    chosen = config.diffusion_threshold
    forwards = {}
    try:
        for threshold in (0.0, 1.0):  # every run accepted at once, or one token a step
            config.diffusion_threshold = threshold
            forwards[threshold] = sum(r.stats.forward_passes for r in diffusion_engine.extract(TEXTS, strategy="fast_dllm"))
    finally:
        config.diffusion_threshold = chosen
    assert forwards[0.0] < forwards[1.0]


def test_the_default_sampler_reads_left_to_right_where_scattered_tokens_disagree(diffusion_en_engine: NEREngine) -> None:
    # a dev sentence where the paper's threshold rule unmasks "Peter" twice (each copy unsure of
    # the other) and cuts "Headingley"; the engine's left-to-right run reads it as one token at a time does
    text = ("Essex , however , look certain to regain their top spot after Nasser Hussain and Peter Such gave them a firm grip "
            "on their match against Yorkshire at Headingley .")
    found = {(e.text, e.label) for e in diffusion_en_engine.extract([text], strategy="fast_dllm")[0].entities}
    assert {("Nasser Hussain", "PER"), ("Peter Such", "PER"), ("Headingley", "LOC")} <= found
    diffusion_en_engine.diffusion_sampler = fast_dllm_sampler(8, 0.9, "dual")
    try:
        scattered = {(e.text, e.label) for e in diffusion_en_engine.extract([text], strategy="fast_dllm")[0].entities}
    finally:
        diffusion_en_engine.diffusion_sampler = None
    assert ("Peter Such", "PER") not in scattered


def test_fast_dllm_refuses_a_model_without_a_mask_token(tiny_engine: NEREngine) -> None:
    with pytest.raises(UnsupportedStrategyError, match="not a masked-diffusion model"):
        tiny_engine.extract(TEXTS[:1], strategy="fast_dllm")


def test_training_rows_and_a_short_run_save_a_loadable_model(tmp_path: Path) -> None:
    from training.diffusion import DiffusionConfig, build_row, train_diffusion

    examples = [Example("Peter lives in Paris .", [Span(0, 5, "PER"), Span(15, 20, "LOC")]), Example("Nothing here .", [])] * 8
    corpus = tmp_path / "train.jsonl"
    corpus.write_text("\n".join(
        '{"text": "%s", "entities": [%s]}' % (e.text, ", ".join(f'{{"start": {s.start}, "end": {s.end}, "label": "{s.label}"}}' for s in e.spans))
        for e in examples) + "\n", encoding="utf-8")
    config = DiffusionConfig(train=str(corpus), output=str(tmp_path / "model"), answer_tokens=12, vocab_size=300, hidden_size=32,
                             layers=1, heads=4, batch_rows=8, max_steps=3, warmup_steps=1)
    summary = train_diffusion(config)
    assert summary["steps"] == 3
    engine = NEREngine.load(tmp_path / "model")
    tokenizer = engine.ner_model.tokenizer
    row = build_row(examples[0], ["LOC", "PER"], tokenizer, 12)
    assert len(row.answer) == 12 and row.answer[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(row.answer, skip_special_tokens=True) == "\nPER: Peter\nLOC: Paris"
    short = build_row(examples[0], ["LOC", "PER"], tokenizer, len(tokenizer("\nPER: Peter", add_special_tokens=False).input_ids) + 1)
    assert tokenizer.decode(short.answer, skip_special_tokens=True) == "\nPER: Peter"  # whole lines only
    assert engine.ner_model.config.max_ar_tokens == 12 and tokenizer.mask_token_id is not None
    [result] = engine.extract(["Peter lives in Paris ."], strategy="fast_dllm")
    assert result.stats.forward_passes > 0


def test_an_adapted_ner_model_trains_a_stacked_adapter_that_decodes(tmp_path: Path) -> None:
    """``init`` = an NER model: a LoRA adapter on it, an existing token as the mask, the
    next-token head kept (``diffusion_shift``); it saves small, loads like any model, and a
    later run trains that adapter further (``init_adapter``)."""
    from ner_service.engine import NERModelConfig
    from training.diffusion import DiffusionConfig, train_diffusion

    from dataclasses import replace
    from shutil import copytree

    from ner_service.engine.ner_model import resolve_ner_model
    from safetensors.torch import load_file

    corpus = tmp_path / "train.jsonl"
    corpus.write_text('{"text": "Peter lives in Paris .", "entities": [{"start": 0, "end": 5, "label": "PER"}]}\n' * 8, encoding="utf-8")
    ar_model = copytree(resolve_ner_model("tiny-conll03"), tmp_path / "ar-model")
    replace(NERModelConfig.read(ar_model), sentence_windows=True, window_tokens=24, count_bias=0.5).write(ar_model)
    first = DiffusionConfig(train=str(corpus), output=str(tmp_path / "model"), init=str(ar_model), mask_token="^",
                            lora_r=4, lora_layers=1, answer_tokens=12, batch_rows=8, max_steps=2, warmup_steps=1)
    train_diffusion(first)
    config = NERModelConfig.read(tmp_path / "model")
    assert (config.base, config.mask_token, config.diffusion_shift, config.diffusion_causal_prompt) == (str(ar_model), "^", True, True)
    assert (config.sentence_windows, config.window_tokens, config.max_ar_tokens) == (True, 24, 12)  # it reads the windows it was adapted on
    assert json.loads((tmp_path / "model" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(ar_model)
    assert (tmp_path / "model" / "adapter_model.safetensors").is_file() and not (tmp_path / "model" / "model.safetensors").exists()
    engine = NEREngine.load(tmp_path / "model")
    assert engine.ner_model.tokenizer.mask_token_id == engine.ner_model.tokenizer.convert_tokens_to_ids("^")
    [result] = engine.extract(["Peter lives in Paris ."], strategy="fast_dllm")
    assert result.stats.forward_passes > 0 and all("Peter lives in Paris ."[e.start:e.end] == e.text for e in result.entities)

    # trained further (``init_adapter``): the same adapter, changed, still one adapter on the AR model
    saved = load_file(tmp_path / "model" / "adapter_model.safetensors")
    train_diffusion(replace(first, output=str(tmp_path / "further"), init_adapter=str(tmp_path / "model"), seed=1))
    further = load_file(tmp_path / "further" / "adapter_model.safetensors")
    assert further.keys() == saved.keys() and any(not torch.equal(further[k], saved[k]) for k in saved)
    assert NERModelConfig.read(tmp_path / "further").base == str(ar_model)
    with pytest.raises(ValueError, match="LoRA rank 4 where the run has 8"):
        train_diffusion(replace(first, output=str(tmp_path / "unfit"), init_adapter=str(tmp_path / "model"), lora_r=8))


def test_the_blockwise_schedule_masks_a_block_after_a_clean_prefix_and_everything_after_it() -> None:
    """What block-wise decoding meets: the answer before the block clean, the block partly
    masked (its first token always), the rest masked; only the block's masked tokens are targets."""
    from training.diffusion import blockwise_noise

    eos, block = 0, 4
    answers = torch.tensor([[5, 6, 7, 8, 9, 10, 0, 0, 0, 0, 0, 0]] * 64 + [[0] * 12] * 8)
    noise = blockwise_noise(answers, eos, block, torch.Generator().manual_seed(0))
    targets = noise.weights > 0
    starts = set()
    for masked, target in zip(noise.masked.tolist(), targets.tolist()):
        start = masked.index(True)
        starts.add(start)
        assert target[start] and not any(masked[:start]) and all(masked[start + block:])
        assert [i for i, t in enumerate(target) if t] == [i for i in range(start, min(start + block, 12)) if masked[i]]
    assert starts == set(range(7))  # any start up to the first end token, which must be predicted too
    assert torch.allclose(noise.weights.sum(), torch.tensor(1.0))


def test_a_diffusion_run_stopped_mid_way_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that dies after its third step resumes from its checkpoint (weights, optimizer, data
    order, mask noise) and ends with the weights of the run that never stopped."""
    import training.diffusion as diffusion
    from safetensors.torch import load_file

    corpus = tmp_path / "train.jsonl"
    corpus.write_text("".join(json.dumps({"text": t, "entities": [{"start": t.index(m), "end": t.index(m) + len(m), "label": label}
                                                                      for m, label in GOLD[i]]}) + "\n" for i, t in enumerate(TEXTS)) * 4,
                      encoding="utf-8")

    def config(output: str, resume: bool = False) -> diffusion.DiffusionConfig:
        return diffusion.DiffusionConfig(train=str(corpus), output=str(tmp_path / output), init="tiny-conll03", mask_token="^", lora_r=4,
                                         lora_layers=1, answer_tokens=16, batch_rows=4, max_steps=6, warmup_steps=2, save_minutes=0,
                                         mask_schedule="blockwise", block_size=4, resume=resume)

    diffusion.train_diffusion(config("whole"))
    step = diffusion.optimizer_step
    calls = []

    def dies_after_three(*args, **kwargs) -> None:
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(1)
        step(*args, **kwargs)

    monkeypatch.setattr(diffusion, "optimizer_step", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        diffusion.train_diffusion(config("stopped"))
    monkeypatch.setattr(diffusion, "optimizer_step", step)
    assert (tmp_path / "stopped" / "checkpoint").is_dir() and (tmp_path / "stopped" / "snapshots" / "minute-0").is_dir()
    summary = diffusion.train_diffusion(config("stopped", resume=True))
    assert summary["steps"] == 6 and not (tmp_path / "stopped" / "checkpoint").exists()
    whole, resumed = (load_file(tmp_path / name / "adapter_model.safetensors") for name in ("whole", "stopped"))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
