"""Processing a job's documents: each chunk through the engine of each document's language, each
document recorded in its own transaction (:mod:`pipeline.crud`), so that a redelivered chunk
writes and counts nothing twice. Shared by the Celery tasks and the in-process runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy.orm import Session, sessionmaker

from ner_service.engine import EnginePool, ExtractOptions, ModelNotFoundError
from pipeline import crud
from pipeline.model_version import model_version_of_path, results_version
from pipeline.models import JobStatus
from pipeline.schemas import text_problem


@dataclass
class ChunkOutcome:
    """What one :func:`process_chunk` call changed: documents newly processed or failed in the job."""

    processed: int = 0
    failed: int = 0


class Found(NamedTuple):
    """A document's entities, to be stored under the results version ``version``."""

    version: str
    entities: Sequence[Any]


#: What becomes of a document of the chunk: its entities, or the error it fails with.
DocumentOutcome = Found | str


def chunked(items: Sequence[int], size: int) -> list[list[int]]:
    """``items`` in lists of at most ``size``."""
    return [list(items[i:i + size]) for i in range(0, len(items), max(1, size))]


def _extract(pool: EnginePool, options: ExtractOptions, texts: list[str]) -> list[list[Any] | Exception]:
    """Entities per text; when the batch fails, each text alone so that one bad text fails alone."""
    try:
        return [result.entities for result in pool.extract(options, texts)]
    except Exception:  # noqa: BLE001 - isolate the failing text below
        outcomes: list[list[Any] | Exception] = []
        for text in texts:
            try:
                outcomes.append(pool.extract(options, [text])[0].entities)
            except Exception as error:  # noqa: BLE001 - stored as the document's error
                outcomes.append(error)
        return outcomes


def process_chunk(sessions: sessionmaker[Session], pool: EnginePool, job_id: int, document_ids: Sequence[int]) -> ChunkOutcome:
    """Run the chunk's still-pending documents of a job through the engine of each document's
    language and record each document in its own transaction, under that engine's model
    version, as soon as its engine call returns (a call holds one engine batch of documents), so
    that a chunk redelivered while long work was under way (a worker lost, the visibility timeout
    passed: many long documents asked many labels) redoes only what was not recorded. Safe to
    call again with the same arguments (redelivery): finished documents are skipped."""
    outcome = ChunkOutcome()
    with sessions.begin() as session:
        job = crud.start_running(session, job_id)
        if job.status not in JobStatus.ACTIVE:
            return outcome
        strategy, labels, decoder, flat_ner = job.strategy, job.labels, job.decoder, job.flat_ner
        rows = crud.pending_documents(session, job_id, document_ids)
    by_model: dict[str, list[Any]] = {}
    for row in rows:
        try:
            by_model.setdefault(pool.model_for(row.language), []).append(row)
        except ModelNotFoundError as error:
            _record(sessions, job_id, row.id, str(error), outcome)
    for model, model_rows in by_model.items():
        version = results_version(model_version_of_path(model), strategy, labels, decoder, flat_ner)
        with sessions() as session:
            done = crud.documents_with_results(session, version, [r.id for r in model_rows])
        to_run = []
        for row in model_rows:
            if row.id in done:
                _record(sessions, job_id, row.id, Found(version, ()), outcome)  # stored earlier under this version: only the job's count moves
            elif problem := text_problem(row.text):
                _record(sessions, job_id, row.id, problem, outcome)
            else:
                to_run.append(row)
        if to_run:
            options = pool.options(model, labels=labels, strategy=strategy, decoder=decoder, flat_ner=flat_ner)
            step = max(1, pool.engine(model).max_batch_texts)  # a model that cannot load fails the job (not each document)
            for start in range(0, len(to_run), step):
                part = to_run[start:start + step]
                for row, entities in zip(part, _extract(pool, options, [r.text for r in part])):
                    value = f"{type(entities).__name__}: {entities}" if isinstance(entities, Exception) else Found(version, entities)
                    _record(sessions, job_id, row.id, value, outcome)
    return outcome


def _record(sessions: sessionmaker[Session], job_id: int, document_id: int, value: DocumentOutcome, outcome: ChunkOutcome) -> None:
    """Record one document's outcome in its own transaction, and count it in ``outcome``."""
    with sessions.begin() as session:
        if isinstance(value, str):
            outcome.failed += crud.record_failure(session, job_id, document_id, value)
        else:
            outcome.processed += crud.record_result(session, job_id, document_id, value.version, value.entities)
