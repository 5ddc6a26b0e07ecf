"""``padellm-ner ingest`` of JSONL, plain text and CoNLL files (malformed files fail with file,
line and reason and store nothing) and ``padellm-ner jobs run|status|results`` on SQLite with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import func, select

from padellm_ner.cli import main
from ner_service.engine import Entity
from ner_service.settings import get_settings
from pipeline import crud
from pipeline.db import session_factory
from pipeline.models import LOCAL_OWNER, Document, Job

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


@pytest.fixture
def database(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``DATABASE_URL`` of the CLI: a SQLite file that does not exist yet."""
    monkeypatch.setenv("DATABASE_URL", sqlite_url)
    get_settings.cache_clear()
    return sqlite_url


def _documents(url: str) -> list[Document]:
    with session_factory(url)() as session:
        return list(session.scalars(select(Document).order_by(Document.id)))


def _write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_ingest_reads_jsonl_text_and_conll(database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jsonl = _write(tmp_path, "docs.jsonl", '{"text": "Angela Merkel visited Paris .", "external_id": "a-1", "language": "en"}\n\n'
                                           '{"text": "Reuters reports .", "source": "wire"}\n')
    text = _write(tmp_path, "lines.txt", "First document .\n\nSecond document .\n")
    conll = _write(tmp_path, "dev.conll", CONLL)
    printed = []
    for path in (jsonl, text, conll):
        assert main(["ingest", str(path)]) == 0
        out, err = capsys.readouterr()
        assert err == f"ingested 2 documents from {path}\n"
        printed += out.splitlines()
    assert printed == [d.public_id for d in _documents(database)]  # the ids the API's /documents routes take, in file order
    stored = [(d.text, d.external_id, d.language, d.source, d.status) for d in _documents(database)]
    assert stored == [
        ("Angela Merkel visited Paris .", "a-1", "en", "docs.jsonl", "pending"),
        ("Reuters reports .", None, None, "wire", "pending"),
        ("First document .", None, None, "lines.txt", "pending"),
        ("Second document .", None, None, "lines.txt", "pending"),
        ("EU rejects\nPeter Blackburn", None, None, "dev.conll", "pending"),  # sentences of a -DOCSTART- document
        ("BRUSSELS", None, None, "dev.conll", "pending"),
    ]
    assert main(["ingest", str(jsonl)]) == 0  # the same external id with the same text is reused
    assert len(_documents(database)) == 7
    assert capsys.readouterr().out.splitlines()[0] == printed[0]


@pytest.mark.parametrize(("name", "content", "line", "reason"), [
    ("broken.jsonl", '{"text": "fine"}\n{"text": "fine too"\n', 2, "broken JSON"),
    ("no_text.jsonl", '{"text": "fine"}\n\n{"body": "x"}\n', 3, 'expected an object with a string "text"'),
    ("twice.jsonl", '{"text": "a", "external_id": "x"}\n{"text": "b", "external_id": "x"}\n', 2, "external_id 'x' already used on line 1"),
    ("latin1.txt", b"fine\nna\xefve\n", 2, "invalid UTF-8 byte 0xef"),
    ("missing_tag.conll", "EU B-ORG\nrejects O\n\nPeter\n", 4, "expected a token and a tag"),
    ("bad_tag.conll", "EU B-ORG\nrejects X-ORG\n", 2, "impossible tag 'X-ORG'"),
    ("surrogate.jsonl", '{"text": "fine"}\n{"text": "a\\ud800b"}\n', 2, "unpaired surrogate at character 1"),
    ("empty.jsonl", '{"text": "fine"}\n{"text": "  "}\n', 2, "empty text"),
    ("long.jsonl", '{"text": "fine"}\n\n{"text": "%s"}\n' % ("x" * 20_001), 3, "more than NER_MAX_TEXT_CHARS=20000"),
    ("long.txt", "fine\n" + "y" * 20_001 + "\n", 2, "more than NER_MAX_TEXT_CHARS=20000"),
    ("long.conll", "-DOCSTART- O\n\nEU B-ORG\n\n-DOCSTART- O\n\n" + "word O\n" * 4_500, 5, "more than NER_MAX_TEXT_CHARS=20000"),
])
def test_malformed_files_name_file_line_and_reason_and_store_nothing(
        database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, content: str | bytes, line: int, reason: str) -> None:
    assert main(["ingest", str(_write(tmp_path, "good.txt", "Already here .\n"))]) == 0
    path = _write(tmp_path, name, content)
    assert main(["ingest", str(path)]) == 2
    error = capsys.readouterr().err
    assert f"padellm-ner: error: {path}:{line}: " in error and reason in error
    assert [d.text for d in _documents(database)] == ["Already here ."]


def test_external_id_conflict_with_the_database_stores_nothing_of_the_file(database: str, tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(_write(tmp_path, "first.jsonl", '{"text": "one", "external_id": "x"}\n'))]) == 0
    second = _write(tmp_path, "second.jsonl", '{"text": "new document"}\n{"text": "other text", "external_id": "x"}\n')
    assert main(["ingest", str(second)]) == 2
    assert "external_id 'x' already names a document with another text" in capsys.readouterr().err
    assert [d.text for d in _documents(database)] == ["one"]


