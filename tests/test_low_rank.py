"""A fully fine-tuned model stored as a LoRA adapter over its base (training/low_rank.py), on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from corpora import read_corpus
from ner_service.engine import NEREngine
from ner_service.engine.ner_model import load_base
from training.configs import LowRankConfig
from training.evaluate import dev_scores
from training.low_rank import LayerChange, changed_norms, choose_ranks, store_low_rank, thin_svd
from training.trainer import AdapterShape, TrainConfig, train
from tests.entity_lists import assert_same_entities

TEXTS = ["Peter met Anna in Paris", "Anna flew from Berlin to Rome with Peter", "Nothing here"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, tiny_engine) -> Path:
    """The tiny model with its top layer and final norm fully fine-tuned for a few steps, its loss over a kept vocabulary."""
    folder = tmp_path_factory.mktemp("tuned")
    lines = [{"text": f"Peter met Anna in Paris {i}", "entities": [{"start": 0, "end": 5, "label": "PER"}, {"start": 18, "end": 23, "label": "LOC"}]}
             for i in range(8)]
    (folder / "train.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    train(TrainConfig(base=str(tiny_engine.ner_model.path), train=str(folder / "train.jsonl"), output=str(folder / "model"), full=True,
                      top_layers=1, lr=3e-3, warmup_steps=1, max_steps=4, batch_tokens=512, eval_limit=None, kept_vocabulary=True))
    return folder


def _logits(engine: NEREngine, text: str) -> torch.Tensor:
    ids = engine.ner_model.tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return engine.ner_model.model(input_ids=ids).logits[0]


def test_a_budget_that_holds_the_whole_change_gives_the_tuned_model_back(tuned: Path, tiny_engine) -> None:
    config = LowRankConfig(model=str(tuned / "model"), base=str(tiny_engine.ner_model.path), output=str(tuned / "adapter"),
                           name="tiny-low-rank", max_megabytes=1.0, dev=str(tuned / "train.jsonl"), eval_limit=2)
    summary = store_low_rank(config)
    assert summary["kept_share"] > 0.999999
    top = f"model.layers.{tiny_engine.ner_model.model.config.num_hidden_layers - 1}"
    assert set(summary["norms"]) == {"model.norm", f"{top}.input_layernorm", f"{top}.post_attention_layernorm"}
    assert all(name.startswith(f"{top}.") for name in summary["ranks"]), "only the trained layer changed"
    saved = json.loads((tuned / "adapter" / "ner_model.json").read_text())
    assert saved["base"] == config.base and saved["name"] == "tiny-low-rank"
    assert set(summary["dev"]) == {"padellm", "ar"} and "micro-F1" in (tuned / "adapter" / "README.md").read_text()
    assert summary["tuned"]["steps"] == 4 and summary["tuned"]["config"]["full"]
    assert (tuned / "adapter" / "kept_vocabulary.json").read_bytes() == (tuned / "model" / "kept_vocabulary.json").read_bytes()

    full, stored, base = NEREngine.load(tuned / "model"), NEREngine.load(tuned / "adapter"), NEREngine.load(config.base)
    for text in TEXTS:
        assert torch.allclose(_logits(stored, text), _logits(full, text), atol=2e-2)  # fp16 factors
        assert not torch.allclose(_logits(base, text), _logits(full, text), atol=2e-2), "the tuning changed nothing"
    assert_same_entities([e.entities for e in stored.extract(TEXTS)], [e.entities for e in full.extract(TEXTS)], at_least=2,
                         score_rel=1e-3)  # fp16 factors


def test_a_small_budget_keeps_the_largest_part_of_the_change_within_it(tuned: Path, tiny_engine) -> None:
    config = LowRankConfig(model=str(tuned / "model"), base=str(tiny_engine.ner_model.path), output=str(tuned / "small"), max_megabytes=0.03)
    summary = store_low_rank(config)
    assert (tuned / "small" / "adapter_model.safetensors").stat().st_size <= 30_000
    assert 0.2 < summary["kept_share"] < 0.99
    assert summary["dev"] is None
    answers = NEREngine.load(tuned / "small").extract(TEXTS)  # a model that loads and answers, if worse
    assert len(answers) == len(TEXTS) and all(a.stats.forward_passes > 0 for a in answers)


def test_the_stored_adapter_gets_the_count_biases_its_own_calibration_chooses(tuned: Path, tiny_engine) -> None:
    from training.count_calibration import calibrate_on_halves

    config = LowRankConfig(model=str(tuned / "model"), base=str(tiny_engine.ner_model.path), output=str(tuned / "calibrated"),
                           max_megabytes=0.03, dev=str(tuned / "train.jsonl"), eval_limit=2, calibrate_counts=True)
    summary = store_low_rank(config)
    saved = json.loads((tuned / "calibrated" / "ner_model.json").read_text())
    tuned_bias = json.loads((tuned / "model" / "ner_model.json").read_text())["count_bias"]  # where the calibration starts
    stored = NEREngine.load(tuned / "calibrated", count_bias=tuned_bias)
    again = calibrate_on_halves(stored, config.dev, config.eval_batch_size)
    assert saved["count_bias"] == again.setting()
    assert summary["count_calibration"] == again.table() and again.table() in (tuned / "calibrated" / "README.md").read_text()
    # the dev scores it records are those of the folder as written, its chosen biases included
    written = NEREngine.load(tuned / "calibrated")
    assert summary["dev"] == dev_scores(written, read_corpus(config.dev)[:config.eval_limit], ("padellm", "ar"))


def test_a_stored_adapter_trains_further_with_each_layer_keeping_its_rank(tuned: Path, tiny_engine) -> None:
    """A recipe's stage after ``low_rank``: the stored adapter, trained as a LoRA, relearns within
    its budget what the truncation lost; the run's own LoRA rank does not apply to it."""
    base = str(tiny_engine.ner_model.path)
    store_low_rank(LowRankConfig(model=str(tuned / "model"), base=base, output=str(tuned / "stored"), max_megabytes=0.03))
    further = TrainConfig(base=base, train=str(tuned / "train.jsonl"), output=str(tuned / "further"), init_adapter=str(tuned / "stored"),
                          lora_r=8, top_layers=1, lr=3e-3, warmup_steps=1, max_steps=2, batch_tokens=512, eval_limit=None, kept_vocabulary=True)
    train(further)

    stored, trained = (load_file(tuned / name / "adapter_model.safetensors") for name in ("stored", "further"))
    assert trained.keys() == stored.keys() and all(trained[k].shape == stored[k].shape for k in stored), "a layer's rank changed"
    assert any(not torch.equal(trained[k], stored[k]) for k in stored if "lora_" in k), "the factors did not train"
    ranks = [json.loads((tuned / name / "adapter_config.json").read_text())["rank_pattern"] for name in ("stored", "further")]
    assert ranks[0] and ranks[0] == ranks[1]
    assert f"the LoRA adapter of `{tuned / 'stored'}` trained further" in (tuned / "further" / "README.md").read_text()
    answers = NEREngine.load(tuned / "further").extract(TEXTS)
    assert len(answers) == len(TEXTS) and all(a.stats.forward_passes > 0 for a in answers)

    shape = AdapterShape.of_adapter(tuned / "stored")
    top = tiny_engine.ner_model.model.config.num_hidden_layers - 1
    assert (shape.rank, shape.layers) == (None, [top])
    assert shape.mismatches(AdapterShape(base, 8, 16, [top])) == []
    assert shape.mismatches(AdapterShape(base, 8, 16, [0])) == [f"layers [{top}] where the run trains only [0]"]
    assert shape.mismatches(AdapterShape("gemma3-270m", 8, 16, None)) == [f"base {base} where the run has gemma3-270m"]


