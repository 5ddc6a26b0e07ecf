"""Documents: storing them (an ``external_id`` reused per owner), finding them, and reading a
document with its stored entities."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from pipeline.models import LOCAL_OWNER, Document, DocumentResult, DocumentStatus, EntityRow, Job, JobDocument, JobStatus


class UnknownDocumentsError(LookupError):
    """Some document ids do not exist, or belong to another owner (``missing`` lists them)."""

    def __init__(self, missing: Sequence[int | str]) -> None:
        super().__init__(f"unknown document ids: {', '.join(map(str, missing))}")
        self.missing = list(missing)


class DocumentConflictError(ValueError):
    """An ``external_id`` already names a document with another text."""


@dataclass(frozen=True)
class NewDocument:
    """A document to store, for ``owner`` (an API key's id; :data:`LOCAL_OWNER` otherwise)."""

    text: str
    external_id: str | None = None
    language: str | None = None
    source: str | None = None
    owner: str = LOCAL_OWNER


@dataclass(frozen=True)
class DocumentEntities:
    """A document and its entities stored under ``model_version`` (None: it has no results)."""

    document: Document
    model_version: str | None
    entities: list[EntityRow]


def content_hash(text: str) -> str:
    """SHA-256 of the text (hex)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def add_documents(session: Session, documents: Iterable[NewDocument]) -> list[int]:
    """Store documents and return their ids in order. A known ``external_id`` of the same owner
    with the same text reuses its document (re-submission is idempotent); with another text it
    raises :class:`DocumentConflictError` (another owner's ``external_id`` is another document).
    Text with NUL characters raises ``ValueError``."""
    ids: list[int] = []
    seen: dict[tuple[str, str], Document] = {}
    for doc in documents:
        if "\x00" in doc.text:
            raise ValueError("text contains NUL characters")
        digest = content_hash(doc.text)
        if doc.external_id is not None:
            existing = seen.get((doc.owner, doc.external_id)) or session.scalar(
                select(Document).where(Document.owner == doc.owner, Document.external_id == doc.external_id))
            if existing is not None:
                if existing.content_hash != digest:
                    raise DocumentConflictError(f"external_id {doc.external_id!r} already names a document with another text")
                ids.append(existing.id)
                continue
        row = Document(text=doc.text, external_id=doc.external_id, language=doc.language, source=doc.source, owner=doc.owner,
                       content_hash=digest, status=DocumentStatus.PENDING)
        session.add(row)
        session.flush()
        if doc.external_id is not None:
            seen[(doc.owner, doc.external_id)] = row
        ids.append(row.id)
    return ids


def owned_document_ids(session: Session, owner: str, public_ids: Sequence[str]) -> list[int]:
    """The row ids of ``owner``'s documents with these public ids, in order; raises
    :class:`UnknownDocumentsError` for the public ids that name none of them."""
    found = dict(session.execute(select(Document.public_id, Document.id)
                                 .where(Document.owner == owner, Document.public_id.in_(list(public_ids)))).all())
    missing = [p for p in dict.fromkeys(public_ids) if p not in found]
    if missing:
        raise UnknownDocumentsError(missing)
    return [found[p] for p in public_ids]


def public_ids_of(session: Session, document_ids: Sequence[int]) -> list[str]:
    """The public ids of documents, in the order of their row ids."""
    found = dict(session.execute(select(Document.id, Document.public_id).where(Document.id.in_(list(document_ids)))).all())
    return [found[i] for i in document_ids]


def languages_of(session: Session, document_ids: Sequence[int]) -> set[str | None]:
    """The distinct languages of some documents (``None`` for documents without one)."""
    return set(session.scalars(select(Document.language).where(Document.id.in_(list(document_ids))).distinct()))


def documents_to_run(session: Session, version_of: Callable[[str | None], str | None], reprocess: bool = False,
                     limit: int | None = None) -> list[int]:
    """Pending documents, plus (``reprocess``) processed documents with results only for other
    model versions than ``version_of(language)``, the current one for their language;
    documents already in a queued or running job are left out."""
    active = select(JobDocument.document_id).join(Job, Job.id == JobDocument.job_id).where(Job.status.in_(JobStatus.ACTIVE))
    wanted = Document.status == DocumentStatus.PENDING
    if reprocess:
        languages = session.scalars(select(Document.language).where(Document.status == DocumentStatus.PROCESSED).distinct())
        current_by_language = [(language, version) for language in languages if (version := version_of(language))]
        if current_by_language:
            is_current = or_(*(and_(Document.language.is_(None) if language is None else Document.language == language,
                                    DocumentResult.model_version == version) for language, version in current_by_language))
            current = select(DocumentResult.document_id).join(Document, Document.id == DocumentResult.document_id).where(is_current)
            wanted = wanted | ((Document.status == DocumentStatus.PROCESSED) & Document.id.not_in(current))
    query = select(Document.id).where(wanted, Document.id.not_in(active)).order_by(Document.id)
    return list(session.scalars(query.limit(limit) if limit else query))


def document_entities(session: Session, document_id: int | str, version: str | None = None,
                      owner: str | None = None) -> DocumentEntities | None:
    """A document and its entities for ``version`` (default: its latest results), by row id or
    public id (with ``owner``, only among that owner's documents), or ``None`` if there is no
    such document."""
    found = select(Document).where(Document.id == document_id if isinstance(document_id, int) else Document.public_id == document_id)
    document = session.scalar(found if owner is None else found.where(Document.owner == owner))
    if document is None:
        return None
    if version is None:
        version = session.scalar(select(DocumentResult.model_version).where(DocumentResult.document_id == document.id)
                                 .order_by(DocumentResult.created_at.desc()).limit(1))
    entities = session.scalars(select(EntityRow).where(EntityRow.document_id == document.id, EntityRow.model_version == version)
                               .order_by(EntityRow.start, EntityRow.end, EntityRow.label)) if version else []
    return DocumentEntities(document, version, list(entities))