def test_a_missing_or_empty_file_writes_no_database(database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(tmp_path / "absent.jsonl")]) == 2
    assert main(["ingest", str(_write(tmp_path, "empty.txt", "\n \n"))]) == 2
    assert "absent.jsonl: no such file" in capsys.readouterr().err
    assert not Path(database.removeprefix("sqlite:///")).exists()


def test_jobs_run_shows_progress_and_jobs_status_reports_it(database: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", str(_write(tmp_path, "docs.txt", "EU rejects German call .\nPeter Blackburn .\n\nBRUSSELS 1996-08-22\n"))]) == 0
    capsys.readouterr()
    assert main(["jobs", "run", "--chunk-size", "2"]) == 0
    run = capsys.readouterr()
    assert "documents: 100%" in run.err and "3/3" in run.err  # the progress bar
    status = json.loads(run.out)
    assert (status["status"], status["processed"], status["failed"], status["total"]) == ("completed", 3, 0, 3)

    assert main(["jobs", "status"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert line.split()[:8] == [status["id"], "completed", "3", "processed", "0", "failed", "of", "3"]
    for reference in ("1", status["id"]):  # the row number or the id
        assert main(["jobs", "status", reference]) == 0
        assert json.loads(capsys.readouterr().out) == status
    assert main(["jobs", "status", "7"]) == 2
    assert "no job 7" in capsys.readouterr().err
    for reference in ("1", status["id"]):
        assert main(["jobs", "results", reference]) == 0
        results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [(r["document_id"], r["status"], r["model_version"]) for r in results] == [
            (d.public_id, "processed", status["model_version"]) for d in _documents(database)]
    for unknown in ("7", "no-such-job"):
        assert main(["jobs", "results", unknown]) == 2
        error = capsys.readouterr().err
        assert error == f"padellm-ner: error: no job {unknown}\n"
    assert main(["jobs", "run"]) == 0
    assert capsys.readouterr().out.strip() == "no pending documents"
    with session_factory(database)() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1
        assert set(session.scalars(select(Document.status))) == {"processed"}


def test_jobs_results_prints_each_documents_entities_of_that_job(database: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The entities the job's model version found, a failed document with its error and none, and
    not the entities another version found for the same document."""
    texts = "Angela Merkel visited Paris .\nNothing here .\nBOOM\n"
    assert main(["ingest", str(_write(tmp_path, "docs.txt", texts))]) == 0
    ids = capsys.readouterr().out.split()
    with session_factory(database).begin() as session:
        merkel, nothing, boom = crud.owned_document_ids(session, LOCAL_OWNER, ids)
        old = crud.create_job(session, [merkel], "v1")
        crud.record_result(session, old.id, merkel, "v1", [Entity(0, 13, "Angela Merkel", "PER", 0.5)])
        job = crud.create_job(session, [merkel, nothing, boom], "v2")
        crud.record_result(session, job.id, merkel, "v2", [Entity(0, 13, "Angela Merkel", "PER", 0.9), Entity(22, 27, "Paris", "LOC", 0.8)])
        crud.record_result(session, job.id, nothing, "v2", [])
        crud.record_failure(session, job.id, boom, "model error")
        job_id = job.public_id
    assert main(["jobs", "results", job_id]) == 0
    results = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert results == [
        {"document_id": ids[0], "external_id": None, "status": "processed", "error": None, "model_version": "v2", "entities": [
            {"start": 0, "end": 13, "label": "PER", "text": "Angela Merkel", "score": 0.9},
            {"start": 22, "end": 27, "label": "LOC", "text": "Paris", "score": 0.8}]},
        {"document_id": ids[1], "external_id": None, "status": "processed", "error": None, "model_version": "v2", "entities": []},
        {"document_id": ids[2], "external_id": None, "status": "failed", "error": "model error", "model_version": "v2", "entities": []},
    ]
