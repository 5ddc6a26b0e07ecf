"""Structured JSON logs carrying the request id, and the middleware that assigns it."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ner_service.api.core.responses import ResponseWatch

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
access_log = logging.getLogger("ner_service.api.access")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            payload["request_id"] = request_id
        payload.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False, default=str)


class _JsonHandler(logging.StreamHandler):
    """The stderr handler installed by :func:`configure_logging` (recognised so it is installed once)."""


def configure_logging(level: str) -> None:
    """Send every log record of the process to stderr as JSON lines at ``level`` (idempotent)."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _JsonHandler)]:
        root.removeHandler(handler)
    handler = _JsonHandler()
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # the access log below replaces it


def _incoming_request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            candidate = value.decode("latin-1")
            if _VALID_REQUEST_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestContextMiddleware:
    """Honour or generate ``X-Request-ID``, echo it in the response and write one access-log line."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _incoming_request_id(scope)
        token = request_id_var.set(request_id)
        began = time.perf_counter()
        watch = ResponseWatch(send, [(b"x-request-id", request_id.encode("latin-1"))])
        try:
            await self.app(scope, receive, watch)
        finally:
            access_log.info(
                "%s %s %d", scope["method"], scope["path"], watch.status,
                extra={"method": scope["method"], "path": scope["path"], "status": watch.status,
                       "duration_ms": round((time.perf_counter() - began) * 1000, 2)},
            )
            request_id_var.reset(token)
