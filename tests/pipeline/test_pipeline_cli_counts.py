"""``padellm-ner jobs run`` with counts out of range: a usage error (exit 2, no traceback) before
any job exists, on SQLite and PostgreSQL, so that none is left 'running' with nothing to run it."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from padellm_ner.cli import main
from pipeline.db import session_factory
from pipeline.models import Job


@pytest.mark.parametrize("flag", ["--chunk-size", "--limit"])
@pytest.mark.parametrize("value", ["-3", "0", "-1", "99999999999999999999", "two"])
def test_a_count_out_of_range_is_a_usage_error_and_creates_no_job(migrated: str, tmp_path, capsys, flag: str, value: str) -> None:
    (tmp_path / "docs.txt").write_text("Angela Merkel visited Paris .\n\nReuters reports .\n")
    assert main(["ingest", str(tmp_path / "docs.txt")]) == 0
    with pytest.raises(SystemExit) as stopped:
        main(["jobs", "run", flag, value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err and ("out of range" in err or "not a whole number" in err), err
    with session_factory(migrated)() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_counts_in_range_run_the_job(migrated: str, tmp_path, capsys) -> None:
    (tmp_path / "docs.txt").write_text("Angela Merkel visited Paris .\n\nReuters reports .\n\nEU rejects German call .\n")
    assert main(["ingest", str(tmp_path / "docs.txt")]) == 0
    assert main(["jobs", "run", "--chunk-size", "1", "--limit", "2"]) == 0
    with session_factory(migrated)() as session:
        (job,) = session.scalars(select(Job))
        assert (job.status, job.total, job.processed) == ("completed", 2, 2)


def test_jobs_run_takes_the_decoder_and_flat_ner_and_stores_results_under_them(migrated: str, tmp_path) -> None:
    from pipeline.models import DocumentResult

    (tmp_path / "docs.txt").write_text("Angela Merkel visited Paris .\n")
    assert main(["ingest", str(tmp_path / "docs.txt")]) == 0
    assert main(["jobs", "run", "--strategy", "ar", "--decoder", "greedy", "--no-flat-ner"]) == 0
    with session_factory(migrated)() as session:
        (job,) = session.scalars(select(Job))
        assert (job.status, job.strategy, job.decoder, job.flat_ner) == ("completed", "ar", "greedy", False)
        versions = set(session.scalars(select(DocumentResult.model_version)))
    assert versions and all(v.endswith("+ar+greedy+overlapping") for v in versions), versions
