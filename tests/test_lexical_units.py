"""Lexical-unit decoding and its fine-tuning: placeholder branches after every answer token in the
training tree, an adapter that changes placeholder columns only, the cached batched decoder equal
to a step-by-step reference."""

from __future__ import annotations

import math

import pytest
import torch

from general_decoding import StopCriteria, get_decoder
from general_decoding.draft_verify import RowState
from general_decoding.lexical_units import LexicalUnitDrafter, accepted_unit, placeholder_adapter, restrict_adapter_to_placeholders
from ner_service.engine import NEREngine, prompts
from training.examples import IGNORE, TrainingRow
from training.configs import LUDConfig
from training.lexical_units import lud_row, train_lud
from tests.entity_lists import assert_same_entities

TEXTS = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn met Angela Merkel in Paris and Berlin on Friday .",
    "Leicester : Leicestershire beat Somerset by an innings and 39 runs .",
]


def test_placeholder_branches_follow_every_answer_token() -> None:
    tree = [1, 2, 3, 4, 5, 6], [-1, 0, 1, 2, 3, 4]  # prefix 1 2, query token 3, answer 4 5 6
    targets = [IGNORE, IGNORE, 4, 5, 6, IGNORE]  # column 2 (token 3) predicts 4, ...
    row = lud_row(TrainingRow(*tree, targets), placeholder_id=99, unit_size=4)
    assert row.input_ids == [1, 2, 3, 4, 5, 6, 99, 99, 99]
    # after column 2 (next token 4) two placeholders predict 5 and 6; after column 3 (next 5) one predicts 6
    assert row.parents == [-1, 0, 1, 2, 3, 4, 2, 6, 3]
    assert row.targets == [IGNORE] * 6 + [5, 6, 6]
    assert lud_row(TrainingRow(*tree, targets), placeholder_id=99, unit_size=2).targets == [IGNORE] * 6 + [5, 6]


def test_the_adapter_changes_placeholder_columns_only(tmp_path) -> None:
    from peft import LoraConfig, get_peft_model

    engine = NEREngine.load("tiny-conll03")
    model, tokenizer = engine.ner_model.model, engine.ner_model.tokenizer
    prompt = tokenizer(prompts.prefix(TEXTS[1]) + prompts.ar_query()).input_ids
    placeholder = next(token for token in range(5, 1000) if token not in prompt)
    ids = torch.tensor([prompt + [placeholder] * 3])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    adapted = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
    restrict_adapter_to_placeholders(adapted.get_base_model(), placeholder)
    with torch.inference_mode():
        after = adapted(input_ids=ids).logits
    assert torch.equal(after[0, :-3], before[0, :-3])  # every other column computes exactly what it did
    assert not torch.allclose(after[0, -3:], before[0, -3:])
    placeholder_adapter(adapted.get_base_model(), placeholder)  # the inference form: the same update, gathered
    with torch.inference_mode():
        folded = adapted.get_base_model()(input_ids=ids).logits
    assert torch.equal(folded[0, :-3], before[0, :-3])
    torch.testing.assert_close(folded, after)


def _reference(model, prompt: list[int], placeholder: int, unit_size: int, threshold: float, stop: StopCriteria) -> list[int]:
    """LUD without a cache: the whole sequence is re-run at every step."""
    tokens: list[int] = []

    def emit(unit: list[int]) -> bool:
        for token in unit:
            if token in stop.stop_token_ids:
                return True
            tokens.append(token)
            if len(tokens) >= stop.max_new_tokens:
                return True
        return False

    with torch.inference_mode():
        done = emit([int(model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())])
        while not done:
            ids = prompt + tokens + [placeholder] * (unit_size - 1)
            probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -unit_size:].float(), dim=-1)
            best_p, best = probs.max(-1)
            done = emit(accepted_unit(int(best[0]), best[1:].tolist(), best_p[1:].tolist(), threshold))
    return tokens


