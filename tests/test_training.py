"""Training rows, the packed-prefix loss, and training with checkpoints and resume (tiny model)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ner_service.engine import prompts
from corpora import Example, Span, labels_of, read_corpus
from training.examples import IGNORE, build_row, query_answers
from training.loss import answer_loss
from training.trainer import TrainConfig, prepare_model, train

EXAMPLE = Example("Peter met Anna in Paris", [Span(0, 5, "PER"), Span(10, 14, "PER"), Span(18, 23, "LOC")])


def test_query_answers_follow_the_protocol() -> None:
    pairs = [(qa.query, qa.answer) for qa in query_answers(EXAMPLE, ["LOC", "PER"], ["padellm", "ar"])]
    assert pairs == [
        (prompts.count_query("LOC"), "1"),
        (prompts.mention_query("LOC", 1, 1), " Paris"),
        (prompts.count_query("PER"), "2"),
        (prompts.mention_query("PER", 2, 1), " Peter"),
        (prompts.mention_query("PER", 2, 2), " Anna"),
        (prompts.ar_query(), "\nPER: Peter\nPER: Anna\nLOC: Paris"),
    ]


def test_targets_are_exactly_the_answers(tiny_engine) -> None:
    tokenizer = tiny_engine.ner_model.tokenizer
    row = build_row(EXAMPLE, ["LOC", "PER"], tokenizer, ["padellm"])
    eos = tokenizer.eos_token_id
    answers = [t for t in row.targets if t != IGNORE]
    expected = []
    for answer in [qa.answer for qa in query_answers(EXAMPLE, ["LOC", "PER"], ["padellm"])]:
        expected += tokenizer(answer, add_special_tokens=False).input_ids + [eos]
    assert answers == expected
    prefix_len = len(tokenizer(prompts.prefix(EXAMPLE.text)).input_ids)
    assert all(t == IGNORE for t in row.targets[: prefix_len])
    assert row.parents[prefix_len] == prefix_len - 1  # the first branch continues the prefix
    laid_apart = prefix_len + sum(len(tokenizer(qa.query + qa.answer, add_special_tokens=False).input_ids) + 1
                                  for qa in query_answers(EXAMPLE, ["LOC", "PER"], ["padellm"]))
    assert len(row) < laid_apart  # PER's mention queries share its count query's tokens

def test_past_count_queries_answer_a_count_one_short_and_nothing_past_the_count(tiny_engine) -> None:
    tokenizer = tiny_engine.ner_model.tokenizer
    pairs = [(qa.query, qa.answer) for qa in query_answers(EXAMPLE, ["LOC", "MISC", "PER"], ["padellm"], past_count=True)]
    assert pairs == [
        (prompts.count_query("LOC"), "1"),
        (prompts.mention_query("LOC", 1, 1), " Paris"),
        (prompts.mention_query("LOC", 0, 1), " Paris"),
        (prompts.mention_query("LOC", 1, 2), ""),
        (prompts.count_query("MISC"), "0"),
        (prompts.mention_query("MISC", 0, 1), ""),
        (prompts.count_query("PER"), "2"),
        (prompts.mention_query("PER", 2, 1), " Peter"),
        (prompts.mention_query("PER", 2, 2), " Anna"),
        (prompts.mention_query("PER", 1, 2), " Anna"),
        (prompts.mention_query("PER", 2, 3), ""),
    ]
    row = build_row(EXAMPLE, ["MISC"], tokenizer, ["padellm"], past_count=True)
    prefix = tokenizer(prompts.prefix(EXAMPLE.text)).input_ids
    count_query = tokenizer(prompts.count_query("MISC"), add_special_tokens=False).input_ids
    past_query = tokenizer(prompts.mention_query("MISC", 0, 1), add_special_tokens=False).input_ids
    assert [t for t in row.targets if t != IGNORE] == tokenizer("0", add_special_tokens=False).input_ids + [tokenizer.eos_token_id] * 2
    shared = len(count_query)
    assert past_query[:shared] == count_query  # the past-count query continues the count query's branch
    # the past-count branch: its query's last token predicts the end token, and its tokens
    # followed back through their parents are the query's after the count query's
    end = next(i for i in range(len(prefix), len(row)) if row.targets[i] == tokenizer.eos_token_id and row.input_ids[i] == past_query[-1])
    branch = [end]
    while len(branch) < len(past_query) - shared:
        branch.insert(0, row.parents[branch[0]])
    assert [row.input_ids[i] for i in branch] == past_query[shared:]
    assert row.input_ids[row.parents[branch[0]]] == count_query[-1]


def test_packed_loss_equals_the_loss_of_separate_sequences(tiny_engine) -> None:
    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    row = build_row(EXAMPLE, ["PER"], tokenizer, ["padellm"])
    with torch.inference_mode():
        packed = answer_loss(model, [row], tokenizer.eos_token_id)
        prefix = tokenizer(prompts.prefix(EXAMPLE.text)).input_ids
        losses, count = 0.0, 0
        for qa in query_answers(EXAMPLE, ["PER"], ["padellm"]):
            query, answer = qa.query, qa.answer
            q = tokenizer(query, add_special_tokens=False).input_ids
            a = tokenizer(answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            ids = torch.tensor([prefix + q + a])
            logits = model(input_ids=ids).logits[0, len(prefix) + len(q) - 1 : -1]
            losses += torch.nn.functional.cross_entropy(logits, torch.tensor(a), reduction="sum").item()
            count += len(a)
    assert packed.item() == pytest.approx(losses / count, rel=1e-4)


def _jsonl(path: Path, n: int) -> Path:
    lines = [{"text": f"Peter met Anna in Paris {i}", "entities": [{"start": 0, "end": 5, "label": "PER"}, {"start": 18, "end": 23, "label": "LOC"}]} for i in range(n)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


def _loss_on(model: str | Path, data: Path) -> float:
    """The answer loss of ``model`` (a model folder) on the training rows of ``data``."""
    from ner_service.engine import NEREngine

    ner_model = NEREngine.load(model).ner_model
    examples = read_corpus(data)
    rows = [build_row(example, labels_of(examples), ner_model.tokenizer) for example in examples]
    with torch.inference_mode():
        return answer_loss(ner_model.model, rows, ner_model.tokenizer.eos_token_id).item()


def test_training_lowers_the_loss_checkpoints_and_resumes(tmp_path: Path, tiny_engine) -> None:
    data = _jsonl(tmp_path / "train.jsonl", 8)
    base = str(tiny_engine.ner_model.path)
    config = TrainConfig(base=base, train=str(data), dev=str(data), output=str(tmp_path / "out"), full=True, lr=3e-3,
                         warmup_steps=1, max_steps=6, batch_tokens=512, eval_limit=2, eval_batch_size=2)
    first = train(config)
    assert first["steps"] == 6 and (tmp_path / "out" / "ner_model.json").is_file()
    assert _loss_on(tmp_path / "out", data) < 0.7 * _loss_on(base, data)
    checkpoint = torch.load(tmp_path / "out" / "checkpoint" / "checkpoint.pt", weights_only=False)
    assert checkpoint["state"]["step"] == 6
    config.max_steps, config.resume = 9, True
    resumed = train(config)
    assert resumed["steps"] == 9
    assert resumed["history"][-1]["step"] == 9 and "padellm" in resumed["history"][-1]


def test_lora_training_saves_a_small_adapter(tmp_path: Path, tiny_engine) -> None:
    data = _jsonl(tmp_path / "train.jsonl", 4)
    config = TrainConfig(base=str(tiny_engine.ner_model.path), train=str(data), output=str(tmp_path / "lora"), lora_r=4, max_steps=2, batch_tokens=512)
    train(config)
    saved = json.loads((tmp_path / "lora" / "ner_model.json").read_text())
    assert saved["base"] == str(tiny_engine.ner_model.path)
    assert (tmp_path / "lora" / "adapter_model.safetensors").stat().st_size < 1_000_000
    from ner_service.engine import NEREngine

    engine = NEREngine.load(tmp_path / "lora")
    assert engine.labels == ["LOC", "PER"]
    assert engine.extract(["Peter met Anna"])[0].stats.forward_passes > 0


def test_a_run_can_continue_a_trained_adapter_and_refuses_one_that_does_not_fit(tmp_path: Path, tiny_engine) -> None:
    data = _jsonl(tmp_path / "train.jsonl", 4)
    base = str(tiny_engine.ner_model.path)
    first = TrainConfig(base=base, train=str(data), output=str(tmp_path / "first"), lora_r=4, top_layers=1, max_steps=2, batch_tokens=512)
    train(first)
    saved = load_file(tmp_path / "first" / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in saved.items()), "the first run learnt nothing"

    continued = replace(first, output=str(tmp_path / "second"), init_adapter=str(tmp_path / "first"))
    model, _, _ = prepare_model(continued)
    loaded = {k.replace(".default", ""): p.detach() for k, p in model.named_parameters() if p.requires_grad}
    assert loaded.keys() == saved.keys()
    assert all(torch.equal(loaded[k], saved[k].float()) for k in saved), "the run does not start from the adapter"

    train(continued)
    further = load_file(tmp_path / "second" / "adapter_model.safetensors")
    assert further.keys() == saved.keys() and any(not torch.equal(further[k], saved[k]) for k in saved)
    with pytest.raises(ValueError, match="LoRA rank 4 where the run has 8"):
        prepare_model(replace(continued, lora_r=8))
    top = tiny_engine.ner_model.model.config.num_hidden_layers - 1
    with pytest.raises(ValueError, match=rf"layers \[{top}\] where the run has None"):
        prepare_model(replace(continued, top_layers=None))


def test_loss_weights_weigh_each_query_kind(tiny_engine) -> None:
    """Weights 1 give the plain mean; weight 0 on the AR answer gives the loss of a row without it."""

    model, tokenizer = tiny_engine.ner_model.model, tiny_engine.ner_model.tokenizer
    kinds = [qa.kind for qa in query_answers(EXAMPLE, ["LOC", "PER"], ["padellm", "ar"])]
    assert kinds == ["count", "mention", "count", "mention", "mention", "ar"]
    plain = build_row(EXAMPLE, ["LOC", "PER"], tokenizer, ["padellm", "ar"])
    ones = build_row(EXAMPLE, ["LOC", "PER"], tokenizer, ["padellm", "ar"], loss_weights={"count": 1.0})
    no_ar = build_row(EXAMPLE, ["LOC", "PER"], tokenizer, ["padellm", "ar"], loss_weights={"ar": 0.0})
    padellm_only = build_row(EXAMPLE, ["LOC", "PER"], tokenizer, ["padellm"])
    counts_twice = build_row(EXAMPLE, ["LOC", "PER"], tokenizer, ["padellm"], loss_weights={"count": 2.0})
    assert plain.weights is None and sorted(set(counts_twice.weights)) == [0.0, 1.0, 2.0]
    with torch.inference_mode():
        loss = {name: answer_loss(model, [row], tokenizer.eos_token_id).item()
                for name, row in {"plain": plain, "ones": ones, "no_ar": no_ar, "padellm_only": padellm_only, "counts_twice": counts_twice}.items()}
    assert loss["ones"] == pytest.approx(loss["plain"], rel=1e-5)
    assert loss["no_ar"] == pytest.approx(loss["padellm_only"], rel=1e-4)
    assert loss["counts_twice"] != pytest.approx(loss["padellm_only"], rel=1e-4)


def test_texts_with_long_lists_are_seen_more_often() -> None:
    from training.trainer import oversample_hard_counts

    many = Example("A B C D", [Span(0, 1, "PER"), Span(2, 3, "PER"), Span(4, 5, "PER"), Span(6, 7, "LOC")])
    assert oversample_hard_counts([EXAMPLE, many], ["LOC", "PER"], minimum=3, repeat=3) == [EXAMPLE, many, many, many]
    assert oversample_hard_counts([EXAMPLE, many], ["LOC", "PER"], minimum=3, repeat=1) == [EXAMPLE, many]
    assert oversample_hard_counts([EXAMPLE, many], ["LOC"], minimum=3, repeat=3) == [EXAMPLE, many]


def test_document_windows_are_trained_on_and_the_window_budget_is_the_models(tmp_path: Path, tiny_engine) -> None:
    from tests.test_documents import CONLL_DOCUMENTS

    data = tmp_path / "train.txt"
    data.write_text(CONLL_DOCUMENTS, encoding="utf-8")
    base = TrainConfig(base=str(tiny_engine.ner_model.path), train=str(data), output=str(tmp_path / "sentences"), lora_r=4,
                       batch_tokens=512, window_tokens=6)
    sentences = train(base)
    windows = train(replace(base, output=str(tmp_path / "windows"), document_windows=10))
    assert windows["tokens"] > sentences["tokens"]  # the headline that runs into the byline is a text of its own
    saved = json.loads((tmp_path / "windows" / "ner_model.json").read_text())
    assert saved["window_tokens"] == 6 and saved["sentence_windows"]  # the sentences decide how the model reads


def test_a_model_trained_further_keeps_its_decoding_choices_unless_the_run_sets_them(tmp_path: Path, tiny_engine) -> None:
    base = tmp_path / "tiny"
    shutil.copytree(tiny_engine.ner_model.path, base)
    chosen = json.loads((base / "ner_model.json").read_text()) | {"count_bias": {"PER": 0.75}, "repair_unaligned": False,
                                                                          "document_consistency": True, "shorter_span_margin": 0.2}
    (base / "ner_model.json").write_text(json.dumps(chosen))
    data = _jsonl(tmp_path / "train.jsonl", 4)
    run = TrainConfig(base=str(base), train=str(data), output=str(tmp_path / "same"), full=True, max_steps=1, batch_tokens=512,
                      labels=chosen["labels"])
    train(run)
    kept = json.loads((tmp_path / "same" / "ner_model.json").read_text())
    assert (kept["count_bias"], kept["repair_unaligned"], kept["document_consistency"], kept["shorter_span_margin"]) == ({"PER": 0.75}, False, True, 0.2)
    train(replace(run, output=str(tmp_path / "other"), labels=["LOC", "PER"]))
    fresh = json.loads((tmp_path / "other" / "ner_model.json").read_text())
    assert (fresh["count_bias"], fresh["repair_unaligned"], fresh["document_consistency"], fresh["shorter_span_margin"]) == (0.0, True, False, None)
    train(replace(run, output=str(tmp_path / "own"), labels=["LOC", "PER"], document_consistency=True))  # the run's own choice wins
    assert json.loads((tmp_path / "own" / "ner_model.json").read_text())["document_consistency"] is True
    train(replace(run, output=str(tmp_path / "off"), document_consistency=False))
    assert json.loads((tmp_path / "off" / "ner_model.json").read_text())["document_consistency"] is False


def test_a_run_can_choose_its_count_bias_on_dev_as_calibrate_counts_would(tmp_path: Path, tiny_engine) -> None:
    from ner_service.engine import NEREngine
    from ner_service.engine.count_bias import CountBias
    from training.count_calibration import calibrate_on_halves

    base = tmp_path / "tiny"
    shutil.copytree(tiny_engine.ner_model.path, base)
    inherited = {"PER": 0.75}
    chosen = json.loads((base / "ner_model.json").read_text()) | {"count_bias": inherited}
    (base / "ner_model.json").write_text(json.dumps(chosen))
    data = _jsonl(tmp_path / "train.jsonl", 6)
    run = TrainConfig(base=str(base), train=str(data), dev=str(data), output=str(tmp_path / "calibrated"), full=True, max_steps=1,
                      batch_tokens=512, eval_limit=2, eval_batch_size=4, labels=chosen["labels"], calibrate_counts=True)
    summary = train(run)
    written = CountBias.of(json.loads((tmp_path / "calibrated" / "ner_model.json").read_text())["count_bias"])
    trained = NEREngine.load(tmp_path / "calibrated", count_bias=inherited)
    expected = calibrate_on_halves(trained, data, 4, progress=False)
    assert written.setting(trained.labels) == expected.setting()
    assert summary["count_calibration"] == expected.table() and "| PER | 3 | " in summary["count_calibration"]
    assert "Report half: micro-F1" in summary["count_calibration"]
    assert "## Count bias chosen on dev" in (tmp_path / "calibrated" / "README.md").read_text()
    with pytest.raises(ValueError, match="calibrate_counts .* needs dev"):
        train(replace(run, dev=None, output=str(tmp_path / "no-dev")))
