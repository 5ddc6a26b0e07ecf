"""The Python face (``padellm_ner.load``, ``predict_entities``), on the tiny test model's real answers."""

from __future__ import annotations

import subprocess
import sys

import pytest

import padellm_ner
from ner_service.engine import InvalidOptionsError

TEXTS = ["Peter Blackburn visited Paris .", "EU rejects German call to boycott British lamb .", "Japan beat Syria in Beijing ."]


@pytest.fixture(scope="module")
def ner():
    return padellm_ner.load("tiny-conll03")


def test_import_loads_no_torch() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys, padellm_ner; padellm_ner.load; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_predict_entities_returns_the_engines_entities_as_gliner_dicts(ner, tiny_engine) -> None:
    expected = tiny_engine.extract(TEXTS)
    assert sum(len(r.entities) for r in expected) > 0  # the comparison below compares entities
    for text, result in zip(TEXTS, expected):  # one text alone: its scores may differ from a batch's in the last digits
        got = ner.predict_entities(text, threshold=0)
        assert [{k: v for k, v in e.items() if k != "score"} for e in got] == [
            {"start": e.start, "end": e.end, "text": e.text, "label": e.label} for e in result.entities]
        assert [e["score"] for e in got] == pytest.approx([e.score for e in result.entities], rel=1e-4)
        assert all(text[e["start"]:e["end"]] == e["text"] and 0 < e["score"] <= 1 for e in got)


def test_threshold_drops_exactly_the_entities_scored_below_it(ner) -> None:
    everything = ner.batch_predict_entities(TEXTS, threshold=0)
    scores = sorted(e["score"] for entities in everything for e in entities)
    assert len(set(scores)) >= 2, scores  # a threshold between two scores keeps some and drops some
    cut = (scores[0] + scores[-1]) / 2
    kept = ner.batch_predict_entities(TEXTS, threshold=cut)
    assert kept == [[e for e in entities if e["score"] >= cut] for entities in everything]
    assert 0 < sum(map(len, kept)) < len(scores)
    assert ner.batch_predict_entities(TEXTS) == everything  # by default every entity, as in the API, the CLI and spaCy


def test_batch_is_predict_of_each_text_and_labels_are_checked(ner) -> None:
    batch = ner.batch_predict_entities(TEXTS, labels=["PER", "ORG"], threshold=0)
    alone = [ner.predict_entities(text, labels=["PER", "ORG"], threshold=0) for text in TEXTS]
    assert [[(e["start"], e["end"], e["label"]) for e in entities] for entities in batch] == [
        [(e["start"], e["end"], e["label"]) for e in entities] for entities in alone]
    assert all(e["label"] in {"PER", "ORG"} for entities in ner.batch_predict_entities(TEXTS, ["PER", "ORG"], 0) for e in entities)
    with pytest.raises(InvalidOptionsError, match="DISEASE"):
        ner.predict_entities(TEXTS[0], labels=["DISEASE"])
    with pytest.raises(ValueError, match="threshold"):
        ner.predict_entities(TEXTS[0], threshold=1.5)
    with pytest.raises(TypeError):
        ner.batch_predict_entities(TEXTS[0])  # a string is not a list of texts


def test_load_refuses_what_the_model_cannot_run() -> None:
    with pytest.raises(InvalidOptionsError, match="fast_dllm|diffusion"):
        padellm_ner.load("tiny-conll03", strategy="fast_dllm")


def test_load_takes_the_dtype_the_other_entry_points_take(monkeypatch) -> None:
    import torch

    from ner_service.engine.cpu import cpu_has_bfloat16

    monkeypatch.delenv("NER_DTYPE", raising=False)  # the entry points' default: auto
    auto = torch.bfloat16 if cpu_has_bfloat16() else torch.float32
    assert next(padellm_ner.load("tiny-conll03").engine.ner_model.model.parameters()).dtype == auto
    monkeypatch.setenv("NER_DTYPE", "bfloat16")
    assert next(padellm_ner.load("tiny-conll03").engine.ner_model.model.parameters()).dtype == torch.bfloat16
    assert next(padellm_ner.load("tiny-conll03", dtype="float32").engine.ner_model.model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="float16"):
        padellm_ner.load("tiny-conll03", dtype="float16")
