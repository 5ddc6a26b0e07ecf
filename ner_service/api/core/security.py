"""API keys and a per-caller token-bucket rate limit."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import threading
import time
from dataclasses import dataclass

from fastapi import HTTPException, Request, status

from ner_service.api.core.proxies import TrustedProxies

logger = logging.getLogger(__name__)


def key_id(caller: str) -> str | None:
    """The id of the API key a caller presented (``key:<digest prefix>``, never the key), or None
    in development mode."""
    return caller if caller.startswith("key:") else None


class ApiKeys:
    """The configured API keys; with none, the API runs in an (explicit, logged) development mode."""

    def __init__(self, keys_csv: str) -> None:
        self._keys = [key.strip().encode() for key in keys_csv.split(",") if key.strip()]
        if not self._keys:
            logger.warning("NER_API_KEYS is empty: development mode, requests are not authenticated (rate limit per client IP)")

    @property
    def dev_mode(self) -> bool:
        return not self._keys

    def caller(self, request: Request, address: str) -> str:
        """Who is calling: ``key:<digest prefix>`` for a valid key, ``ip:<address>`` in development mode.

        Raises 401 for a missing or wrong key; keys are compared in constant time."""
        if self.dev_mode:
            return f"ip:{address}"
        presented = _presented_key(request)
        if presented is None:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing API key: send it in X-API-Key or Authorization: Bearer",
                                headers={"WWW-Authenticate": "Bearer"})
        candidate = presented.encode("utf-8", "surrogateescape")
        matched = False
        for key in self._keys:  # no early exit: the time does not tell which key matched
            matched |= hmac.compare_digest(candidate, key)
        if not matched:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid API key", headers={"WWW-Authenticate": "Bearer"})
        return "key:" + hashlib.sha256(candidate).hexdigest()[:16]


def _presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per caller: ``per_minute`` units of burst, refilled at ``per_minute / 60`` per
    second (a unit: a request, a text, a failed authentication)."""

    #: Callers held before full buckets are dropped (a full bucket is the same as none, so the
    #: memory stays bounded by who is being limited, not by every address ever seen).
    PRUNE_AT = 10_000

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def _prune(self, now: float) -> None:
        self._buckets = {caller: bucket for caller, bucket in self._buckets.items()
                         if bucket.tokens + (now - bucket.updated) * self.rate < self.capacity}

    def retry_after(self, caller: str, cost: float = 1.0) -> int:
        """Take ``cost`` units for ``caller``: 0 when they are there, else the seconds until they
        will be (nothing is taken then)."""
        now = time.monotonic()
        cost = min(cost, self.capacity) if self.capacity else cost
        with self._lock:
            if len(self._buckets) >= self.PRUNE_AT and caller not in self._buckets:
                self._prune(now)
            bucket = self._buckets.setdefault(caller, _Bucket(self.capacity, now))
            bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return 0
            return max(1, math.ceil((cost - bucket.tokens) / self.rate)) if self.rate > 0 else 60


def too_many(wait: int, what: str) -> HTTPException:
    """The 429 of a rate limit, with its ``Retry-After``."""
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, f"{what}: retry in {wait} s", headers={"Retry-After": str(wait)})


class Guard:
    """What the protected routes run first: authenticate, then rate-limit the caller (one unit a
    request; the entities route charges the rest of its texts with :meth:`charge`).

    A wrong or missing key costs its client address one unit of ``failures``; with none left it
    is answered 429 instead of 401. The key is checked first, so a right key always passes: the
    throttle is per address and one address may be shared by many tenants (a NAT, a proxy not
    in ``proxies``). The address is the peer's, or the one a trusted proxy forwarded."""

    def __init__(self, keys: ApiKeys, limiter: RateLimiter, failures: RateLimiter, proxies: TrustedProxies) -> None:
        self.keys = keys
        self.limiter = limiter
        self.failures = failures
        self.proxies = proxies

    def __call__(self, request: Request) -> str:
        address = self.proxies.client_address(request)
        try:
            caller = self.keys.caller(request, address)
        except HTTPException:
            wait = self.failures.retry_after(address)
            if wait:
                raise too_many(wait, "too many failed authentications from this address") from None
            raise
        wait = self.limiter.retry_after(caller)
        if wait:
            raise too_many(wait, "rate limit exceeded")
        return caller

    def charge(self, caller: str, units: int) -> None:
        """Take ``units`` more of ``caller``'s rate limit (a request's texts beyond the first)."""
        if units > 0:
            wait = self.limiter.retry_after(caller, units)
            if wait:
                raise too_many(wait, f"rate limit exceeded ({units + 1} texts; NER_RATE_LIMIT_PER_MINUTE counts texts)")