@pytest.mark.parametrize("threshold", [0.0, 0.2, 0.6])
def test_cached_batched_decoder_equals_the_step_by_step_reference(tiny_engine, threshold: float) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(30, frozenset({tokenizer.eos_token_id}))
    placeholder = tokenizer.convert_tokens_to_ids("Ġ.")
    rows = [tokenizer(prompts.prefix(t) + prompts.ar_query()).input_ids for t in TEXTS]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    decoder = get_decoder("lud", unit_size=4, threshold=threshold, placeholder_id=placeholder)
    got = decoder.generate(model, ids, stop, attention_mask=mask)
    assert got.tokens == [_reference(model, r, placeholder, 4, threshold, stop) for r in rows]
    if threshold == 0.0:  # every placeholder accepted: whole units per forward
        assert got.tokens_per_forward > 2


@pytest.mark.parametrize("unit_size, min_probability", [(4, 0.0), (3, 0.0), (4, 0.5)])
def test_verified_units_are_token_for_token_greedy(unit_size: int, min_probability: float) -> None:
    from peft import LoraConfig, get_peft_model

    engine = NEREngine.load("tiny-conll03")  # its own copy: the adapter stays on it
    model, tokenizer = engine.ner_model.model, engine.ner_model.tokenizer
    stop = StopCriteria(30, frozenset({tokenizer.eos_token_id}))
    rows = [tokenizer(prompts.prefix(t) + prompts.ar_query()).input_ids for t in TEXTS]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    greedy = get_decoder("greedy").generate(model, ids, stop, attention_mask=mask)
    seen = {token for row in rows + greedy.tokens for token in row}
    placeholder = next(token for token in range(5, 1000) if token not in seen)
    adapted = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    restrict_adapter_to_placeholders(adapted.get_base_model(), placeholder)
    with torch.inference_mode():
        verified = get_decoder("lud", unit_size=unit_size, placeholder_id=placeholder, min_probability=min_probability).generate(
            adapted.get_base_model(), ids, stop, attention_mask=mask)
    assert verified.tokens == greedy.tokens
    assert sum(verified.accepted_per_pass) == sum(len(t) + int(s) for t, s in zip(greedy.tokens, greedy.stopped))


def test_a_unit_draft_stops_before_its_first_unlikely_placeholder_prediction() -> None:
    drafter = LexicalUnitDrafter(unit_size=4, placeholder_id=9, min_probability=0.5)
    drafter.start([RowState([1])], model=None)  # the placeholder is given: no model needed
    confident, unsure = math.log(0.8), math.log(0.3)
    drafter.observe(0, RowState([1]), predictions=[7, 8], accepted=1, trailing=[4, 5, 6], trailing_logprobs=[confident, unsure, confident])
    assert drafter.propose(0, RowState([1]), budget=3) == [4]
    drafter.observe(0, RowState([1]), predictions=[7, 8], accepted=0, trailing=[4, 5, 6], trailing_logprobs=[confident] * 3)
    assert drafter.propose(0, RowState([1]), budget=3) == []  # the draft was not accepted whole: the units no longer follow


def test_threshold_above_one_is_greedy_decoding(tiny_engine) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(25, frozenset({tokenizer.eos_token_id}))
    ids = torch.tensor([tokenizer(prompts.prefix(TEXTS[1]) + prompts.ar_query()).input_ids])
    lud = get_decoder("lud", threshold=1.01, placeholder_id=5).generate(model, ids, stop)
    assert lud.tokens == get_decoder("greedy").generate(model, ids, stop).tokens


def test_a_model_not_trained_for_units_is_a_clear_error(tiny_engine) -> None:
    with pytest.raises(ValueError, match="not fine-tuned for lexical units; the shipped models that are: .*recipe en-conll03-lud"):
        tiny_engine.extract(TEXTS[:1], strategy="ar", decoder="lud")


