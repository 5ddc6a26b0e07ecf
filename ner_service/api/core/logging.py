"""Structured JSON logs carrying the request id, and the middleware that assigns it and answers
(and logs, once) the errors nothing else handled."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from contextvars import ContextVar
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ner_service.api.core.responses import ResponseWatch

REQUEST_ID_HEADER = "X-Request-ID"
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}  # uvicorn's ANSI copy

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)
access_log = logging.getLogger("ner_service.api.access")
logger = logging.getLogger(__name__)


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
    """Send every log record of the process to stderr as JSON lines at ``level`` (idempotent). It
    replaces the plain console handlers of the root logger (``logging.basicConfig``'s, which
    ``padellm-ner`` installs before ``serve`` starts the app), so that each record is one line."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _JsonHandler) or type(h) is logging.StreamHandler]:
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
            if _VALID_REQUEST_ID.fullmatch(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestContextMiddleware:
    """Honour a client's ``X-Request-ID`` (up to 128 of ``A-Za-z0-9._:-``) or generate one, send
    it back in every response, and write one access-log line.

    An exception nothing else handled is logged here, once, with the request id, and answered 500
    (with the id) unless the response had started; it is not raised further, so uvicorn does not
    log it a second time."""

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
        except Exception:
            logger.exception("unhandled error")
            if not watch.started:
                detail = f"internal error; see the server log for request id {request_id}"
                await JSONResponse({"detail": detail}, 500)(scope, receive, watch)
        finally:
            access_log.info(
                "%s %s %d", scope["method"], scope["path"], watch.status,
                extra={"method": scope["method"], "path": scope["path"], "status": watch.status,
                       "duration_ms": round((time.perf_counter() - began) * 1000, 2)},
            )
            request_id_var.reset(token)
