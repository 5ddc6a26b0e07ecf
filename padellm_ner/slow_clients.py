"""uvicorn's HTTP/1.1 protocol with read timeouts, so that a slow client cannot hold a connection.

uvicorn times a connection out only while it is idle between requests (``--timeout-keep-alive``):
a client that sends half its headers, or a body shorter than its ``Content-Length``, held one for
as long as it liked. :class:`TimedH11Protocol` gives a request ``NER_HEADER_TIMEOUT_S`` from its
first byte (or from the connection's opening) to the end of its headers, and then
``NER_BODY_TIMEOUT_S`` to the end of its body; past either, the connection is closed (with a 408
when no response has begun). ``padellm-ner serve`` runs it
(``uvicorn --http padellm_ner.slow_clients:TimedH11Protocol``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ner_service.settings import get_settings

logger = logging.getLogger(__name__)
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 23\r\nconnection: close\r\n\r\nrequest read timed out\n"


class TimedH11Protocol(H11Protocol):
    """:class:`H11Protocol` whose requests must arrive within the header and body timeouts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = get_settings()
        self.header_timeout_s, self.body_timeout_s = settings.ner_header_timeout_s, settings.ner_body_timeout_s
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading: str | None = None  # "headers", "body" or None (nothing being read)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._time("headers")  # a connection that sends nothing is closed too

    def data_received(self, data: bytes) -> None:
        if self._reading is None and self.conn.their_state is h11.IDLE:
            self._time("headers")  # the next request of a kept-alive connection begins
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._time(None)
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Move the timer along with the request: headers read, body read, or done."""
        state = self.conn.their_state
        if self._reading == "headers" and state is not h11.IDLE:
            self._time("body" if state is h11.SEND_BODY else None)
        elif self._reading == "body" and state is not h11.SEND_BODY:
            self._time(None)

    def _time(self, reading: str | None) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
        self._reading, self._read_timer = reading, None
        if reading is not None:
            seconds = self.header_timeout_s if reading == "headers" else self.body_timeout_s
            self._read_timer = self.loop.call_later(seconds, self._timed_out, reading, seconds)

    def _timed_out(self, reading: str, seconds: float) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        logger.warning("closed a connection whose request %s did not arrive within %.0f s (client %s)", reading, seconds,
                       self.client[0] if self.client else "unknown")
        if reading == "headers" or not self.cycle.response_started:  # no answer begun to this request
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()