def test_ranks_go_where_a_stored_weight_keeps_the_most() -> None:
    def change(name: str, values: list[float], rows: int, columns: int) -> LayerChange:
        k = len(values)
        return LayerChange(name, torch.tensor(values), torch.zeros(rows, k), torch.zeros(k, columns))

    cheap = change("cheap", [3.0, 2.0, 1.0], 10, 10)  # 20 weights a rank: 0.45, 0.2, 0.05 per weight
    costly = change("costly", [4.0, 3.0], 40, 40)  # 80 weights a rank: 0.2, 0.1125 per weight
    assert choose_ranks([cheap, costly], budget_weights=20) == {"cheap": 1}
    assert choose_ranks([cheap, costly], budget_weights=120) == {"cheap": 2, "costly": 1}
    assert choose_ranks([cheap, costly], budget_weights=120, norm_weights=30) == {"cheap": 3}
    assert choose_ranks([cheap, costly], budget_weights=10) == {}


@pytest.mark.parametrize("shape", [(48, 160), (160, 48)], ids=["wide", "tall"])
def test_the_gram_svd_gives_the_singular_values_and_truncations_of_torchs(shape: tuple[int, int]) -> None:
    """A change of rank 6 plus small noise, and a matrix of rank 3 (zero singular values): the
    same singular values, the same best approximation at each kept rank, and orthonormal factors."""
    generator = torch.Generator().manual_seed(0)
    rows, columns = shape
    low = torch.randn(rows, 6, generator=generator, dtype=torch.float64) @ torch.randn(6, columns, generator=generator, dtype=torch.float64)
    for matrix in (low + 1e-4 * torch.randn(rows, columns, generator=generator, dtype=torch.float64), low[:, :3] @ low[:3, :] if rows <= columns
                   else low[:, :3] @ torch.randn(3, columns, generator=generator, dtype=torch.float64)):
        u, s, vt = thin_svd(matrix)
        expected = torch.linalg.svdvals(matrix)
        assert s.shape == expected.shape and torch.allclose(s, expected, rtol=1e-9, atol=1e-7 * float(expected[0]))
        assert torch.all(s[:-1] >= s[1:])
        best = torch.linalg.svd(matrix, full_matrices=False)
        for rank in (1, 3, 6):
            truncated = (best.U[:, :rank] * best.S[:rank]) @ best.Vh[:rank]
            assert torch.allclose((u[:, :rank] * s[:rank]) @ vt[:rank], truncated, atol=1e-9 * float(expected[0]))
        exact = u.T if rows <= columns else vt  # the vectors of the smaller side, from the Gram matrix
        assert torch.allclose(exact @ exact.T, torch.eye(min(shape), dtype=torch.float64), atol=1e-8)
        clear = int((s > 1e-2 * s[0]).sum())  # the other side loses orthogonality as (largest / value) squared
        assert torch.allclose(u[:, :clear].T @ u[:, :clear], torch.eye(clear, dtype=torch.float64), atol=1e-8)
        assert torch.allclose(vt[:clear] @ vt[:clear].T, torch.eye(clear, dtype=torch.float64), atol=1e-8)
        for rank in range(1, int((s > 0).sum()) + 1):  # any rank: the matrix projected on the smaller side's first vectors
            first = exact[:rank]
            projected = first.T @ (first @ matrix) if rows <= columns else (matrix @ first.T) @ first
            assert torch.allclose((u[:, :rank] * s[:rank]) @ vt[:rank], projected, atol=1e-9 * float(expected[0]))
        assert torch.allclose((u * s) @ vt, matrix, atol=1e-9 * float(expected[0]))


