"""A user's own labels end to end: a made-up JSONL corpus with two new labels (DRUG, DOSE), trained
with the real ``padellm-ner train`` on the tiny model, then served by the real ``padellm-ner serve``
and used from spaCy.

The tiny model trained for a few seconds on new labels predicts few of them, so the tests hold to what is
certain: the model knows exactly the two new labels, every entity it returns has one of them and
offsets that slice the text, and training lowered the loss on the corpus.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import spacy
import torch

from corpora import read_jsonl
from tests.local_services import live_server
from tests.conftest import TINY_DIR

TINY_BASE = TINY_DIR
LABELS = ["DOSE", "DRUG"]
DRUGS = ["aspirin", "ibuprofen", "metformin", "warfarin", "insulin", "morphine", "codeine", "heparin"]
DOSES = ["40 mg", "200 mg", "5 ml", "10 units", "2 tablets", "500 mg", "1 g", "20 drops"]
TEMPLATES = ["The patient took {dose} of {drug} daily .", "Give {drug} {dose} twice a day .", "{drug} was stopped after {dose} .",
             "She was prescribed {dose} {drug} at night .", "No {drug} today ."]
#: Texts to ask: two of the training sentences' shapes with other drug/dose pairs, and one unlike them.
TEXTS = ["The patient took 40 mg of aspirin daily .", "Give morphine 5 ml twice a day .", "Warfarin was stopped after 10 units .",
         "Angela Merkel visited Paris ."]
API_KEY = "own-labels-test-key"
STEPS = 30


def corpus_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` JSONL lines: a template filled with a random drug and dose, the two spans at their character offsets."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        values = {"{drug}": (rng.choice(DRUGS), "DRUG"), "{dose}": (rng.choice(DOSES), "DOSE")}
        text, entities = "", []
        for part in TEMPLATES[i % len(TEMPLATES)].replace("{", "\0{").replace("}", "}\0").split("\0"):
            if part in values:
                mention, label = values[part]
                entities.append({"start": len(text), "end": len(text) + len(mention), "label": label})
                part = mention
            text += part
        lines.append(json.dumps({"text": text, "entities": entities}))
    return lines


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the model folder written by ``padellm-ner train``, its training corpus)."""
    folder = tmp_path_factory.mktemp("own-labels")
    data = folder / "my.jsonl"
    data.write_text("\n".join(corpus_lines(40)) + "\n", encoding="utf-8")
    model = folder / "mine"
    done = subprocess.run(
        [sys.executable, "-m", "padellm_ner.cli", "train", "--train", str(data), "--output", str(model), "--base", str(TINY_BASE),
         "--full", "--max-steps", str(STEPS), "--batch-tokens", "512", "--lr", "5e-3"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout)["steps"] == STEPS
    return model, data


def _corpus_loss(model_folder: Path, tokenizer_folder: Path, data: Path) -> float:
    """The training loss (answer tokens of both formats) of ``model_folder`` on the whole corpus."""
    from ner_service.engine.ner_model import NERModel
    from training.examples import build_row
    from training.loss import answer_loss

    tokenizer = NERModel.load(tokenizer_folder).tokenizer
    rows = [build_row(example, LABELS, tokenizer) for example in read_jsonl(data)]
    model = NERModel.load(model_folder)
    with torch.no_grad():
        return answer_loss(model.model, rows, model.pad_token_id).item()


def _check_entities(text: str, entities: list[dict]) -> None:
    for entity in entities:
        assert entity["label"] in LABELS, entity
        assert 0 <= entity["start"] < entity["end"] <= len(text) and text[entity["start"]:entity["end"]] == entity["text"], entity


def test_the_trained_model_knows_exactly_the_new_labels_and_training_lowered_the_loss(trained: tuple[Path, Path]) -> None:
    model, data = trained
    assert json.loads((model / "ner_model.json").read_text())["labels"] == LABELS
    assert json.loads((model / "training.json").read_text())["steps"] == STEPS
    before, after = _corpus_loss(TINY_BASE, model, data), _corpus_loss(model, model, data)
    assert after < 0.5 * before, (before, after)


def test_padellm_ner_serve_answers_with_the_new_labels(trained: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = trained
    env = {"NER_API_KEYS": API_KEY, "NER_REQUEST_TIMEOUT_S": "120", "DATABASE_URL": f"sqlite:///{tmp_path / 'pipeline.db'}"}
    with (live_server(env, tmp_path / "serve.log", ready_timeout_s=120, serve_args=["--model", str(model)]) as url,
          httpx.Client(base_url=url, timeout=120) as http):
        assert http.get("/v1/models").status_code == 401  # the key is needed ...
        listed = http.get("/v1/models", headers={"X-API-Key": API_KEY})  # ... and accepted
        assert listed.status_code == 200, listed.text
        assert listed.json()["default"] == str(model)
        [mine] = [m for m in listed.json()["models"] if m["name"] == str(model)]
        assert mine["labels"] == LABELS and mine["adapter"] is False

        answer = http.post("/v1/entities", json={"texts": TEXTS}, headers={"Authorization": f"Bearer {API_KEY}"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["model"], body["labels"]) == (str(model), LABELS)
        for text, result in zip(TEXTS, body["results"], strict=True):
            _check_entities(text, result["entities"])
        assert any(result["entities"] for result in body["results"])  # it learned to find some

        refused = http.post("/v1/entities", json={"text": TEXTS[0], "labels": ["PER"]}, headers={"X-API-Key": API_KEY})
        assert 400 <= refused.status_code < 500 and "PER" in refused.text  # the base model's labels are gone


def test_spacy_uses_the_new_labels(trained: tuple[Path, Path]) -> None:
    model, _ = trained
    nlp = spacy.blank("en")
    pipe = nlp.add_pipe("padellm_ner", config={"model": str(model)})
    assert pipe.labels == tuple(LABELS)
    docs = list(nlp.pipe(TEXTS))
    for doc in docs:
        for span in doc.ents:
            assert span.label_ in LABELS and span.text == doc.text[span.start_char:span.end_char]
            assert 0 < span._.padellm_score <= 1
    assert any(doc.ents for doc in docs)
