"""``/metrics`` of the real server (uvicorn, tiny model, a private Redis) stays bounded whatever
methods and paths clients make up: every label takes values from a bounded set."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.local_services import PrivateRedis, free_port, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder: Path = tmp_path_factory.mktemp("metrics")
    redis = PrivateRedis(free_port(), folder / "redis.log")
    redis.start()
    env = {"NER_MODEL": "tiny-conll03", "NER_API_KEYS": "", "NER_RATE_LIMIT_PER_MINUTE": "100000",
           "DATABASE_URL": f"sqlite:///{folder / 'pipeline.db'}", "REDIS_URL": redis.url}
    try:
        with live_server(env, folder / "uvicorn.log") as url:
            yield url
    finally:
        redis.stop()


def _series(exposition: str) -> set[str]:
    """The samples' names with their labels (what a scraper stores a series for), values left out."""
    return {line.rsplit(" ", 1)[0] for line in exposition.splitlines() if line and not line.startswith("#")}


def _made_up_requests(http: httpx.Client, count: int) -> list[str]:
    """``count`` rounds of requests with made-up methods, paths and queries; the made-up words."""
    words = []
    for _ in range(count):
        word = uuid.uuid4().hex[:12]
        words.append(word)
        assert http.request(f"X{word}", f"/made-up/{word}").status_code == 404
        assert http.request(f"X{word}", "/v1/entities").status_code == 405  # a real route, a made-up method
        assert http.get(f"/v1/{word}", params={word: word}).status_code == 404
        assert http.request("PROPFIND", f"/{word}/").status_code == 404
    return words


def test_made_up_methods_and_paths_leave_metrics_bounded(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as http:
        assert http.post("/v1/entities", json={"text": "EU rejects German call ."}).status_code == 200
        _made_up_requests(http, 10)
        http.get("/metrics")  # counted by the next one
        before = http.get("/metrics").text
        words = _made_up_requests(http, 250)
        after = http.get("/metrics").text
    assert _series(after) == _series(before)  # 1,000 more requests, not one series more
    assert len(after) < len(before) + 1_000  # only counts and sums grew (by a few digits)
    assert not [word for word in words if word in after]
    requests = {line for line in _series(after) if line.startswith("padellm_http_requests_total{")}
    for labels in ('method="other",route="unmatched",status="404"', 'method="other",route="/v1/entities",status="405"',
                   'method="POST",route="/v1/entities",status="200"', 'method="GET",route="unmatched",status="404"'):
        assert f"padellm_http_requests_total{{{labels}}}" in requests, sorted(requests)
    methods = {match for line in requests for match in re.findall(r'method="([^"]*)"', line)}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