def test_a_changed_embedding_cannot_be_an_adapter(tiny_engine) -> None:
    base, _ = load_base(str(tiny_engine.ner_model.path))
    tuned, _ = load_base(str(tiny_engine.ner_model.path))
    with torch.no_grad():
        tuned.get_input_embeddings().weight[3] += 1.0
    with pytest.raises(ValueError, match="embed_tokens.weight changed .* only linear layers and norms"):
        changed_norms(tuned, base)


def test_a_run_can_start_from_the_sum_of_models_changes_over_their_public_base(tuned: Path, tiny_engine) -> None:
    """``merged_with`` adds each model's change from the public base (task arithmetic): a stored
    adapter merged with itself starts the run from the base plus twice its change."""
    from training.model_merge import MergeError, add_model_changes
    from training.trainer import prepare_model

    base = str(tiny_engine.ner_model.path)
    adapter = tuned / "merge-adapter"
    store_low_rank(LowRankConfig(model=str(tuned / "model"), base=base, output=str(adapter), name="tiny-merge", max_megabytes=1.0))
    model, _, _ = prepare_model(TrainConfig(base=str(adapter), merged_with=[str(adapter)], train="-", output=str(tuned / "unused"),
                                            full=True, top_layers=1))
    once, _ = load_base(str(adapter))
    public = dict(load_base(base)[0].named_parameters())
    changed = 0
    for name, weight in model.named_parameters():
        change = dict(once.named_parameters())[name] - public[name]
        assert torch.allclose(weight, public[name] + 2 * change, atol=1e-6), name
        changed += bool(change.abs().max() > 0)
    assert changed > 0
    with pytest.raises(MergeError, match="self-contained"):
        add_model_changes(once, base, [str(adapter)])
