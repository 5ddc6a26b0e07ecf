"""The real server, run as users run it (``padellm-ner serve``, tiny model, SQLite), against slow
clients: a connection that never finishes its headers, or whose body stops short of its
Content-Length, is closed after the header or body timeout (with a 408 when no answer has begun),
and a client that keeps to them is answered."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.local_services import live_server

HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 2, 3
TEXT = "EU rejects German call to boycott British lamb ."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("slow-clients")
    env = {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "", "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis_url,
           "NER_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S), "NER_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S)}
    with live_server(env, folder / "serve.log", serve_args=[]) as url:
        yield url


def _connect(server: str) -> socket.socket:
    url = httpx.URL(server)
    connection = socket.create_connection((url.host, url.port))
    connection.settimeout(60)  # the test's own bound: the server must close well before it
    return connection


def _until_closed(connection: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and the seconds that took."""
    began, received = time.monotonic(), b""
    while chunk := connection.recv(65536):
        received += chunk
    return received, time.monotonic() - began


@pytest.mark.parametrize("sent", [b"", b"POST /v1/entities HTTP/1.1\r\nHost: x\r\nContent-Ty"], ids=["nothing", "half the headers"])
def test_a_connection_that_never_finishes_its_headers_is_closed(server: str, sent: bytes) -> None:
    with _connect(server) as connection:
        connection.sendall(sent)
        received, seconds = _until_closed(connection)
    assert received.startswith(b"HTTP/1.1 408"), received
    assert HEADER_TIMEOUT_S <= seconds + 0.5 < 60


def test_a_body_short_of_its_content_length_is_closed(server: str) -> None:
    body = b'{"text": "' + TEXT.encode() + b'"}'
    with _connect(server) as connection:
        connection.sendall(b"POST /v1/entities HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           + f"Content-Length: {len(body) + 100}\r\n\r\n".encode() + body)
        _, seconds = _until_closed(connection)
    assert BODY_TIMEOUT_S <= seconds + 0.5 < 60


def test_a_slowloris_after_a_first_request_is_closed_too(server: str) -> None:
    body = b'{"text": "' + TEXT.encode() + b'"}'
    request = b"POST /v1/entities HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    with _connect(server) as connection:
        connection.sendall(request)
        first = b""
        while b'"results"' not in first:
            first += connection.recv(65536)
        assert first.startswith(b"HTTP/1.1 200")
        connection.sendall(b"POST /v1/entities HTTP/1.1\r\nHo")  # the next request's headers, never finished
        received, seconds = _until_closed(connection)
    assert received.startswith(b"HTTP/1.1 408") and seconds < 60, received


def test_a_client_within_the_timeouts_is_answered(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as http:
        for _ in range(2):  # kept alive
            assert http.post("/v1/entities", json={"text": TEXT}).status_code == 200
