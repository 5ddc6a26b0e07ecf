"""Labels named at call time: the rules of a label list, an open-label model in the engine, the
CLI's evaluate of a file's own labels, and the training rows that teach them. The open model is
the ``open_engine`` fixture (tests/conftest.py): the English model's weights declared open."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from corpora import Example, Span
from ner_service.engine import NERModelConfig, prompts
from ner_service.engine.labels import MAX_OPEN_LABELS, InvalidLabelsError, LabelSpec, UnfamiliarLabelsWarning, label_specs, unfamiliar_names
from ner_service.engine.options import ExtractOptions, InvalidOptionsError, UnknownLabelError
from tests.conftest import REPO

SHIPPED = REPO / "ner_service" / "shipped_models"
SENTENCE = "Angela Merkel met Emmanuel Macron in Paris ."


def test_a_bad_open_label_list_is_refused_naming_the_entry_and_the_reason() -> None:
    cases = {
        "is empty": [""],
        "asked twice": ["drug", "dose", "drug"],
        "'drug name' is asked twice": ["drug_name", "drug name"],  # a query writes both as the same words
        "10,000 characters": ["x" * 10_000],
        f"at most {MAX_OPEN_LABELS}": [f"type {n}" for n in range(MAX_OPEN_LABELS + 1)],
        "line break": ["drug\ndose"],
        "must not be empty": [],
        "a name or": [{"name": "drug", "colour": "red"}],
    }
    for reason, labels in cases.items():
        with pytest.raises(InvalidLabelsError, match=reason):
            label_specs(labels, open_labels=True)
    assert label_specs(["drug", {"name": "dose", "description": "an amount taken"}], open_labels=True) == (
        LabelSpec("drug"), LabelSpec("dose", "an amount taken"))


def test_a_model_of_its_own_labels_refuses_others_and_descriptions_saying_so() -> None:
    config = NERModelConfig.read(SHIPPED / "en-conll03")
    with pytest.raises(UnknownLabelError, match="unknown label.*'drug'.*it knows: LOC, MISC, ORG, PER"):
        ExtractOptions("en-conll03", ("drug",)).validated(config)
    with pytest.raises(InvalidOptionsError, match="descriptions are for open-label models"):
        ExtractOptions("en-conll03", ({"name": "PER", "description": "a person"},)).validated(config)


def test_an_open_model_takes_any_names_keeps_their_descriptions_and_answers_its_defaults_without(open_model_folder: Path) -> None:
    config = NERModelConfig.read(open_model_folder)
    options = ExtractOptions("open-test", ("zz top", {"name": "Drug", "description": "a medicine"})).validated(config)
    assert options.labels == ("Drug", "zz top")
    assert options.label_specs() == (LabelSpec("Drug", "a medicine"), LabelSpec("zz top"))
    assert ExtractOptions("open-test").validated(config).labels == tuple(config.labels)


def test_an_open_model_answers_each_label_under_the_name_given_with_or_without_its_description(open_engine) -> None:
    asked = ["PER", {"name": "LOC", "description": "a place"}]
    found = open_engine.extract([SENTENCE], labels=asked)[0].entities
    assert {(e.text, e.label) for e in found} == {("Angela Merkel", "PER"), ("Emmanuel Macron", "PER"), ("Paris", "LOC")}
    # this model never learnt the AR query that lists its labels: its lines are still read under the names asked
    assert {e.label for e in open_engine.extract([SENTENCE], labels=asked, strategy="ar")[0].entities} <= {"PER", "LOC"}
    only_places = open_engine.extract([SENTENCE], labels=["LOC"])[0].entities
    assert [(e.text, e.label) for e in only_places] == [("Paris", "LOC")]
    # a name's underscores are read as spaces; the name comes back as given
    assert prompts.label_prompt("restaurant_name") == "restaurant name"
    under_another = open_engine.extract([SENTENCE], labels=["_LOC_"])[0].entities
    assert [(e.text, e.label) for e in under_another] == [("Paris", "_LOC_")]


def test_many_labels_of_many_windows_are_packed_to_copy_less_cache_with_the_same_answers(open_engine, monkeypatch) -> None:
    from ner_service.engine import branch_forward

    # 16 windows, 50 labels' tries of 8 nodes each: a row per trie copies its window's cache 50 times
    by_cache_row = {window: list(range(window * 50, window * 50 + 50)) for window in range(16)}
    sizes = [8] * 800
    assert len(branch_forward._node_rows(by_cache_row, sizes, width=10)) == 800  # 14,400 columns: the fewest node slots
    assert len(branch_forward._node_rows(by_cache_row, sizes, width=200)) == 16  # 166,400 columns: a row per window
    # the packing that copies less gives the same answers, on a real model asked past every count
    monkeypatch.setattr(open_engine.ner_model.config, "answers_past_count", True)
    monkeypatch.setattr(open_engine, "past_count_floor", 0.0)
    texts = [SENTENCE, "Peter Blackburn of Reuters flew to Brussels .", "Japan beat Syria 2-1 in Abu Dhabi on Friday ."]
    labels = ["PER", "LOC", "ORG", "MISC"] + [f"kind {chr(97 + i)}" for i in range(12)]
    answers = {}
    for cap in (10**9, 0):  # the fewest node slots always; the fewest copied columns always
        monkeypatch.setattr(branch_forward, "MAX_COPIED_COLUMNS", cap)
        answers[cap] = [[(e.start, e.end, e.label) for e in r.entities] for r in open_engine.extract(texts, labels=labels)]
    assert answers[0] == answers[10**9] and all(answers[0])


def test_the_ar_query_of_an_open_model_lists_its_labels_and_its_lines_are_read_by_them() -> None:
    assert prompts.ar_query() == "All entities:"
    assert prompts.ar_query(["drug", "dose (an amount: mg)"]) == "All entities (drug; dose (an amount: mg)):"
    assert prompts.parse_ar_line("dose (an amount: mg): 40 mg", ["drug", "dose (an amount: mg)"]) == ("dose (an amount: mg)", "40 mg")
    assert prompts.parse_ar_line("colour: red", ["drug"]) is None


def test_training_rows_of_an_open_record_ask_its_names_and_count_a_negative_as_zero() -> None:
    from training.examples import query_answers

    example = Example("40 mg aspirin", [Span(0, 5, "dose"), Span(6, 13, "drug")])
    asked = query_answers(example, ["drug", "dose", "programming language"], ["padellm", "ar"], past_count=True, listed_labels=True)
    pairs = {(qa.query, qa.answer) for qa in asked}
    assert ("programming language count:", "0") in pairs
    assert ("drug count:1\ndrug 1:", " aspirin") in pairs
    assert ("All entities (drug; dose; programming language):", "\ndose: 40 mg\ndrug: aspirin") in pairs


def test_the_open_mixture_asks_only_its_sources_labels_or_other_domains_and_never_a_held_out_corpus(data_dir: Path) -> None:
    from training.open_data import ZERO_SHOT_CORPORA, Catalogue, MixtureSettings, raw_label_synonym, training_mixture

    catalogue = Catalogue.read(data_dir / "open")
    mixture = training_mixture(data_dir / "open", data_dir, MixtureSettings(records=400, seed=3))
    assert not {e.corpus for e in mixture} & set(ZERO_SHOT_CORPORA)
    assert {"conll2003", "resume"} <= {e.corpus for e in mixture}
    specific = {name for names in catalogue.specific_names().values() for name in names}
    for e in mixture:
        assert e.labels and len(set(e.labels)) == len(e.labels)
        assert {s.label for s in e.example.spans} <= set(e.labels)
        if e.corpus in catalogue.labels:
            infos = catalogue.labels[e.corpus].values()
            own = {info.name.lower() for info in infos} | {raw_label_synonym(info.raw, info.name) for info in infos}
            for label in e.labels:  # a name, a raw label, or a name and its description in brackets
                written = label.lower()
                assert any(written == name or written.startswith(f"{name} (") for name in own | specific), (e.corpus, label)


def test_the_corpora_held_out_are_a_setting_the_mixture_and_the_names_it_trains_on_follow(data_dir: Path) -> None:
    """``held_out``: a run may train on corpora the recipe holds out and hold out others instead;
    the mixture draws no record of a corpus held out, and the trained names follow."""
    from training.open_data import Catalogue, MixtureSettings, trained_names, training_mixture

    catalogue = Catalogue.read(data_dir / "open")
    kept = {"re3d", "harveyner"}
    held_out = tuple(sorted(set(catalogue.corpora()) - kept))
    mixture = training_mixture(data_dir / "open", data_dir, MixtureSettings(records=200, held_out=held_out, seed=1))
    assert {e.corpus for e in mixture} - {"conll2003", "resume"} == kept
    assert "weapon" not in trained_names(data_dir / "open") and {"weapon", "river", "road"} <= trained_names(data_dir / "open", ("slurp",))
    with pytest.raises(ValueError, match="held_out: no corpus 'nosuch'"):
        training_mixture(data_dir / "open", data_dir, MixtureSettings(records=10, held_out=("nosuch",)))
    only_two = trained_names(data_dir / "open", held_out)
    assert {"weapon", "river", "person"} <= only_two and "disease" not in only_two  # theirs and the supervised corpora's


def test_weibo_may_join_the_mixture_its_named_places_asked_as_locations_and_its_nominal_mentions_never(data_dir: Path) -> None:
    """Weibo's named entities by plain (or Chinese) name, its geo-political entities under "location"
    as the news corpora annotate them; a supervised corpus the mixture has no names for is refused."""
    from dataclasses import replace

    from corpora import read_corpus
    from training.open_data import MixtureSettings, training_mixture

    plain = MixtureSettings(records=200, supervised_shares={"weibo/train.txt": 0.5}, negatives_max=0, description_rate=0.0,
                            synonym_rate=0.0, keep_label_min=1.0, seed=2)
    weibo = [e for e in training_mixture(data_dir / "open", data_dir, plain) if e.corpus == "weibo"]
    assert len(weibo) == 100
    assert {label.lower() for e in weibo for label in e.labels} <= {"person", "organization", "location", "人名", "机构", "地名"}
    places = [e.example.text[s.start:s.end] for e in weibo for s in e.example.spans if s.label.lower() in ("location", "地名")]
    named_gpe = {e.text[s.start:s.end] for e in read_corpus(str(data_dir / "weibo" / "train.txt")) for s in e.spans if s.label == "GPE.NAM"}
    assert set(places) & named_gpe
    for e in weibo:
        assert {s.label for s in e.example.spans} <= set(e.labels)
    with pytest.raises(ValueError, match="'nosuch/train.txt' is none of the supervised corpora"):
        training_mixture(data_dir / "open", data_dir, replace(plain, supervised_shares={"nosuch/train.txt": 0.1}))


def test_a_long_record_is_cut_into_sentence_pieces_and_a_label_cut_through_is_not_asked_there() -> None:
    """``cut_long_records``: a record over ``max_text_chars`` is trained on in pieces of whole
    sentences (it was left out: most records of gum, wlp, biored, nerel_ru, chinese_literature)."""
    from training.open_data import pieces_of

    text = "Aspirin eases pain . Take 40 mg twice a day . Ibuprofen 200 mg helps too ."
    record = Example(text, [Span(text.index(m), text.index(m) + len(m), label) for m, label in
                            (("Aspirin", "drug"), ("40 mg", "dose"), ("Ibuprofen", "drug"), ("200 mg", "dose"))], "src")
    assert pieces_of(record, ["drug", "dose"], None) == pieces_of(record, ["drug", "dose"], len(text)) == [(record, ["drug", "dose"])]
    pieces = pieces_of(record, ["drug", "dose"], 50)
    assert [(piece.text, [(piece.text[s.start:s.end], s.label) for s in piece.spans], labels) for piece, labels in pieces] == [
        ("Aspirin eases pain . Take 40 mg twice a day .", [("Aspirin", "drug"), ("40 mg", "dose")], ["drug", "dose"]),
        ("Ibuprofen 200 mg helps too .", [("Ibuprofen", "drug"), ("200 mg", "dose")], ["drug", "dose"])]
    assert all(piece.source == "src" for piece, _ in pieces)
    across = Example("A long name . It goes on here .", [Span(2, 18, "thing")])  # an entity across the sentence mark
    assert [(piece.text, piece.spans, labels) for piece, labels in pieces_of(across, ["thing", "place"], 17)] == [
        ("A long name .", [], ["place"]), ("It goes on here .", [], ["place"])]


def test_a_label_may_be_asked_as_users_also_write_it_and_its_spans_go_under_that_name() -> None:
    import random

    from training.open_data import NAME_VARIANTS, LabelInfo, MixtureSettings, ask

    example = Example(SENTENCE, [Span(0, 13, "PER"), Span(37, 42, "LOC")])
    infos = {"PER": LabelInfo("PER", "person", None), "LOC": LabelInfo("LOC", "location", None)}
    written_as = set()
    for seed in range(30):
        settings = MixtureSettings(keep_label_min=1.0, description_rate=0.0, synonym_rate=0.0, variant_rate=1.0)
        asked = ask(example, "conll2003", ["PER", "LOC"], infos, [], random.Random(seed), settings)
        under = {SENTENCE[s.start:s.end]: s.label for s in asked.example.spans}
        assert under["Angela Merkel"] in NAME_VARIANTS["person"] and under["Paris"] in NAME_VARIANTS["location"]
        assert sorted(asked.labels) == sorted(under.values())
        written_as.add(under["Angela Merkel"])
    assert len(written_as) > 1
    plain = ask(example, "conll2003", ["PER", "LOC"], infos, [], random.Random(0),
                MixtureSettings(keep_label_min=1.0, description_rate=0.0, synonym_rate=0.0))
    assert {s.label.lower() for s in plain.example.spans} == {"person", "location"}


def test_the_names_a_model_trained_on_are_its_corpora_s_and_their_variants_never_a_held_out_corpus_s(data_dir: Path) -> None:
    from training.open_data import trained_names, zero_shot_sets

    trained = trained_names(data_dir / "open")
    assert {"person", "organisation", "disease", "gene or gene product", "job title", "人名"} <= trained
    harvey = next(s for s in zero_shot_sets(data_dir / "open", 1) if s.corpus == "harveyner")  # rivers, roads: no corpus trained on them
    assert harvey.labels and not set(harvey.labels) & trained


def test_a_label_its_record_does_not_hold_is_asked_less_often_with_absent_keep() -> None:
    import random
    from dataclasses import replace

    from training.open_data import LabelInfo, MixtureSettings, ask

    example = Example(SENTENCE, [Span(0, 13, "PER")])
    infos = {raw: LabelInfo(raw, name, None) for raw, name in {"PER": "person", "LOC": "location", "ORG": "organization",
                                                               "MISC": "miscellaneous"}.items()}
    plain = MixtureSettings(keep_label_min=1.0, description_rate=0.0, synonym_rate=0.0)
    always = ask(example, "conll2003", list(infos), infos, [], random.Random(0), plain)
    assert sorted(always.labels) == ["location", "miscellaneous", "organization", "person"]
    never = ask(example, "conll2003", list(infos), infos, [], random.Random(0), replace(plain, absent_keep=0.0))
    assert never.labels == ("person",) and [s.label for s in never.example.spans] == ["person"]
    halves = [ask(example, "conll2003", list(infos), infos, [], random.Random(seed), replace(plain, absent_keep=0.5))
              for seed in range(200)]
    assert all("person" in asked.labels for asked in halves)
    assert 0.35 < sum(len(asked.labels) - 1 for asked in halves) / (3 * len(halves)) < 0.65


def test_a_zero_shot_corpus_is_asked_its_names_or_with_their_definitions(data_dir: Path) -> None:
    from training.open_data import zero_shot_sets

    held_out = next(z for z in zero_shot_sets(data_dir / "open", 2) if z.corpus == "re3d")
    assert held_out.asked() == held_out.labels and "weapon" in held_out.labels
    described = dict(zip(held_out.labels, held_out.asked(described=True)))
    assert described["weapon"] == {"name": "weapon", "description": held_out.descriptions["weapon"]}
    assert held_out.descriptions["weapon"] and len(held_out.descriptions["weapon"]) <= 100
    person_too = dict(zip(held_out.labels, held_out.asked(described=True, bare={"person"})))  # a trained name left bare
    assert person_too["person"] == "person" and person_too["weapon"] == described["weapon"] and "person" in held_out.descriptions


def test_evaluate_scores_a_files_own_labels_on_an_open_model_under_the_names_asked(open_model_folder: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "places.jsonl"
    corpus.write_text(json.dumps({"text": SENTENCE, "entities": [{"start": 37, "end": 42, "label": "city"},
                                                                   {"start": 0, "end": 13, "label": "human"},
                                                                   {"start": 18, "end": 33, "label": "human"}]}) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "padellm_ner.cli", "evaluate", str(corpus), "--model", str(open_model_folder), "--json"]
    asked = subprocess.run(command + ["--ask-as", "city=LOC,human=PER"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert asked.returncode == 0, asked.stderr
    report = json.loads(asked.stdout)
    assert set(report["per_label"]) == {"LOC", "PER"} and report["micro_f1"] == pytest.approx(100.0)
    only = subprocess.run(command + ["--labels", "city", "--ask-as", "city=LOC"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert json.loads(only.stdout)["per_label"].keys() == {"LOC"}
    closed = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "evaluate", str(corpus), "--ask-as", "city=LOC"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert closed.returncode != 0 and "open-label models" in closed.stderr


def test_evaluate_asks_each_record_only_the_labels_its_own_source_annotates(open_model_folder: Path, tmp_path: Path) -> None:
    """A corpus of several sources (``sources.json`` beside it, as in ../shared/data/open) annotates
    a record for its own source's labels only: the record of a source of people alone is not asked
    for places, so the place it names is neither missed nor a false alarm."""
    corpus = tmp_path / "dev.jsonl"
    people = {"text": SENTENCE, "entities": [{"start": 0, "end": 13, "label": "human"}, {"start": 18, "end": 33, "label": "human"}],
              "source": "people"}
    places = {"text": SENTENCE, "entities": [{"start": 37, "end": 42, "label": "city"}], "source": "places"}
    corpus.write_text("".join(json.dumps(r) + "\n" for r in (people, places)), encoding="utf-8")
    (tmp_path / "sources.json").write_text(json.dumps({"people": ["human"], "places": ["city"]}), encoding="utf-8")
    command = [sys.executable, "-m", "padellm_ner.cli", "evaluate", str(corpus), "--model", str(open_model_folder), "--json",
               "--ask-as", "city=LOC,human=PER"]
    own = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert own.returncode == 0, own.stderr
    report = json.loads(own.stdout)
    assert (report["micro_f1"], report["per_label"]["PER"]["tp"], report["per_label"]["LOC"]["tp"]) == (pytest.approx(100.0), 2, 1)
    (tmp_path / "sources.json").unlink()  # every record asked every label: each finds the other source's entities too
    every = json.loads(subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600).stdout)
    assert every["per_label"]["LOC"]["fp"] == 1 and every["per_label"]["PER"]["fp"] == 2 and every["precision"] < 100
    (tmp_path / "sources.json").write_text(json.dumps({"people": ["human"], "animals": ["dog"]}), encoding="utf-8")
    unlisted = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert unlisted.returncode != 0 and "places" in unlisted.stderr and "Traceback" not in unlisted.stderr


def test_evaluate_scores_nested_gold_and_a_span_under_two_labels(open_model_folder: Path, tmp_path: Path) -> None:
    """A corpus of ../shared/data/open may nest entities or give a span two labels: each label is its own
    question, so evaluate scores every gold entity (a file to train on is refused instead)."""
    corpus = tmp_path / "nested.jsonl"
    corpus.write_text(json.dumps({"text": SENTENCE, "entities": [
        {"start": 0, "end": 13, "label": "human"}, {"start": 18, "end": 33, "label": "human"},
        {"start": 37, "end": 42, "label": "city"}, {"start": 37, "end": 42, "label": "capital"},
        {"start": 18, "end": 42, "label": "phrase"}]}) + "\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "evaluate", str(corpus), "--model", str(open_model_folder), "--json",
                           "--ask-as", "human=PER,city=LOC,capital=ORG,phrase=MISC"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    per_label = json.loads(done.stdout)["per_label"]
    assert per_label["PER"]["tp"] == 2 and per_label["LOC"]["tp"] == 1  # Paris found as a city (LOC) ...
    assert per_label["ORG"]["fn"] == 1 and per_label["MISC"]["fn"] == 1  # ... and still owed as a capital, and the phrase around it


def test_the_python_face_and_the_spacy_component_take_open_labels(open_model_folder: Path) -> None:
    import spacy

    import padellm_ner

    ner = padellm_ner.load(str(open_model_folder))
    found = ner.predict_entities(SENTENCE, labels=[{"name": "LOC", "description": "a place"}], threshold=0.0)
    assert [(e["text"], e["label"]) for e in found] == [("Paris", "LOC")]
    with pytest.raises(InvalidOptionsError, match="asked twice"):
        ner.predict_entities(SENTENCE, labels=["LOC", "LOC"])
    nlp = spacy.blank("en")
    nlp.add_pipe("padellm_ner", config={"model": str(open_model_folder), "labels": ["PER", {"name": "LOC", "description": "a place"}]})
    doc = nlp(SENTENCE)
    assert {(span.text, span.label_) for span in doc.ents} == {("Angela Merkel", "PER"), ("Emmanuel Macron", "PER"), ("Paris", "LOC")}


def test_a_name_an_open_model_never_trained_on_asked_bare_is_unfamiliar_as_a_query_writes_it() -> None:
    trained = ["location", "person", "restaurant name"]
    specs = label_specs(["Location", "restaurant_name", "PERSON ", "weapon", {"name": "river", "description": "a stream of water"}], True)
    assert unfamiliar_names(specs, trained) == ["weapon"]  # case, underscores and spaces as the query writes them; described: told
    assert unfamiliar_names(specs, []) == []  # a model that lists no trained names (closed, or trained before they were listed)
    config = NERModelConfig(name="open-x", labels=["person"], open_labels=True, trained_names=trained)
    assert ExtractOptions("open-x", ("weapon", "person")).validated(config).unfamiliar_labels(config) == ["weapon"]
    assert ExtractOptions("open-x").validated(config).unfamiliar_labels(config) == []  # its default labels


def test_callers_of_python_spacy_and_the_cli_are_told_which_names_it_never_trained_on(open_model_folder: Path) -> None:
    import warnings

    import spacy

    import padellm_ner

    ner = padellm_ner.load(str(open_model_folder))
    with pytest.warns(UnfamiliarLabelsWarning, match=r"never trained on the label name\(s\) 'weapon'.*ask that one") as told:
        found = ner.predict_entities(SENTENCE, labels=["PER", "weapon", {"name": "river", "description": "a stream of water"}])
    assert len(told) == 1 and "river" not in str(told[0].message)
    assert {e["text"] for e in found if e["label"] == "PER"} >= {"Angela Merkel"}  # still answered
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # names it knows, or described ones: nothing to tell
        ner.predict_entities(SENTENCE, labels=["PER", {"name": "weapon", "description": "a gun or a bomb"}])
        spacy.blank("en").add_pipe("padellm_ner", config={"model": str(open_model_folder), "labels": ["PER"]})
    with pytest.warns(UnfamiliarLabelsWarning, match="'river'"):  # once, when the pipeline is built
        spacy.blank("en").add_pipe("padellm_ner", config={"model": str(open_model_folder), "labels": ["PER", "river"]})
    cli = subprocess.run([sys.executable, "-m", "padellm_ner.cli", "extract", "--model", str(open_model_folder), "--labels",
                          "PER,weapon", SENTENCE], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert cli.returncode == 0, cli.stderr
    assert "never trained on the label name(s) 'weapon'" in cli.stderr and '{"name": "weapon", "description": "..."}' in cli.stderr
    assert {e["text"] for e in json.loads(cli.stdout)["entities"] if e["label"] == "PER"} >= {"Angela Merkel"}


def test_the_open_recipe_writes_the_names_it_trains_on_into_its_model(data_dir: Path) -> None:
    from training.configs import OpenTrainConfig
    from training.open_data import trained_names
    from ner_service.engine import NERModelConfig
    from ner_service.engine.ner_model import resolve_ner_model
    from training.open_trainer import continued_count_rule, open_ner_config

    class Tokenizer:
        eos_token = "<eos>"

    config = open_ner_config(OpenTrainConfig(base="gemma3-270m", train=str(data_dir / "open"), output="unused", name="open-x"), Tokenizer())
    assert config.open_labels and config.trained_names == sorted(trained_names(data_dir / "open"))
    assert "person" in config.trained_names and "weapon" not in config.trained_names  # re3d's, a held-out corpus
    wider = open_ner_config(OpenTrainConfig(base="gemma3-270m", train=str(data_dir / "open"), output="unused", name="open-x",
                                            held_out=["slurp", "ler_de"]), Tokenizer())
    assert "weapon" in wider.trained_names and wider.trained_names == sorted(trained_names(data_dir / "open", ["slurp", "ler_de"]))
    assert config.count_quantile is None
    if (SHIPPED / "open" / "ner_model.json").is_file():  # a run over the shipped open adapter counts as that model does until its rule is chosen again
        further = open_ner_config(OpenTrainConfig(base="gemma3-270m", train=str(data_dir / "open"), output="unused", init_adapter="open"), Tokenizer())
        shipped = NERModelConfig.read(resolve_ner_model("open"))
        assert shipped.count_quantile is not None and (further.count_quantile, further.count_bias) == (shipped.count_quantile, shipped.count_bias)
    assert continued_count_rule("en-conll03") == {}  # not an open model: its count bias was chosen for its own labels


def _writable_copy(folder: Path, to: Path) -> Path:
    """``folder`` with its own ``ner_model.json`` (to write into) and its weights linked."""
    to.mkdir()
    for path in folder.iterdir():
        if path.name == "ner_model.json":
            (to / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
        else:
            (to / path.name).symlink_to(path.resolve())
    return to


@pytest.mark.slow
def test_open_eval_scores_held_out_corpora_and_fits_the_score_map_where_users_ask(open_model_folder: Path, data_dir: Path,
                                                                                tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``python -m training.open_eval``: F1 of every zero-shot corpus and the supervised devs asked by
    name; ``--calibrate --write`` fits the PaDeLLM score map on texts the scores are not reported on
    and stores it in the model's ``ner_model.json`` (a copy of the test model here)."""
    from training import open_eval
    from training.open_data import ZERO_SHOT_CORPORA

    model = _writable_copy(open_model_folder, tmp_path / "model")
    common = [str(model), "--data", str(data_dir), "--limit", "2"]
    scored = subprocess.run([sys.executable, "-m", "training.open_eval", *common, "--supervised-limit", "3", "--json", str(tmp_path / "eval.jsonl")],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert scored.returncode == 0, scored.stderr
    [line] = (tmp_path / "eval.jsonl").read_text(encoding="utf-8").splitlines()
    result = json.loads(line)
    assert set(result["scores"]) == set(ZERO_SHOT_CORPORA) | {"conll2003", "resume"}
    assert result["scores"]["conll2003"]["texts"] == 3 and all(0 <= s["micro_f1"] <= 100 for s in result["scores"].values())
    for score in result["scores"].values():  # F1 is the harmonic mean of the precision and recall given beside it
        p, r = score["precision"], score["recall"]
        assert score["micro_f1"] == pytest.approx(2 * p * r / (p + r) if p + r else 0.0, abs=0.02)
    assert result["zero_shot_average"] == pytest.approx(sum(result["scores"][c]["micro_f1"] for c in ZERO_SHOT_CORPORA) / 7, abs=0.01)
    assert result["described"] is None and result["skip"] == 0
    held_out = [result["scores"][c]["per_label"] for c in ZERO_SHOT_CORPORA]  # every zero-shot answer is under one kind of name
    for key in ("tp", "fp", "fn"):
        assert sum(kind[key] for kind in result["by_name"].values()) == sum(c[key] for labels in held_out for c in labels.values())
    assert open_eval.main([*common, "--supervised-limit", "1", "--described", "new", "--skip", "2", "--held-out", "re3d,slurp"]) == 0  # in this process
    asked = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert asked["described"] == "new" and asked["skip"] == 2 and set(asked["scores"]) == {"re3d", "slurp", "conll2003", "resume"}

    before = json.loads((open_model_folder / "ner_model.json").read_text(encoding="utf-8"))["score_calibration"]
    assert open_eval.main([*common, "--calibrate", "--write"]) == 0
    fitted = capsys.readouterr().out
    assert "| padellm |" in fitted and "written to" in fitted
    stored = json.loads((model / "ner_model.json").read_text(encoding="utf-8"))["score_calibration"]
    assert set(stored["padellm"]) == {"slope", "intercept"} and set(stored) == set(before) | {"padellm"}
    assert json.loads((open_model_folder / "ner_model.json").read_text(encoding="utf-8"))["score_calibration"] == before


def test_open_eval_scores_corpora_trained_on_asked_as_the_held_out_ones(open_model_folder: Path, data_dir: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    """``--seen``: corpora the model trained on, their dev texts asked every name of the corpus as
    the zero-shot corpora are (the yardstick of the zero-shot figures); a held-out corpus, one of
    several sources and an unknown one are clear exits 2."""
    from training import open_eval
    from training.open_data import zero_shot_sets

    (btc,) = zero_shot_sets(data_dir / "open", 2, corpora=("btc",))
    assert btc.split == "dev" and btc.labels and all(s.label in btc.labels for e in btc.examples for s in e.spans)
    assert open_eval.main([str(open_model_folder), "--data", str(data_dir), "--limit", "2", "--seen", "btc, scierc"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result["scores"]) == {"btc", "scierc"} and all(s["texts"] == 2 and s["split"] == "dev" for s in result["scores"].values())
    assert result["seen_average"] == pytest.approx((result["scores"]["btc"]["micro_f1"] + result["scores"]["scierc"]["micro_f1"]) / 2, abs=0.01)
    for seen, problem in (("re3d", "'re3d' is held out"), ("snips", "several sources"), ("nosuch", "no corpus 'nosuch'"), (",", "at least one"),
                          ("germeval2014", "'germeval2014' has no train split")):
        with pytest.raises(SystemExit) as stopped:
            open_eval.main([str(open_model_folder), "--data", str(data_dir), "--seen", seen])
        assert stopped.value.code == 2 and problem in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # before the model loads
        open_eval.main([str(open_model_folder), "--data", str(data_dir), "--skip", "-1"])
    assert stopped.value.code == 2 and "--skip: a number of texts, 0 or more" in capsys.readouterr().err
    for held_out, problem in (("re3d,nosuch", "corpora of"), (",", "name at least one corpus")):  # the zero-shot dev: corpora of open/
        with pytest.raises(SystemExit) as stopped:
            open_eval.main([str(open_model_folder), "--data", str(data_dir), "--held-out", held_out])
        assert stopped.value.code == 2 and f"--held-out: {problem}" in capsys.readouterr().err


def test_open_eval_scores_the_held_out_corpora_it_is_given(open_model_folder: Path, data_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """``--held-out``: a model trained with other corpora held out is scored on those, every name
    of each asked, and its answers split by the names that run trained on."""
    from training import open_eval
    from training.open_data import trained_names, zero_shot_sets

    assert open_eval.main([str(open_model_folder), "--data", str(data_dir), "--limit", "1", "--supervised-limit", "1",
                           "--held-out", "ler_de,msra_peoplesdaily_zh"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result["scores"]) == {"ler_de", "msra_peoplesdaily_zh", "conll2003", "resume"}
    assert result["zero_shot_average"] == pytest.approx((result["scores"]["ler_de"]["micro_f1"] +
                                                         result["scores"]["msra_peoplesdaily_zh"]["micro_f1"]) / 2, abs=0.01)
    (ler_de,) = zero_shot_sets(data_dir / "open", 2, corpora=("ler_de",))
    trained = trained_names(data_dir / "open", ["ler_de", "msra_peoplesdaily_zh"])
    assert {"judge", "person"} <= set(ler_de.labels) and "judge" not in trained and "person" in trained  # no corpus trained on names judges
    gold = sum(c["tp"] + c["fn"] for corpus in ("ler_de", "msra_peoplesdaily_zh") for c in result["scores"][corpus]["per_label"].values())
    assert sum(kind["tp"] + kind["fn"] for kind in result["by_name"].values()) == gold


@pytest.mark.slow
def test_open_eval_chooses_a_count_quantile_on_unseen_labels_and_reports_it_on_other_texts(open_model_folder: Path, data_dir: Path,
                                                                                       tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--choose-quantile --write``: the count quantile of the best zero-shot average on the texts
    after the reported ones, its table, and the choice stored only in the copy's ``ner_model.json``."""
    from training import open_eval

    model = _writable_copy(open_model_folder, tmp_path / "model")
    before = json.loads((open_model_folder / "ner_model.json").read_text(encoding="utf-8")).get("count_quantile")
    common = [str(model), "--data", str(data_dir), "--limit", "1", "--choose-limit", "1"]
    chosen = subprocess.run([sys.executable, "-m", "training.open_eval", *common, "--quantiles", "0.6,0.3", "--choose-quantile", "--write"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert chosen.returncode == 0, chosen.stderr
    assert "| count quantile | zero-shot average, choosing texts |" in chosen.stdout and "| **average** |" in chosen.stdout
    assert "| 0.6" in chosen.stdout and "| 0.3" in chosen.stdout
    printed = json.loads(chosen.stdout.split("count_quantile: ", 1)[1].splitlines()[0])
    assert printed in (before, 0.6, 0.3) and json.loads((model / "ner_model.json").read_text(encoding="utf-8")).get("count_quantile") == printed
    assert json.loads((open_model_folder / "ner_model.json").read_text(encoding="utf-8")).get("count_quantile") == before
    with pytest.raises(SystemExit) as refused:  # before the model loads
        open_eval.main([*common, "--quantiles", "0.6,7", "--choose-quantile"])
    assert refused.value.code == 2 and "probability in (0, 1]" in capsys.readouterr().err


@pytest.mark.slow
def test_open_windows_chooses_how_an_open_model_reads_on_texts_it_does_not_report(open_model_folder: Path, data_dir: Path,
                                                                                tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``python -m training.open_windows``: every setting scored on the choosing texts (zero-shot and
    supervised), the chosen one reported beside the model's own, and with ``--write`` stored only in
    the copy's ``ner_model.json``; a bad setting is a clear exit 2."""
    from training import open_windows
    from training.open_windows import WindowSetting, parse_window_grid

    assert parse_window_grid("160, s48,s48") == [WindowSetting(False, 160), WindowSetting(True, 48)]
    model = _writable_copy(open_model_folder, tmp_path / "model")
    before = json.loads((open_model_folder / "ner_model.json").read_text(encoding="utf-8"))
    common = [str(model), "--data", str(data_dir), "--limit", "1", "--choose-limit", "1", "--supervised-limit", "2"]
    chosen = subprocess.run([sys.executable, "-m", "training.open_windows", *common, "--windows", "s24,160", "--write"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert chosen.returncode == 0, chosen.stderr
    assert "| windows | zero-shot, choosing texts | conll2003, choosing texts | resume, choosing texts | mean |" in chosen.stdout
    assert "| s24" in chosen.stdout and "| 160" in chosen.stdout and "| zero-shot |" in chosen.stdout
    name = chosen.stdout.split("windows: ", 1)[1].splitlines()[0]
    stored = json.loads((model / "ner_model.json").read_text(encoding="utf-8"))
    assert name in ("s24", "160") and (stored["sentence_windows"], stored["window_tokens"]) == ((True, 24) if name == "s24" else (False, 160))
    assert json.loads((open_model_folder / "ner_model.json").read_text(encoding="utf-8")) == before
    with pytest.raises(SystemExit) as refused:  # before the model loads
        open_windows.main([*common, "--windows", "s48,fortyeight"])
    assert refused.value.code == 2 and "'fortyeight' is no window setting" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # the zero-shot corpora too are checked before the model loads
        open_windows.main([*common, "--held-out", "re3d,nosuch"])
    assert refused.value.code == 2 and "--held-out: corpora of" in capsys.readouterr().err
