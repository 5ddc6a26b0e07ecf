"""The job service on SQLite and PostgreSQL: exact counts and entities under redelivery,
documents failing alone, reprocessing on model change, documents by external id."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from sqlalchemy import func, select

from ner_service.engine import Entity
from pipeline import crud, processing, routing
from pipeline.model_version import model_version, results_version
from pipeline.models import Document, DocumentResult, EntityRow, Job, JobDocument
from ner_service.engine import EnginePool
from pipeline.runner import run_job, run_pending
from pipeline.schemas import JobOut

NAMES = re.compile(r"\b(Berlin|Paris|Angela Merkel|Peter Blackburn|Reuters)\b")
LABELS = {"Berlin": "LOC", "Paris": "LOC", "Angela Merkel": "PER", "Peter Blackburn": "PER", "Reuters": "ORG"}


@dataclass
class _Extraction:
    entities: list[Entity]


class GazetteerEngine:
    """Stands in for the model's output where the tests need entities (the tiny model finds
    none): it tags a few fixed names, and raises on texts containing ``BOOM`` like a model error."""

    def __init__(self, real_engine) -> None:
        self.ner_model = real_engine.ner_model  # same model version as the real engine
        self.max_batch_texts = real_engine.max_batch_texts
        self.calls = 0

    def extract_with(self, options: object, texts: list[str]) -> list[_Extraction]:
        self.calls += 1
        if any("BOOM" in text for text in texts):
            raise RuntimeError("model error on this text")
        return [_Extraction([Entity(m.start(), m.end(), m.group(), LABELS[m.group()], 0.9) for m in NAMES.finditer(t)]) for t in texts]


TEXTS = [
    "Peter Blackburn reports from Berlin.",
    "Angela Merkel visited Paris for Reuters.",
    "Nothing to see here.",
    "Reuters: Berlin and Paris agree.",
    "Angela Merkel met Peter Blackburn.",
]


def _counts(sessions, job_id: int) -> tuple[int, int, int, int, int]:
    with sessions() as session:
        job = session.get(Job, job_id)
        markers = session.scalar(select(func.count()).select_from(DocumentResult))
        entities = session.scalar(select(func.count()).select_from(EntityRow))
        return job.processed, job.failed, job.total, markers, entities


def _new_job(sessions, engine, texts=TEXTS) -> tuple[int, list[int]]:
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t, source="test") for t in texts])
        return crud.create_job(session, ids, model_version(engine)).id, ids


def test_tiny_engine_job_stores_what_the_engine_returns(sessions, tiny_engine) -> None:
    job_id, ids = _new_job(sessions, tiny_engine)
    status = run_job(sessions, EnginePool.serving(tiny_engine), job_id, chunk_size=2)
    assert status["status"] == "completed" and (status["processed"], status["failed"], status["total"]) == (5, 0, 5)
    assert status["model_version"] == model_version(tiny_engine) and status["progress"] == 1.0
    expected = tiny_engine.extract(TEXTS)
    assert sum(len(r.entities) for r in expected) >= 2, "compares entities, not empty lists"
    with sessions() as session:
        for doc_id, result in zip(ids, expected):
            found = crud.document_entities(session, doc_id)
            assert found.document.status == "processed" and found.model_version == model_version(tiny_engine)
            assert [(e.start, e.end, e.label) for e in found.entities] == sorted((e.start, e.end, e.label) for e in result.entities)


def test_redelivered_chunks_write_and_count_nothing_twice(sessions, tiny_engine) -> None:
    engine = GazetteerEngine(tiny_engine)
    version = model_version(engine)
    job_id, ids = _new_job(sessions, engine)
    # a worker died after committing the first two documents of the chunk
    processing.process_chunk(sessions, EnginePool.serving(engine), job_id, ids[:2])
    assert _counts(sessions, job_id) == (2, 0, 5, 2, 5)
    # the whole chunk is delivered again, then once more
    for _ in range(2):
        processing.process_chunk(sessions, EnginePool.serving(engine), job_id, ids)
    processed, failed, total, markers, entity_rows = _counts(sessions, job_id)
    assert (processed, failed, total, markers) == (5, 0, 5, 5)
    assert entity_rows == sum(len(NAMES.findall(t)) for t in TEXTS) == 10
    with sessions() as session:
        assert session.get(Job, job_id).status == "completed"
        for doc_id, text in zip(ids, TEXTS):
            found = crud.document_entities(session, doc_id)
            assert found.model_version == version
            assert [r.text for r in found.entities] == NAMES.findall(text)
            assert all(text[r.start:r.end] == r.text for r in found.entities)


class WorkerLost(BaseException):
    """The worker process gone in the middle of a chunk (not an error of a document)."""


def test_a_chunk_records_each_engine_batch_as_it_returns_so_a_redelivery_redoes_only_the_rest(sessions, tiny_engine) -> None:
    engine = GazetteerEngine(tiny_engine)
    engine.max_batch_texts = 2
    job_id, ids = _new_job(sessions, engine)
    asked: list[list[str]] = []
    extract_with = engine.extract_with

    def lost_at_the_second_batch(options: object, texts: list[str]) -> list[_Extraction]:
        asked.append(list(texts))
        if len(asked) == 2:
            raise WorkerLost  # long work asked of many labels: the visibility timeout passes, the chunk is delivered again
        return extract_with(options, texts)

    engine.extract_with = lost_at_the_second_batch
    with pytest.raises(WorkerLost):
        processing.process_chunk(sessions, EnginePool.serving(engine), job_id, ids)
    assert _counts(sessions, job_id)[:3] == (2, 0, 5)  # the first batch's two documents are recorded
    outcome = processing.process_chunk(sessions, EnginePool.serving(engine), job_id, ids)  # the redelivery
    assert (outcome.processed, outcome.failed) == (3, 0)
    assert asked == [TEXTS[:2], TEXTS[2:4], TEXTS[2:4], TEXTS[4:]]  # the first two are not read again
    assert _counts(sessions, job_id) == (5, 0, 5, 5, 10)


def test_entities_and_marker_are_inserted_once_even_when_recorded_twice(sessions, tiny_engine) -> None:
    engine = GazetteerEngine(tiny_engine)
    job_id, ids = _new_job(sessions, engine, TEXTS[:1])
    entities = engine.extract_with(None, TEXTS[:1])[0].entities
    key = results_version(model_version(engine))
    with sessions.begin() as session:
        assert crud.record_result(session, job_id, ids[0], key, entities) is True
    with sessions.begin() as session:
        assert crud.record_result(session, job_id, ids[0], key, entities) is False
    assert _counts(sessions, job_id) == (1, 0, 1, 1, 2)


def test_a_bad_document_fails_alone(sessions, tiny_engine) -> None:
    engine = GazetteerEngine(tiny_engine)
    texts = ["Angela Merkel in Paris.", "   ", "BOOM goes Berlin.", "Peter Blackburn.", "x" * 30_000]
    job_id, ids = _new_job(sessions, engine, texts)
    outcome = processing.process_chunk(sessions, EnginePool.serving(engine), job_id, ids)
    assert (outcome.processed, outcome.failed) == (2, 3)
    with sessions() as session:
        job = session.get(Job, job_id)
        assert (job.status, job.processed, job.failed) == ("completed", 2, 3)
        docs = {d.id: d for d in session.scalars(select(Document))}
        assert docs[ids[1]].error == "empty text"
        assert docs[ids[2]].error == "RuntimeError: model error on this text"
        assert "NER_MAX_TEXT_CHARS" in docs[ids[4]].error
        assert [docs[i].status for i in ids] == ["processed", "failed", "failed", "processed", "failed"]
        assert [e.text for e in crud.document_entities(session, ids[0]).entities] == ["Angela Merkel", "Paris"]


def test_documents_already_processed_by_this_version_are_counted_without_running_the_model(sessions, tiny_engine) -> None:
    engine = GazetteerEngine(tiny_engine)
    first, ids = _new_job(sessions, engine)
    run_job(sessions, EnginePool.serving(engine), first, chunk_size=5)
    calls = engine.calls
    with sessions.begin() as session:
        second = crud.create_job(session, ids, model_version(engine)).id
    status = run_job(sessions, EnginePool.serving(engine), second, chunk_size=5)
    assert (status["status"], status["processed"]) == ("completed", 5)
    assert engine.calls == calls
    assert _counts(sessions, second)[3:] == (5, 10)


def test_pending_and_reprocessing_on_model_change(sessions, tiny_engine) -> None:
    engine = GazetteerEngine(tiny_engine)
    version = model_version(engine)
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t) for t in TEXTS])
        assert crud.documents_to_run(session, lambda _: version) == ids
    status = run_pending(sessions, EnginePool.serving(engine), chunk_size=2, limit=3)
    assert (status["total"], status["processed"]) == (3, 3)
    with sessions() as session:
        assert crud.documents_to_run(session, lambda _: version) == ids[3:]
        assert crud.documents_to_run(session, lambda _: version, reprocess=True) == ids[3:]
        # a retrained model: only opt-in reprocessing picks up the documents processed before
        assert crud.documents_to_run(session, lambda _: "tiny-conll03-0000000000") == ids[3:]
        assert crud.documents_to_run(session, lambda _: "tiny-conll03-0000000000", reprocess=True) == ids
        # documents in a queued job are not picked twice
        crud.create_job(session, ids[3:], version)
        assert crud.documents_to_run(session, lambda _: version) == []


def test_external_ids_are_reused_for_the_same_text_and_conflict_otherwise(sessions) -> None:
    with sessions.begin() as session:
        first = crud.add_documents(session, [crud.NewDocument("A text.", external_id="a"), crud.NewDocument("B.", external_id="b")])
    with sessions.begin() as session:
        assert crud.add_documents(session, [crud.NewDocument("A text.", external_id="a")]) == first[:1]
    with pytest.raises(crud.DocumentConflictError, match="'a'"), sessions.begin() as session:
        crud.add_documents(session, [crud.NewDocument("Another text.", external_id="a")])
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Document)) == 2


def test_job_creation_rejects_unknown_documents(sessions) -> None:
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument("A text.")])
    with sessions() as session:
        with pytest.raises(crud.UnknownDocumentsError) as error:
            crud.create_job(session, [ids[0], 999], "v")
        assert error.value.missing == [999]
        with pytest.raises(ValueError, match="at least one"):
            crud.create_job(session, [], "v")
        with pytest.raises(crud.UnknownJobError):
            crud.find_job(session, 12345)
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(JobDocument)) == 0


def test_stalled_jobs_are_found_once_per_stall(sessions, tiny_engine) -> None:
    from datetime import timedelta

    from pipeline.models import utcnow

    job_id, _ = _new_job(sessions, tiny_engine, TEXTS[:1])
    with sessions.begin() as session:
        assert crud.stalled_jobs(session, utcnow() - timedelta(hours=1)) == []
        assert crud.stalled_jobs(session, utcnow() + timedelta(seconds=1)) == [job_id]
    with sessions.begin() as session:
        assert crud.stalled_jobs(session, utcnow() - timedelta(seconds=30)) == []


def test_documents_go_to_the_model_of_their_language(sessions, tiny_engine) -> None:
    pool = EnginePool.serving(tiny_engine)
    texts = ["Angela Merkel visited Paris.", "张三，男，1965年出生，高级经济师。", "Bonjour Paris."]
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t, language=lang) for t, lang in zip(texts, [None, "zh-CN", "fr"])])
        job_id = crud.create_job(session, ids, routing.versions_for(pool, crud.languages_of(session, ids))).id
    status = run_job(sessions, pool, job_id, chunk_size=5)
    chinese_engine = pool.engine("zh-resume")
    english_version, chinese_version = model_version(tiny_engine), model_version(chinese_engine)
    assert (status["processed"], status["failed"]) == (2, 1)
    assert status["model_version"] == ",".join(sorted([english_version, chinese_version]))
    expected = chinese_engine.extract([texts[1]])[0].entities
    assert expected, "the Chinese model should find the title in this resume line"
    with sessions() as session:
        english, chinese, french = (crud.document_entities(session, i) for i in ids)
        assert english.model_version == english_version
        assert chinese.model_version == chinese_version
        assert [(e.start, e.end, e.label) for e in chinese.entities] == sorted((e.start, e.end, e.label) for e in expected)
        assert french.document.status == "failed" and "no model for language 'fr'" in french.document.error
        # each document is current under its own language's model: nothing to reprocess
        assert crud.documents_to_run(session, lambda language: routing.version_for(pool, language), reprocess=True) == []
        assert crud.documents_to_run(session, lambda _: english_version, reprocess=True) == [ids[1]]


@pytest.mark.slow
def test_a_fast_dllm_job_on_the_diffusion_model_stores_its_entities(sessions, diffusion_en_engine) -> None:
    texts = ["Angela Merkel met Emmanuel Macron in Paris .", "Nothing to see here ."]
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t, source="test") for t in texts])
        job_id = crud.create_job(session, ids, model_version(diffusion_en_engine), strategy="fast_dllm").id
    status = run_job(sessions, EnginePool.serving(diffusion_en_engine), job_id, chunk_size=2)
    assert (status["status"], status["processed"], status["failed"]) == ("completed", 2, 0)
    expected = diffusion_en_engine.extract(texts, strategy="fast_dllm")
    assert expected[0].entities
    with sessions() as session:
        for doc_id, result in zip(ids, expected):
            found = crud.document_entities(session, doc_id)
            assert [(e.start, e.end, e.label) for e in found.entities] == sorted((e.start, e.end, e.label) for e in result.entities)


def test_a_job_on_an_open_model_finds_the_labels_it_names_under_their_names(sessions, open_engine) -> None:
    texts = ["Angela Merkel met Emmanuel Macron in Paris .", "Nothing to see here ."]
    labels = ["PER", {"name": "LOC", "description": "a place"}]
    version = model_version(open_engine)
    with sessions.begin() as session:
        ids = crud.add_documents(session, [crud.NewDocument(t, source="test") for t in texts])
        job_id = crud.create_job(session, ids, version, labels=labels).id
    status = run_job(sessions, EnginePool.serving(open_engine), job_id, chunk_size=2)
    assert (status["status"], status["processed"], status["failed"]) == ("completed", 2, 0)
    expected = open_engine.extract(texts, labels=labels)
    assert ("Paris", "LOC") in {(e.text, e.label) for e in expected[0].entities}
    with sessions() as session:
        for doc_id, result in zip(ids, expected):
            found = crud.document_entities(session, doc_id)
            assert found.model_version == results_version(version, labels=labels) != version  # other labels, other results
            assert [(e.start, e.end, e.label) for e in found.entities] == sorted((e.start, e.end, e.label) for e in result.entities)


def test_a_job_with_flat_ner_off_stores_overlapping_entities_under_their_own_version(sessions, en_engine) -> None:
    text = "He flew to New York to watch the New York Yankees ."  # two places called New York, the second in the team's name
    version = model_version(en_engine)
    with sessions.begin() as session:
        [doc_id] = crud.add_documents(session, [crud.NewDocument(text, source="test")])
        job_id = crud.create_job(session, [doc_id], version, flat_ner=False).id
    status = run_job(sessions, EnginePool.serving(en_engine), job_id, chunk_size=1)
    assert (status["status"], status["processed"]) == ("completed", 1)
    with sessions() as session:
        found = crud.document_entities(session, doc_id)
        assert found.model_version == results_version(version, flat_ner=False) != version  # flat results are other results
        assert [(e.start, e.end, e.label) for e in found.entities] == [(11, 19, "LOC"), (33, 41, "LOC"), (33, 49, "ORG")]
        assert JobOut.of(crud.find_job(session, job_id)).flat_ner is False
