"""Throw-away local services for tests and benchmarks: a free loopback port, a private
redis-server (no persistence) that can be frozen, stopped and started again, the real API app
under uvicorn, and Celery workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateRedis:
    """A redis-server of our own on ``port`` (no persistence), its output appended to ``log``."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        import redis

        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"],
            stdout=self.log.open("a"), stderr=subprocess.STDOUT,
        )
        client = redis.Redis(port=self.port)
        try:
            for _ in range(200):
                try:
                    client.ping()
                    return
                except redis.exceptions.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        """Kill the server (everything it held is lost)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open and go unanswered, as with a hung Redis."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT; nothing if it has ended)."""
        if self.process:
            self.process.send_signal(signal.SIGCONT)


@dataclass
class LiveServer:
    """A running server: its base URL and its process (which a test may kill)."""

    url: str
    process: subprocess.Popen


@contextmanager
def live_server(env: dict[str, str], log: Path, ready_timeout_s: float = 300.0, serve_args: Sequence[str] | None = None) -> Iterator[str]:
    """Run ``padellm_ner.asgi:create_app`` with ``env`` added to the environment until ``/readyz``
    answers 200; yield its base URL; stop it. Its output goes to ``log`` (quoted when it fails to start).
    With ``serve_args``, the app runs as a user runs it: ``padellm-ner serve`` with these arguments."""
    with live_server_process(env, log, ready_timeout_s, serve_args) as server:
        yield server.url


@contextmanager
def live_server_process(env: dict[str, str], log: Path, ready_timeout_s: float = 300.0,
                        serve_args: Sequence[str] | None = None) -> Iterator[LiveServer]:
    """:func:`live_server`, yielding the process too."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "padellm_ner.asgi:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)]
    if serve_args is not None:
        command = [sys.executable, "-m", "padellm_ner.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *serve_args]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=os.environ | env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited:\n{log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server was not ready in time:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield LiveServer(url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # still answering requests in flight
            process.kill()
            process.wait(timeout=30)


class Workers:
    """Starts ``celery worker`` / ``beat`` subprocesses (each in its own process group) on the tiny
    model, with ``settings`` added to their environment, and kills them."""

    def __init__(self, database_url: str, redis_url: str, logs: Path, **settings: str) -> None:
        self.env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "NER_MODEL": "tiny-conll03",
                    "PIPELINE_CHUNK_SIZE": "4", **settings}
        self.logs, self.processes = logs, []

    def start(self, *args: str) -> subprocess.Popen:
        log = (self.logs / f"celery-{len(self.processes)}.log").open("w")
        process = subprocess.Popen([sys.executable, "-m", "celery", "-A", "pipeline.celery_app", *args, "--loglevel=INFO"],
                                   cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def worker(self, name: str) -> subprocess.Popen:
        return self.start("worker", "--pool=prefork", "--concurrency=1", "-n", f"{name}@%h", "--without-gossip", "--without-mingle")

    @property
    def beat_schedule(self) -> Path:
        """The file beat keeps its schedule in: the last run of each entry."""
        return self.logs / "beat-schedule"

    def beat(self) -> subprocess.Popen:
        return self.start("beat", "--schedule", str(self.beat_schedule))

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the main process and its pool child
            process.wait(timeout=30)

    def close(self) -> None:
        for process in self.processes:
            self.kill(process)

    def log_text(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.logs.glob("celery-*.log")))

    def tail(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.logs.glob("celery-*.log")))
