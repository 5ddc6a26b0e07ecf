"""What an ASGI middleware sees of the response it passes on: its status, and headers added."""

from __future__ import annotations

from starlette.types import Message, Send


class ResponseWatch:
    """Wraps ``send``: records whether the response has started and its status (500 until one is
    sent, as for a crash) and adds ``headers`` to the response start."""

    def __init__(self, send: Send, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self._send, self._headers = send, headers or []
        self.status = 500
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status, self.started = message["status"], True
            message["headers"] = [*message.get("headers", []), *self._headers]
        await self._send(message)
