"""``padellm-ner ingest FILE`` and ``padellm-ner jobs run|status``: the pipeline without a
broker (SQLite by default; the schema is upgraded first)."""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.ingest import FORMATS


def _sessions():
    from pipeline.db import session_factory, upgrade

    upgrade()
    return session_factory()


def cmd_ingest(args: argparse.Namespace) -> int:
    from pipeline.crud import add_documents
    from pipeline.ingest import read_documents

    documents = read_documents(args.file, args.format, source=args.source, language=args.language)
    with _sessions().begin() as session:  # one transaction: a conflict stores nothing
        ids = add_documents(session, documents)
    print(f"ingested {len(ids)} documents from {args.file} (ids {min(ids)}..{max(ids)})" if ids else f"no documents in {args.file}")
    return 0


def cmd_jobs_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ner_service.settings import get_settings
    from pipeline.routing import configured_pool
    from pipeline.runner import run_pending

    settings = get_settings()
    sessions = _sessions()
    pool = configured_pool()
    pool.options(strategy=args.strategy)  # a strategy the model cannot run fails here, before any job is created
    pool.engine(pool.default)  # ... and so does a model that cannot load
    bar: tqdm | None = None

    def on_start(total: int) -> None:
        nonlocal bar
        bar = tqdm(total=total, unit="doc", desc="documents")

    def on_chunk(outcome) -> None:
        assert bar is not None
        bar.update(outcome.processed + outcome.failed)

    status = run_pending(sessions, pool, args.chunk_size or settings.pipeline_chunk_size, limit=args.limit,
                         reprocess=settings.reprocess_on_model_change, strategy=args.strategy, on_start=on_start, on_chunk=on_chunk)
    if bar is not None:
        bar.close()
    print(json.dumps(status, indent=2) if status else "no pending documents")
    return 0


def cmd_jobs_status(args: argparse.Namespace) -> int:
    from pipeline.crud import UnknownJobError, job_status, recent_jobs

    with _sessions()() as session:
        if args.job_id is not None:
            try:
                reference = int(args.job_id) if args.job_id.isdigit() else args.job_id
                print(json.dumps(job_status(session, reference), indent=2))
            except UnknownJobError as error:
                print(f"padellm-ner: error: {error}", file=sys.stderr)
                return 2
            return 0
        jobs = recent_jobs(session)
    if not jobs:
        print("no jobs")
    for job in jobs:
        print(f"{job['id']}  {job['status']:<9}  {job['processed']:>6} processed  {job['failed']:>5} failed  "
              f"of {job['total']:>6}  {job['model_version']}  {job['created_at']}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ingest`` and ``jobs`` to the ``padellm-ner`` command line."""
    ingest = subparsers.add_parser("ingest", help="store the documents of FILE (JSONL, plain text or CoNLL) for batch jobs")
    ingest.add_argument("file")
    ingest.add_argument("--source", default=None, help="source recorded with each document (default: the file name)")
    ingest.add_argument("--language", default=None)
    ingest.add_argument("--format", choices=FORMATS, default="auto")
    ingest.set_defaults(func=cmd_ingest)

    jobs = subparsers.add_parser("jobs", help="run or inspect batch jobs")
    actions = jobs.add_subparsers(dest="jobs_command", required=True)
    run = actions.add_parser("run", help="process pending documents in this process (no broker needed)")
    run.add_argument("--limit", type=int, default=None, help="at most N documents")
    run.add_argument("--chunk-size", type=int, default=None, help="documents per engine call (default: PIPELINE_CHUNK_SIZE)")
    run.add_argument("--strategy", "--decoder", dest="strategy", default="padellm",
                     help="how the model is asked: padellm, ar or fast_dllm (--decoder: its old name)")
    run.set_defaults(func=cmd_jobs_run)
    status = actions.add_parser("status", help="one job's status (JSON), or the latest jobs")
    status.add_argument("job_id", nargs="?", help="a job's id (as the API and the list show it) or row number")
    status.set_defaults(func=cmd_jobs_status)
