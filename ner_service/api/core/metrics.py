"""Prometheus metrics: requests by route and status, latency, engine batch sizes and tokens per forward pass.

Every label takes a bounded set of values, whatever clients send: a route template (one value
for every path no route matches), a standard method or ``other``, a known status code or its
class; otherwise made-up methods or paths would grow ``/metrics`` (and the scraper's storage)
without bound.
"""

from __future__ import annotations

import time
from http import HTTPStatus

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from ner_service.api.core.responses import ResponseWatch

from ner_service.engine import Extraction

UNMATCHED_ROUTE = "unmatched"
#: The methods counted by name; any other is counted as ``other``.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"
#: The status codes counted by number (499: the client went away); any other by its class (``5xx``).
STATUSES = frozenset(code.value for code in HTTPStatus) | {499}


class Metrics:
    """The app's metrics, in a registry of its own (so that several apps can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "padellm_http_requests_total", "HTTP requests by route, method and status", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "padellm_http_request_duration_seconds", "HTTP request latency by route", ["route"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.batch_texts = Histogram(
            "padellm_engine_batch_texts", "Texts per engine.extract call", registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128)
        )
        self.tokens_per_forward = Histogram(
            "padellm_engine_tokens_per_forward", "Generated tokens per forward pass in one engine.extract call",
            registry=self.registry, buckets=(0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.queue_texts = Gauge("padellm_queue_texts", "Texts waiting in or being processed by the micro-batcher", registry=self.registry)
        self.seconds_per_token = Gauge("padellm_engine_seconds_per_token",
                                       "Engine seconds per token of work that admission assumes (measured; the prior until "
                                       "a call is measured; or NER_FIXED_MS_PER_TOKEN)", registry=self.registry)
        self.model_weights_bytes = Gauge("padellm_model_weights_bytes", "Bytes of the model weights loaded (shared bases "
                                         "counted once; NER_MODEL_MEMORY_MB bounds it)", registry=self.registry)
        self.shed = Counter("padellm_requests_shed_total", "Requests refused with 429 because their work would not be done "
                            "within the timeout now", registry=self.registry)

    def observe_batch(self, texts: int, results: list[Extraction]) -> None:
        """Record one ``engine.extract`` call of ``texts`` texts (its internal batches share a stats object)."""
        self.batch_texts.observe(texts)
        batches = {id(result.stats): result.stats for result in results}
        for stats in batches.values():
            if stats.forward_passes:
                self.tokens_per_forward.observe(stats.generated_tokens / stats.forward_passes)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


def _route_template(scope: Scope) -> str:
    """The path template of the route that served ``scope`` (bounded label values, not raw paths).

    The router records the matched route in the (shared) scope while dispatching."""
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED_ROUTE


def _method(scope: Scope) -> str:
    return scope["method"] if scope["method"] in METHODS else OTHER


def _status(status: int) -> str:
    if status in STATUSES:
        return str(status)
    return f"{status // 100}xx" if 100 <= status < 600 else OTHER


class MetricsMiddleware:
    """Count every HTTP request and time it, labelled by route template, method and status (bounded values)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch)
        finally:
            route = _route_template(scope)
            self.metrics.requests.labels(route, _method(scope), _status(watch.status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - began)
