"""Small ASGI helpers for the API server's middleware: headers, bodies, JSON answers and
calling the wrapped app on a request of our own."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from agentspec import wire
from agentspec.wire import WireError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Headers:
    """A request's headers by lower-cased name, all values kept."""

    def __init__(self, scope: Scope) -> None:
        self._h: dict[str, list[str]] = {}
        for key, value in scope.get("headers", []):
            self._h.setdefault(key.decode("latin-1").lower(), []).append(value.decode("latin-1"))

    def first(self, name: str) -> str | None:
        values = self._h.get(name.lower())
        return values[0] if values else None

    def get(self, name: str) -> str | None:
        """The header's value; a header sent several times with different values is refused
        (which one a router in front hashed is unknowable)."""
        values = self._h.get(name.lower())
        if not values:
            return None
        if len(set(values)) > 1:
            raise WireError(f"header {name} appears {len(values)} times with different values", f"header {name}")
        return values[0]


async def call(app: ASGIApp, scope: Scope, receive: Receive) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Run ``app`` on one request and collect its whole response."""
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def capture(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, capture)
    return status, headers, b"".join(chunks)


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away before sending it all
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then the client's own messages (disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def with_content_length(headers: Any, length: int) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    out.append((b"content-length", str(length).encode()))
    return out


async def send_error(send: Send, exc: WireError) -> None:
    await send_json(send, 400, wire.error_body(str(exc), "BadRequestError", 400, exc.param))


async def send_json(send: Send, status: int, payload: Any) -> None:
    body = json.dumps(payload).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
