"""``flat_ner`` off, at every entry point: every label's entities, nested spans and one span under
several labels kept, as GLiNER's ``flat_ner=False``; on the shipped English model's real answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import spacy

import padellm_ner
from ner_service.engine import InvalidOptionsError, NEREngine
from ner_service.spacy_component import FACTORY, SPANS_KEY
from padellm_ner.cli import main
from tests.conftest import SHIPPED_EN

pytestmark = pytest.mark.skipif(not SHIPPED_EN.is_file(), reason="the shipped en-conll03 model is not in this checkout")

#: The model answers two places called New York (count 2): the second lies inside the team's name.
TEXT = "He flew to New York to watch the New York Yankees ."
FLAT = [("New York", 11, "LOC"), ("New York Yankees", 33, "ORG")]
EVERY = [("New York", 11, "LOC"), ("New York", 33, "LOC"), ("New York Yankees", 33, "ORG")]


def _spans(entities: list) -> list[tuple[str, int, str]]:
    return [(TEXT[e.start:e.end], e.start, e.label) for e in entities]


def test_the_engine_keeps_the_nested_answer_and_flat_is_its_resolution(en_engine: NEREngine) -> None:
    [flat] = en_engine.extract([TEXT])
    [every] = en_engine.extract([TEXT], flat_ner=False)
    assert _spans(flat.entities) == FLAT and _spans(every.entities) == EVERY
    assert set(flat.entities) <= set(every.entities)  # the same answers, scores included: only the overlaps differ
    with pytest.raises(InvalidOptionsError, match="flat_ner must be true or false"):
        en_engine.options(flat_ner="no")


def test_the_python_face_the_command_line_and_spacy_take_flat_ner(capsys: pytest.CaptureFixture[str]) -> None:
    ner = padellm_ner.load("en-conll03")
    as_tuples = lambda found: [(e["text"], e["start"], e["label"]) for e in found]  # noqa: E731
    assert as_tuples(ner.predict_entities(TEXT, flat_ner=False)) == EVERY
    assert as_tuples(ner.predict_entities(TEXT)) == FLAT
    assert [as_tuples(found) for found in ner.batch_predict_entities([TEXT, TEXT], flat_ner=False)] == [EVERY, EVERY]

    assert main(["extract", "--model", "en-conll03", "--dtype", "float32", "--no-flat-ner", TEXT]) == 0
    assert as_tuples(json.loads(capsys.readouterr().out)["entities"]) == EVERY

    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03", "flat_ner": False})
    doc = nlp(TEXT)
    assert [(s.text, s.start_char, s.label_) for s in doc.ents] == FLAT  # doc.ents cannot overlap
    assert [(s.text, s.start_char, s.label_) for s in doc.spans[SPANS_KEY]] == EVERY
    assert all(0 < s._.padellm_score <= 1 for s in doc.spans[SPANS_KEY])
    assert SPANS_KEY not in spacy.blank("en").add_pipe(FACTORY, name="flat", config={"model": "en-conll03"})(nlp.make_doc(TEXT)).spans


def test_evaluate_and_open_eval_score_overlapping_gold_with_flat_ner_off(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                         open_model_folder: Path, data_dir: Path) -> None:
    """A corpus that nests its entities (``../shared/data/open``'s sofc_exp, gum) is scored on every
    gold entity: read flat, the model can find only one of two overlapping ones."""
    from training import open_eval

    corpus = tmp_path / "nested.jsonl"
    corpus.write_text(json.dumps({"text": TEXT, "entities": [{"start": start, "end": start + len(mention), "label": label}
                                                             for mention, start, label in EVERY]}) + "\n", encoding="utf-8")
    scores = {}
    for flag in ("--flat-ner", "--no-flat-ner"):
        assert main(["evaluate", str(corpus), "--model", "en-conll03", "--dtype", "float32", "--json", flag]) == 0
        scores[flag] = json.loads(capsys.readouterr().out)
    assert (scores["--flat-ner"]["per_label"]["LOC"]["tp"], scores["--flat-ner"]["per_label"]["LOC"]["fn"]) == (1, 1)
    assert scores["--no-flat-ner"]["micro_f1"] == 100.0

    seen = {}
    for flag in ("--flat-ner", "--no-flat-ner"):
        assert open_eval.main([str(open_model_folder), "--data", str(data_dir), "--limit", "3", "--seen", "gum", flag]) == 0
        seen[flag] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (seen["--flat-ner"]["flat_ner"], seen["--no-flat-ner"]["flat_ner"]) == (True, False)
    assert seen["--no-flat-ner"]["scores"]["gum"]["recall"] > seen["--flat-ner"]["scores"]["gum"]["recall"]
