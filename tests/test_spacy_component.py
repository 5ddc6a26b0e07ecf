"""The ``padellm_ner`` spaCy component: entry point, config, alignment, batching, serialisation, Chinese."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import spacy

from ner_service.engine import Entity, Extraction, ExtractionStats, NEREngine
from ner_service.spacy_component import CONFIG_FILE, FACTORY, PaDeLLMNER
from tests.conftest import SHIPPED_EN

TINY = {"model": "tiny-conll03"}
SENTENCE = "Angela Merkel met Emmanuel Macron in Paris ."
needs_en = pytest.mark.skipif(not SHIPPED_EN.is_file(), reason="the shipped en-conll03 model is not in this checkout")


def _ents(doc: spacy.tokens.Doc) -> list[tuple[str, str]]:
    return [(span.text, span.label_) for span in doc.ents]


def test_the_factory_comes_from_the_installed_entry_point() -> None:
    [point] = [p for p in entry_points(group="spacy_factories") if p.name == FACTORY]
    assert point.value == "ner_service.spacy_component:make_padellm_ner"
    # a fresh interpreter that never imports ner_service itself: spaCy must find the factory through the entry point
    script = (
        "import spacy, sys\n"
        "nlp = spacy.blank('en')\n"
        "pipe = nlp.add_pipe('padellm_ner', config={'model': 'tiny-conll03', 'labels': ['PER']})\n"
        "doc = nlp('Peter Blackburn')\n"
        "print(nlp.pipe_names, pipe.labels, doc._.padellm_stats['batch_texts'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "['padellm_ner'] ('PER',) 1"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"labels": ["PER", "FOOD"]}, "unknown label(s) 'FOOD'"),
        ({"strategy": "beam"}, "unknown strategy 'beam'"),
        ({"decoder": "magic"}, "unknown decoder 'magic'"),
        ({"strategy": "ar", "decoder": "padellm"}, "'padellm' is a strategy: send it as `strategy`"),
        ({"strategy": "fast_dllm"}, "not a masked-diffusion model.*supports the strategies padellm, ar"),
        ({"decoder": "lud"}, "decoder 'lud' cannot run on model 'tiny-conll03'.*not fine-tuned for lexical units"),
        ({"decoder": "speculative"}, "needs a loaded draft model"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"threshold": 1.5}, "threshold must be a number from 0 to 1"),
    ],
)
def test_bad_config_is_refused_when_the_pipe_is_added(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spacy.blank("en").add_pipe(FACTORY, config=TINY | config)


def test_set_entities_expands_to_tokens_resolves_overlaps_and_keeps_scores() -> None:
    doc = spacy.blank("en")("Angela Merkel visited Paris.")  # tokens: Angela Merkel visited Paris .
    entities = [
        Entity(1, 10, "ngela Mer", "PER", 0.6),  # inside two tokens: expands to "Angela Merkel"
        Entity(7, 13, "Merkel", "ORG", 0.9),  # overlaps the longer PER span: dropped
        Entity(22, 27, "Paris", "LOC", 0.7),
        Entity(23, 27, "aris", "LOC", 0.5),  # the same tokens and label once expanded: the higher score is kept
        Entity(22, 26, "Pari", "ORG", 0.4),  # the same tokens, another label, less probable: dropped
    ]
    PaDeLLMNER.set_entities(doc, Extraction(doc.text, entities, ExtractionStats(forward_passes=3, batch_texts=1)))
    assert [(span.start, span.end, span.text, span.label_, span._.padellm_score) for span in doc.ents] == [
        (0, 2, "Angela Merkel", "PER", 0.6),
        (3, 4, "Paris", "LOC", 0.7),
    ]
    assert doc._.padellm_stats["forward_passes"] == 3


def test_nlp_pipe_runs_one_engine_batch_per_batch_size_docs(tiny_engine: NEREngine) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config=TINY | {"batch_size": 4})
    texts = [f"Peter Blackburn visited Brussels on day {i} ." for i in range(6)]
    docs = list(nlp.pipe(texts))  # nlp.pipe's own batch_size (1000) does not raise the component's
    assert [doc._.padellm_stats["batch_texts"] for doc in docs] == [4, 4, 4, 4, 2, 2]
    assert len({id(doc._.padellm_stats) for doc in docs[:4]}) == 4  # one stats dict per doc, same batch figures
    assert docs[0]._.padellm_stats == docs[3]._.padellm_stats
    smaller = list(nlp.pipe(texts, batch_size=3))
    assert [doc._.padellm_stats["batch_texts"] for doc in smaller] == [3] * 6
    expected = tiny_engine.extract(texts)
    assert all(r.entities for r in expected), "compares entities, not empty lists"
    assert [[(s.start_char, s.end_char, s.label_) for s in doc.ents] for doc in docs] == [
        [(e.start, e.end, e.label) for e in result.entities] for result in expected
    ]


def test_threshold_drops_the_entities_scored_below_it(tiny_engine: NEREngine) -> None:
    texts = [f"Peter Blackburn visited Brussels on day {i} ." for i in range(4)] + ["EU rejects German call ."]
    scores = sorted({e.score for result in tiny_engine.extract(texts) for e in result.entities})
    assert len(scores) >= 2, scores
    cut = (scores[0] + scores[-1]) / 2
    every, some = spacy.blank("en"), spacy.blank("en")
    every.add_pipe(FACTORY, config=TINY)
    some.add_pipe(FACTORY, config=TINY | {"threshold": cut})
    all_scores = [span._.padellm_score for doc in every.pipe(texts) for span in doc.ents]
    kept = [span._.padellm_score for doc in some.pipe(texts) for span in doc.ents]
    assert kept == [score for score in all_scores if score >= cut] and 0 < len(kept) < len(all_scores)


def test_a_diffusion_pipe_round_trips_without_a_decoder(tmp_path: Path) -> None:
    """fast_dllm runs no decoder: the pipe's options hold none, so that what it writes it reads back
    (a decoder named with fast_dllm is refused)."""
    if not (Path(__file__).resolve().parent.parent / "ner_service/shipped_models/en-conll03-diffusion/ner_model.json").is_file():
        pytest.skip("the shipped en-conll03-diffusion model is not in this checkout")
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03-diffusion"})  # its default strategy: fast_dllm; nothing is loaded yet
    component = nlp.get_pipe(FACTORY)
    assert (component.options.strategy, component.options.decoder) == ("fast_dllm", None)
    nlp.to_disk(tmp_path / "pipeline")
    restored = spacy.load(tmp_path / "pipeline").get_pipe(FACTORY)
    assert (restored.options.strategy, restored.options.decoder) == ("fast_dllm", None)
    with pytest.raises(ValueError, match="takes no decoder"):
        spacy.blank("en").add_pipe(FACTORY, config={"model": "en-conll03-diffusion", "strategy": "fast_dllm", "decoder": "greedy"})


def test_to_disk_from_disk_round_trip(tmp_path: Path) -> None:
    options = TINY | {"labels": ["LOC", "MISC"], "strategy": "ar", "decoder": "greedy", "batch_size": 3, "threshold": 0.0, "flat_ner": False}
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config=options)
    nlp.to_disk(tmp_path / "pipeline")
    assert json.loads((tmp_path / "pipeline" / FACTORY / CONFIG_FILE).read_text()) == options

    loaded = spacy.load(tmp_path / "pipeline")  # rebuilt from config.cfg, then from_disk
    component = loaded.get_pipe(FACTORY)
    assert (component.options.model, component.labels, component.options.strategy, component.batch_size) == ("tiny-conll03", ("LOC", "MISC"), "ar", 3)

    fresh = spacy.blank("en")
    fresh.add_pipe(FACTORY, config=TINY)  # default options, replaced by what was saved
    fresh.from_disk(tmp_path / "pipeline")
    restored = fresh.get_pipe(FACTORY)
    assert (restored.labels, restored.options.strategy, restored.options.decoder, restored.batch_size, restored.options.flat_ner) == (
        ("LOC", "MISC"), "ar", "greedy", 3, False)
    texts = ["Peter Blackburn", "BRUSSELS 1996-08-22", "EU rejects German call ."]
    original, again = list(nlp.pipe(texts)), list(fresh.pipe(texts))
    assert any(doc.ents for doc in original), "compares entities, not empty lists"
    for one, other in zip(original, again):
        assert _ents(one) == _ents(other)
        assert one._.padellm_stats["forward_passes"] == other._.padellm_stats["forward_passes"]
    assert [doc._.padellm_stats["batch_texts"] for doc in again] == [3, 3, 3]


@pytest.mark.slow
@needs_en
def test_real_entities_with_the_english_model(en_engine: NEREngine) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03"})
    doc = nlp(SENTENCE)
    assert _ents(doc) == [("Angela Merkel", "PER"), ("Emmanuel Macron", "PER"), ("Paris", "LOC")]
    [expected] = en_engine.extract([SENTENCE])
    assert [span._.padellm_score for span in doc.ents] == [e.score for e in expected.entities]
    assert all(0 < span._.padellm_score <= 1 for span in doc.ents)


@pytest.mark.slow
@needs_en
@pytest.mark.parametrize("strategy", ["padellm", "ar"])
def test_labels_and_strategy_options_take_effect(en_engine: NEREngine, strategy: str) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03", "labels": ["LOC"], "strategy": strategy})
    doc = nlp(SENTENCE)
    assert _ents(doc) == [("Paris", "LOC")]
    [expected] = en_engine.extract([SENTENCE], labels=["LOC"], strategy=strategy)
    assert doc._.padellm_stats["forward_passes"] == expected.stats.forward_passes
    assert doc._.padellm_stats["generated_tokens"] == expected.stats.generated_tokens


@pytest.mark.slow
def test_the_lexical_unit_model_runs_in_the_pipe_with_the_entities_of_its_base() -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03-lud", "strategy": "ar", "decoder": "lud"})
    doc = nlp(SENTENCE)
    [expected] = NEREngine.load("en-conll03-lud").extract([SENTENCE], strategy="ar", decoder="greedy")  # the greedy tokens it verifies
    assert _ents(doc) == [(e.text, e.label) for e in expected.entities] and doc.ents
    assert doc._.padellm_stats["forward_passes"] < expected.stats.forward_passes


@pytest.mark.slow
def test_the_diffusion_model_runs_in_the_pipe_with_fast_dllm(diffusion_en_engine: NEREngine) -> None:
    nlp = spacy.blank("en")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03-diffusion", "strategy": "fast_dllm"})
    doc = nlp(SENTENCE)
    [expected] = diffusion_en_engine.extract([SENTENCE], strategy="fast_dllm")
    assert _ents(doc) == [(e.text, e.label) for e in expected.entities] and ("Paris", "LOC") in _ents(doc)


@pytest.mark.slow
@needs_en
def test_chinese_pipeline_uses_character_offsets() -> None:
    # no Chinese model yet: the English model on text that the Chinese tokenizer splits into characters
    nlp = spacy.blank("zh")
    nlp.add_pipe(FACTORY, config={"model": "en-conll03", "labels": ["PER", "LOC"]})
    text = "昨天 Angela Merkel 在 Paris 见了 Emmanuel Macron 。"
    doc = nlp(text)
    assert [token.text for token in doc[:4]] == ["昨", "天", "A", "n"]  # character segmentation
    found = {(span.text, span.label_, span.start_char) for span in doc.ents}
    for name, label in [("Angela Merkel", "PER"), ("Paris", "LOC"), ("Emmanuel Macron", "PER")]:
        assert (name, label, text.index(name)) in found
    for span in doc.ents:
        assert text[span.start_char:span.end_char] == span.text
        assert span.end - span.start == len(span.text.replace(" ", ""))  # one token per non-space character


def test_a_blank_chinese_pipeline_gets_the_chinese_model_by_default() -> None:
    nlp = spacy.blank("zh")
    pipe = nlp.add_pipe(FACTORY)
    assert pipe.options.model == "zh-resume"
    text = "高勇，男，中国国籍，无境外居留权，"
    doc = nlp(text)
    for span in doc.ents:  # character offsets into the text, whatever the model finds
        assert text[span.start_char:span.end_char] == span.text
    assert spacy.blank("en").add_pipe(FACTORY, config={"labels": ["PER"]}).options.model == "en-conll03"


def test_the_old_option_names_are_refused_naming_the_new_ones(tmp_path: Path) -> None:
    """Before strategy and decoder were told apart, ``decoder`` named the strategy and ``backend``
    the token decoder: the config says which field to use now."""
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="backend"):
        nlp.add_pipe(FACTORY, config=TINY | {"backend": "greedy"})
    with pytest.raises(ValueError, match="'ar' is a strategy: send it as `strategy`"):
        nlp.add_pipe(FACTORY, config=TINY | {"decoder": "ar"})
    component = nlp.add_pipe(FACTORY, config=TINY)
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / CONFIG_FILE).write_text(json.dumps({"model": "tiny-conll03", "labels": ["PER"], "decoder": "padellm", "backend": "anpd", "batch_size": 2}))
    with pytest.raises(ValueError, match="`backend` in padellm_ner.json is now `decoder`"):
        component.from_disk(folder)


def test_components_of_one_model_share_its_weights_loaded_once() -> None:
    first = spacy.blank("en").add_pipe(FACTORY, config=TINY | {"batch_size": 2})
    second = spacy.blank("en").add_pipe(FACTORY, config=TINY | {"batch_size": 5, "strategy": "ar"})
    assert first.pool is second.pool
    first(spacy.blank("en")("Peter Blackburn"))
    second(spacy.blank("en")("Peter Blackburn"))
    assert first.pool.engine("tiny-conll03", 2).ner_model is second.pool.engine("tiny-conll03", 5).ner_model
