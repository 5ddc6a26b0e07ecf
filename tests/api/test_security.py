"""API keys (header or bearer, constant-time comparison), development mode, the per-caller rate limit, the
trusted-proxy setting and the rule that every mounted route authenticates before it reads a body."""

from __future__ import annotations

import pytest
from fastapi import APIRouter

from ner_service.api.app import create_app
from ner_service.api.core.security import RateLimiter
from tests.api.conftest import tiny_settings


@pytest.fixture
def keyed(make_client):
    return make_client(ner_api_keys="alpha-key, beta-key", ner_rate_limit_per_minute=1000)


@pytest.mark.parametrize("path", ["/v1/models", "/v1/jobs/1"])
def test_a_missing_key_is_401(keyed, path: str) -> None:
    response = keyed.get(path)
    assert response.status_code == 401
    assert "missing API key" in response.json()["detail"]
    assert response.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("headers", [{"X-API-Key": "alpha-keyx"}, {"Authorization": "Bearer nope"}, {"X-API-Key": "é".encode("latin-1")}])
def test_a_wrong_key_is_401(keyed, headers: dict) -> None:
    response = keyed.post("/v1/entities", json={"text": "a"}, headers=headers)
    assert response.status_code == 401 and response.json()["detail"] == "invalid API key"


@pytest.mark.parametrize("headers", [{"X-API-Key": "alpha-key"}, {"Authorization": "Bearer beta-key"}, {"authorization": "bearer alpha-key"}])
def test_a_valid_key_passes(keyed, headers: dict) -> None:
    assert keyed.get("/v1/models", headers=headers).status_code == 200
    assert keyed.post("/v1/entities", json={"text": "Peter Blackburn"}, headers=headers).status_code == 200


def test_probes_metrics_and_page_need_no_key(keyed) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/", "/docs", "/openapi.json"):
        assert keyed.get(path).status_code == 200, path


def test_rate_limit_per_key(make_client) -> None:
    client = make_client(ner_api_keys="alpha-key,beta-key", ner_rate_limit_per_minute=2)
    alpha, beta = {"X-API-Key": "alpha-key"}, {"X-API-Key": "beta-key"}
    assert [client.get("/v1/models", headers=alpha).status_code for _ in range(2)] == [200, 200]
    limited = client.get("/v1/models", headers=alpha)
    assert limited.status_code == 429
    assert int(limited.headers["Retry-After"]) >= 1 and "rate limit" in limited.json()["detail"]
    assert client.get("/v1/models", headers=beta).status_code == 200  # another key has its own bucket


def test_development_mode_limits_per_client_ip(make_client) -> None:
    client = make_client(ner_api_keys="", ner_rate_limit_per_minute=1)
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"X-API-Key": "anything"}).status_code == 429


def test_a_malformed_trusted_proxy_is_refused_at_start(app_factory) -> None:
    with pytest.raises(ValueError, match="not-an-ip"):
        app_factory(ner_trusted_proxies="10.0.0.0/8, not-an-ip")


def test_a_mounted_router_must_authenticate_before_reading_bodies() -> None:
    open_router = APIRouter(prefix="/v1")
    open_router.add_api_route("/open", lambda: {}, methods=["GET"])
    with pytest.raises(TypeError, match="/v1/open"):
        create_app(tiny_settings(), routers=[open_router])


def test_the_limiter_forgets_full_buckets_but_not_drained_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("ner_service.api.core.security.time.monotonic", lambda: now[0])
    limiter = RateLimiter(60)
    limiter.PRUNE_AT = 100
    assert limiter.retry_after("drained", cost=60) == 0
    for address in range(99):
        assert limiter.retry_after(f"10.0.0.{address}") == 0
    assert len(limiter) == 100
    now[0] = 10.0  # every one-unit bucket has refilled; the drained one holds 10 of 60
    assert limiter.retry_after("another") == 0
    assert len(limiter) == 2  # the drained caller and the new one
    assert limiter.retry_after("drained", cost=20) == 10  # its debt was kept: 10 more units take 10 s
