"""The real server (``padellm-ner serve``, tiny model, SQLite, a private Redis) under a hostile
network: proxy headers believed only from trusted proxies, keys checked before bodies are read,
error bodies that stay small, and a request id on every answer and in the one log line of each
event, a crash's included."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.local_services import live_server

ALPHA = {"X-API-Key": "alpha-key"}
TEXT = "EU rejects German call to boycott British lamb ."


def _env(folder: Path, redis_url: str, **overrides: str) -> dict[str, str]:
    return {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "alpha-key,beta-key", "NER_RATE_LIMIT_PER_MINUTE": "100000",
            "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis_url, **overrides}


@dataclass
class Served:
    """A server run as users run it, and the file its output goes to."""

    url: str
    folder: Path
    log: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Served]:
    """``padellm-ner serve`` with room for many failed authentications (those of the throttle
    are tested on servers of their own)."""
    folder = tmp_path_factory.mktemp("network")
    log = folder / "serve.log"
    with live_server(_env(folder, redis_url, NER_AUTH_FAILURES_PER_MINUTE="100000"), log, serve_args=[]) as url:
        yield Served(url, folder, log)


def _codes(http: httpx.Client, forwarded_for: list[str], key: str = "wrong-key") -> list[int]:
    return [http.get("/v1/models", headers={"X-API-Key": key, "X-Forwarded-For": hop}).status_code for hop in forwarded_for]


def test_a_client_rotating_x_forwarded_for_is_throttled_all_the_same(tmp_path: Path, redis_url: str) -> None:
    env = _env(tmp_path, redis_url, NER_AUTH_FAILURES_PER_MINUTE="3")
    with live_server(env, tmp_path / "serve.log", serve_args=[]) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert _codes(http, [f"198.51.100.{i}" for i in range(5)]) == [401, 401, 401, 429, 429]
        assert http.get("/v1/models", headers=ALPHA).status_code == 200  # a right key from the same address passes


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_throttle(tmp_path: Path, redis_url: str) -> None:
    """The test plays a proxy at 127.0.0.1 that appends the address it saw to X-Forwarded-For."""
    env = _env(tmp_path, redis_url, NER_AUTH_FAILURES_PER_MINUTE="3", NER_TRUSTED_PROXIES="10.0.0.0/8, 127.0.0.1")
    with live_server(env, tmp_path / "serve.log", serve_args=[]) as url, httpx.Client(base_url=url, timeout=30) as http:
        # what the client wrote left of the proxy's entry (and entries of other trusted proxies) changes nothing
        guesses = [f"198.51.100.{i}, 203.0.113.7, 10.1.2.3" for i in range(4)]
        assert _codes(http, guesses) == [401, 401, 401, 429]
        assert _codes(http, ["203.0.113.8", "2001:db8::1"]) == [401, 401]  # other clients behind the same proxy
        assert _codes(http, ["203.0.113.7"], key="alpha-key") == [200]  # a right key always passes


def _partial_post(url: str, path: str, headers: dict[str, str], declared: int, sent: bytes) -> bytes:
    """The head of the answer to a POST that declares ``declared`` bytes of body and sends only
    ``sent``: a server that waits for the rest answers nothing, and this raises a timeout."""
    address = httpx.URL(url)
    head = [f"POST {path} HTTP/1.1", f"Host: {address.host}:{address.port}", "Content-Type: application/json",
            f"Content-Length: {declared}", *(f"{name}: {value}" for name, value in headers.items())]
    with socket.create_connection((address.host, address.port), timeout=60) as connection:
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + sent)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := connection.recv(65536)):
            answer += chunk
    return answer.partition(b"\r\n\r\n")[0]


@pytest.mark.parametrize("path", ["/v1/entities", "/v1/jobs"])
def test_a_request_without_a_valid_key_is_refused_before_its_body_is_read(served: Served, path: str) -> None:
    for headers in ({}, {"X-API-Key": "wrong-key"}):
        head = _partial_post(served.url, path, headers, declared=7_000_000, sent=b'{"text": "')
        assert head.startswith(b"HTTP/1.1 401 "), head
    with httpx.Client(base_url=served.url, timeout=60) as http:
        malformed = {"Content-Type": "application/json"}
        assert http.post(path, content=b"{not json", headers=malformed).status_code == 401  # not a 400: never parsed
        assert http.post(path, content=b"{not json", headers=malformed | ALPHA).status_code == 400  # parsed once the key is known: not JSON


def test_error_bodies_stay_small_whatever_the_request_held(served: Served) -> None:
    unknown = [str(uuid.uuid4()) for _ in range(10_000)]
    with httpx.Client(base_url=served.url, timeout=60) as http:
        missing = http.post("/v1/jobs", headers=ALPHA, json={"document_ids": unknown})
        assert missing.status_code == 404 and len(missing.content) < 2_000, len(missing.content)
        detail = missing.json()["detail"]
        assert detail["missing_count"] == 10_000 and detail["missing"] == unknown[:10]
        assert detail["message"].startswith(f"10000 unknown document ids: {unknown[0]}, ") and "and 9990 more" in detail["message"]
        many = http.post("/v1/entities", headers=ALPHA, json={"texts": [1] * 5_000})
        assert many.status_code == 422 and len(many.content) < 3_000, len(many.content)
        assert many.json()["detail"][-1] == {"loc": [], "msg": "and 4990 more errors", "type": "more_errors"}
        long_key = http.post("/v1/entities", headers=ALPHA, json={"text": TEXT, "k" * 100_000: 1})
        assert long_key.status_code == 422 and len(long_key.content) < 1_000 and "extra" in long_key.text


def test_every_answer_carries_its_request_id(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=60) as http:
        for method, path, headers in (("GET", "/healthz", {}), ("GET", "/v1/models", {}), ("GET", "/no-such-page", {}),
                                      ("POST", "/v1/entities", ALPHA)):
            answer = http.request(method, path, headers=headers | {"X-Request-ID": "client-id.1:a_b"}, json={"text": 1})
            assert answer.headers["X-Request-ID"] == "client-id.1:a_b", (path, answer.status_code)
        for unsound in ("x" * 129, "two words", "a/b"):
            generated = http.get("/healthz", headers={"X-Request-ID": unsound}).headers["X-Request-ID"]
            assert generated != unsound and len(generated) == 32
    # refused before routing (a body over the limit): the id all the same
    head = _partial_post(served.url, "/v1/entities", ALPHA | {"X-Request-ID": "too-big"}, declared=10**9, sent=b"{")
    assert head.startswith(b"HTTP/1.1 413 ") and b"x-request-id: too-big" in head.lower(), head


def _records(log: Path, request_id: str, timeout_s: float = 60.0) -> list[dict]:
    """The log records of ``request_id``, once its access line (the last one) is written."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for line in log.read_text(errors="replace").splitlines() if request_id in line]
        if any('"ner_service.api.access"' in line for line in lines):
            return [json.loads(line) for line in lines]
        assert time.monotonic() < deadline, f"no access line for {request_id}"
        time.sleep(0.05)


def test_a_crash_is_answered_with_its_request_id_and_logged_once(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=60) as http:
        job = http.post("/v1/jobs", headers=ALPHA, json={"documents": [{"text": TEXT}]}).json()["job_id"]
        with sqlite3.connect(served.folder / "pipeline.db") as database:  # a row the code cannot read: a bug's 500
            database.execute("UPDATE jobs SET created_at = 'not a time' WHERE public_id = ?", (job,))
        crash = http.get(f"/v1/jobs/{job}", headers=ALPHA | {"X-Request-ID": "crash-1"})
    assert crash.status_code == 500 and crash.headers["X-Request-ID"] == "crash-1"
    assert crash.json()["detail"] == "internal error; see the server log for request id crash-1"
    error, access = _records(served.log, "crash-1")  # every line of the request is one JSON record with its id
    assert error["level"] == "ERROR" and error["message"] == "unhandled error" and "not a time" in error["exception"]
    assert access["status"] == 500 and {error["request_id"], access["request_id"]} == {"crash-1"}
    text = served.log.read_text(errors="replace")
    assert text.count("Traceback (most recent call last)") == 1 and "Exception in ASGI application" not in text
    assert text.count("API started") == 1  # not once plain and once JSON
