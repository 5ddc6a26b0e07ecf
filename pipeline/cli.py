"""``padellm-ner ingest FILE`` and ``padellm-ner jobs run|status|results``: the pipeline
without a broker (SQLite by default; the schema is upgraded first)."""

from __future__ import annotations

import argparse
import json
import sys


#: The largest count a flag takes: what a database integer holds.
MAX_COUNT = 2**31 - 1


def positive_int(value: str) -> int:
    """An argparse type: a whole number from 1 to :data:`MAX_COUNT` (0, negatives and overflows are usage errors)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if not 1 <= number <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{value} is out of range: from 1 to {MAX_COUNT}")
    return number


def _sessions():
    from pipeline.db import session_factory, upgrade

    upgrade()
    return session_factory()


def cmd_ingest(args: argparse.Namespace) -> int:
    """Print each document's id (the one the API's ``/documents/{id}`` routes take), one a line
    in the file's order, and the count on stderr."""
    from pipeline.crud import add_documents, public_ids_of
    from pipeline.ingest import read_documents

    documents = read_documents(args.file, args.format, source=args.source, language=args.language)
    with _sessions().begin() as session:  # one transaction: a conflict stores nothing
        ids = public_ids_of(session, add_documents(session, documents))
    for public_id in ids:
        print(public_id)
    print(f"ingested {len(ids)} documents from {args.file}", file=sys.stderr)
    return 0


def cmd_jobs_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ner_service.engine.labels import unfamiliar_note
    from ner_service.settings import get_settings
    from pipeline.routing import configured_pool
    from pipeline.runner import run_pending

    settings = get_settings()
    sessions = _sessions()
    pool = configured_pool()
    labels = [label.strip() for label in args.labels.split(",") if label.strip()] if args.labels else None
    options = pool.options(labels=labels, strategy=args.strategy, decoder=args.decoder, flat_ner=args.flat_ner)  # options the model cannot run fail here, before any job is created
    unfamiliar = options.unfamiliar_labels(pool.config(pool.default))
    if unfamiliar:
        print(f"padellm-ner: {unfamiliar_note(pool.default, unfamiliar)}", file=sys.stderr)
    pool.engine(pool.default)  # ... and so does a model that cannot load
    bar: tqdm | None = None

    def on_start(total: int) -> None:
        nonlocal bar
        bar = tqdm(total=total, unit="doc", desc="documents")

    def on_chunk(outcome) -> None:
        assert bar is not None
        bar.update(outcome.processed + outcome.failed)

    status = run_pending(sessions, pool, args.chunk_size or settings.pipeline_chunk_size, limit=args.limit,
                         reprocess=settings.reprocess_on_model_change, strategy=args.strategy, decoder=args.decoder, labels=labels,
                         flat_ner=args.flat_ner,
                         on_start=on_start, on_chunk=on_chunk)
    if bar is not None:
        bar.close()
    print(json.dumps(status, indent=2) if status else "no pending documents")
    return 0


def _job_reference(job_id: str) -> int | str:
    """A job's row number (digits) or its id, as ``jobs status`` lists them."""
    return int(job_id) if job_id.isdigit() else job_id


def _unknown_job(error: LookupError) -> int:
    print(f"padellm-ner: error: {error}", file=sys.stderr)
    return 2


def cmd_jobs_status(args: argparse.Namespace) -> int:
    from pipeline.crud import UnknownJobError, find_job, recent_jobs
    from pipeline.schemas import JobOut

    with _sessions()() as session:
        if args.job_id is not None:
            try:
                print(json.dumps(JobOut.of(find_job(session, _job_reference(args.job_id))).model_dump(mode="json"), indent=2))
            except UnknownJobError as error:
                return _unknown_job(error)
            return 0
        jobs = [JobOut.of(job).model_dump(mode="json") for job in recent_jobs(session)]
    if not jobs:
        print("no jobs")
    for job in jobs:
        print(f"{job['id']}  {job['status']:<9}  {job['processed']:>6} processed  {job['failed']:>5} failed  "
              f"of {job['total']:>6}  {job['model_version']}  {job['created_at']}")
    return 0


def cmd_jobs_results(args: argparse.Namespace) -> int:
    """One JSON line per document of the job: its id, external id, status and entities (the
    shape of the API's ``GET /v1/documents/{id}/entities``)."""
    from pipeline.crud import UnknownJobError, job_results
    from pipeline.schemas import DocumentEntitiesOut

    with _sessions()() as session:
        try:
            results = [DocumentEntitiesOut.of(found).model_dump(mode="json") for found in job_results(session, _job_reference(args.job_id))]
        except UnknownJobError as error:
            return _unknown_job(error)
    for result in results:
        print(json.dumps(result, ensure_ascii=False))
    return 0


def _ingest_options(ingest: argparse.ArgumentParser) -> None:
    from pipeline.ingest import FORMATS  # pipeline.ingest loads the schemas (and torch): only for ingest itself

    ingest.add_argument("file")
    ingest.add_argument("--source", default=None, help="source recorded with each document (default: the file name)")
    ingest.add_argument("--language", default=None)
    ingest.add_argument("--format", choices=FORMATS, default="auto")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``ingest`` and ``jobs`` to the ``padellm-ner`` command line."""
    from ner_service.engine.defaults import DEFAULT_STRATEGY  # torch-free

    ingest = subparsers.add_parser("ingest", help="store the documents of FILE (JSONL, plain text or CoNLL) for batch jobs; "
                                                  "prints each document's id, one a line", options=_ingest_options)
    ingest.set_defaults(func=cmd_ingest)

    jobs = subparsers.add_parser("jobs", help="run or inspect batch jobs")
    actions = jobs.add_subparsers(dest="jobs_command", required=True)
    run = actions.add_parser("run", help="process pending documents in this process (no broker needed)")
    run.add_argument("--limit", type=positive_int, default=None, help=f"at most N documents (1 to {MAX_COUNT})")
    run.add_argument("--chunk-size", type=positive_int, default=None, help="documents per engine call (default: PIPELINE_CHUNK_SIZE)")
    run.add_argument("--strategy", default=DEFAULT_STRATEGY, help="how the model is asked: padellm (the default), ar or fast_dllm")
    run.add_argument("--decoder", default=None, help="how the answers' tokens are produced (default: copy), as in extract and the API")
    run.add_argument("--labels", default=None, help="comma-separated labels to find (default: the model's); an open-label model takes any names")
    run.add_argument("--flat-ner", action=argparse.BooleanOptionalAction, default=True,
                     help="entities never overlap (default); --no-flat-ner keeps every label's, as in extract and the API")
    run.set_defaults(func=cmd_jobs_run)
    status = actions.add_parser("status", help="one job's status (JSON), or the latest jobs")
    status.add_argument("job_id", nargs="?", help="a job's id (as the API and the list show it) or row number")
    status.set_defaults(func=cmd_jobs_status)
    results = actions.add_parser("results", help="the entities of each document of a job, one JSON line per document")
    results.add_argument("job_id", help="a job's id (as the API and the list show it) or row number")
    results.set_defaults(func=cmd_jobs_results)
