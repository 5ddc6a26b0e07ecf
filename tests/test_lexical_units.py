"""Lexical-unit decoding and its fine-tuning recipe: units found from confidences, placeholder
branches in the training tree, the cached batched decoder equal to a step-by-step reference."""

from __future__ import annotations

import pytest
import torch

from general_decoding import StopCriteria, get_decoder
from general_decoding.lexical_units import accepted_unit
from general_decoding.tree_attention import pack_branches
from ner_service.engine import NEREngine, prompts
from training.examples import IGNORE, TrainingRow
from training.lexical_units import LUDConfig, find_units, lud_row, train_lud

TEXTS = [
    "EU rejects German call to boycott British lamb .",
    "Peter Blackburn met Angela Merkel in Paris and Berlin on Friday .",
    "Leicester : Leicestershire beat Somerset by an innings and 39 runs .",
]


def test_units_start_anywhere_and_grow_while_confident() -> None:
    confidences = [0.1, 0.95, 0.99, 0.2, 0.3, 0.97, 0.91, 0.92, 0.99, 0.5]
    assert find_units(confidences, unit_size=4, threshold=0.9) == [(0, 3), (4, 4)]
    assert find_units(confidences, unit_size=2, threshold=0.9) == [(0, 2), (4, 2), (6, 2)]
    assert find_units([0.1, 0.2], unit_size=4, threshold=0.9) == []


def test_placeholder_branches_follow_the_token_before_each_unit() -> None:
    tree = pack_branches([1, 2], [[3, 4, 5, 6]])  # query token 3, answer 4 5 6
    targets = [IGNORE, IGNORE, 4, 5, 6, IGNORE]  # column 2 (token 3) predicts 4, ...
    row = lud_row(TrainingRow(tree, targets), [0, 0, 0.2, 0.95, 0.96, 0], placeholder_id=99, unit_size=4, threshold=0.9)
    assert row.units == 1
    assert row.input_ids == [1, 2, 3, 4, 5, 6, 99, 99]
    assert row.parents == [-1, 0, 1, 2, 3, 4, 2, 6]  # placeholders hang off the unit's anchor
    assert row.targets[6:] == [5, 6]


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


def test_threshold_above_one_is_greedy_decoding(tiny_engine) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    stop = StopCriteria(25, frozenset({tokenizer.eos_token_id}))
    ids = torch.tensor([tokenizer(prompts.prefix(TEXTS[1]) + prompts.ar_query()).input_ids])
    lud = get_decoder("lud", threshold=1.01, placeholder_id=5).generate(model, ids, stop)
    assert lud.tokens == get_decoder("greedy").generate(model, ids, stop).tokens


def test_a_model_not_trained_for_units_is_a_clear_error(tiny_engine) -> None:
    with pytest.raises(ValueError, match="train-lud"):
        tiny_engine.extract(TEXTS[:1], strategy="ar", decoder="lud")


def test_train_lud_saves_a_stacked_model_that_decodes(tmp_path, data_dir) -> None:
    output = tmp_path / "lud"
    summary = train_lud(LUDConfig(model="tiny-conll03", train=str(data_dir / "conll2003" / "train.txt"), output=str(output),
                                  name="tiny-lud", placeholder="<eos>", threshold=0.2, limit=12, max_steps=2))
    assert summary["units"] > 0 and summary["steps"] == 2
    engine = NEREngine.load(output)
    assert engine.name == "tiny-lud" and engine.ner_model.model.config.lud_placeholder_id == engine.ner_model.eos_token_id
    for strategy in ("padellm", "ar"):
        engine.extract(TEXTS, strategy=strategy, decoder="lud")  # runs end to end through the engine