def test_train_lud_saves_a_stacked_model_that_decodes(tmp_path, data_dir) -> None:
    output = tmp_path / "lud"
    config = LUDConfig(model="tiny-conll03", train=str(data_dir / "conll2003" / "train.txt"), output=str(output),
                       name="tiny-lud", placeholder="<eos>", limit=12, max_steps=2, top_layers=1)
    summary = train_lud(config)
    assert summary["placeholder_targets"] > 0 and summary["steps"] == 2
    engine = NEREngine.load(output)
    reference = NEREngine.load("tiny-conll03")
    assert engine.name == "tiny-lud" and engine.ner_model.model.config.lud_placeholder_id == engine.ner_model.eos_token_id
    for strategy in ("padellm", "ar"):
        got = engine.extract(TEXTS, strategy=strategy, decoder="greedy")
        # greedy decoding never feeds a placeholder: the adapter leaves it exactly the model it was trained from
        assert_same_entities([r.entities for r in got], [r.entities for r in reference.extract(TEXTS, strategy=strategy, decoder="greedy")])
        unverified = engine.extract(TEXTS, strategy=strategy, decoder=get_decoder("lud", threshold=0.5))  # the paper's acceptance
        assert len(unverified) == len(TEXTS) and all(r.stats.forward_passes > 0 for r in unverified)
        assert all(r.text[e.start:e.end] == e.text for r in unverified for e in r.entities)
        verified = engine.extract(TEXTS, strategy=strategy, decoder="lud")
        assert_same_entities([r.entities for r in verified], [r.entities for r in got])


def test_snapshots_load_and_leave_the_run_as_it_would_have_been(tmp_path, data_dir) -> None:
    """A snapshot at every step (checkpoint clock 0) is a loadable model, and saving it leaves
    the weights in training untouched: the final adapter equals a run that took none."""
    from safetensors.torch import load_file

    finals = {}
    for minutes in (0.0, 10.0):
        output = tmp_path / f"lud-{minutes}"
        train_lud(LUDConfig(model="tiny-conll03", train=str(data_dir / "conll2003" / "train.txt"), output=str(output), name="tiny-lud",
                            placeholder="<eos>", limit=12, max_steps=3, top_layers=1, checkpoint_minutes=minutes))
        finals[minutes] = load_file(output / "adapter_model.safetensors")
    snapshots = sorted((tmp_path / "lud-0.0" / "snapshots").iterdir())
    assert [s.name for s in snapshots] == ["minute-0"] and not (tmp_path / "lud-10.0" / "snapshots").exists()
    last = load_file(snapshots[0] / "adapter_model.safetensors")
    assert finals[0.0].keys() == finals[10.0].keys() == last.keys()
    assert all(torch.equal(finals[0.0][k], finals[10.0][k]) and torch.equal(last[k], finals[0.0][k]) for k in last)
    (answer,) = NEREngine.load(snapshots[0]).extract(TEXTS[:1], strategy="ar", decoder="lud")
    assert answer.stats.forward_passes > 0 and all(TEXTS[0][e.start:e.end] == e.text for e in answer.entities)


def test_the_shipped_lud_model_answers_as_its_base_in_fewer_forwards() -> None:
    """en-conll03-lud's units are verified and its placeholder adapter never touches a greedy
    token, so its AR answers are its own greedy ones, found in fewer forwards; with the paper's
    unverified acceptance they are not guaranteed to be. It is stored over the public base."""
    lud = NEREngine.load("en-conll03-lud")
    assert lud.ner_model.config.base == "smollm2-135m-instruct"
    base = lud
    texts = TEXTS + ["Germany 's representative to the European Union 's veterinary committee Werner Zwingmann said on Wednesday ."]
    got = lud.extract(texts, strategy="ar", decoder="lud")
    reference = base.extract(texts, strategy="ar", decoder="greedy")

    def spans(results):
        return [[(e.start, e.end, e.label) for e in r.entities] for r in results]

    assert spans(got) == spans(reference) and any(spans(got))
    # the same tokens; their probabilities come from wider forwards, equal up to float rounding
    assert [e.score for r in got for e in r.entities] == pytest.approx([e.score for r in reference for e in r.entities], rel=1e-5)
    assert got[0].stats.forward_passes < reference[0].stats.forward_passes
