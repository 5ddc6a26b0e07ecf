"""The real app under uvicorn in a subprocess on a free loopback port, for tests that need a real server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.conftest import REPO


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def live_server(env: dict[str, str], log: Path, ready_timeout_s: float = 300.0) -> Iterator[str]:
    """Run ``ner_service.api.app:create_app`` with ``env`` added to the environment until ``/readyz``
    answers 200; yield its base URL; stop it. Its output goes to ``log`` (quoted when it fails to start)."""
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "ner_service.api.app:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=REPO, env=os.environ | env, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            assert process.poll() is None, f"the server exited:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"the server was not ready in time:\n{log.read_text()[-4000:]}"
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
