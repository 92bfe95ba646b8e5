"""Behind a router: one base URL that hashes ``X-Session-Id`` over two backends.

vllm-router's ``consistent_hash`` policy and the production-stack router's ``session``
routing both pick a backend from a hash of a session header. The tiny router here does the
same over real HTTP, so the test shows that the header the client sends on every call —
chat, streaming and token calls — keeps each session on one backend behind such a router.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentspec.client import AgentSpecClient, ClientConfig


def _router_app(backends: list[str], header: str) -> Starlette:
    http = httpx.AsyncClient(timeout=30)

    def pick(key: str | None) -> str:
        if key is None:
            return backends[0]
        # Any stable hash will do; deliberately not the client's own.
        return backends[int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(backends)]

    async def proxy(request: Request) -> Response:
        target = pick(request.headers.get(header)) + request.url.path
        fwd = {k: v for k, v in request.headers.items() if k.lower() not in {"host", "content-length"}}
        upstream = await http.send(
            http.build_request(request.method, target, content=await request.body(), headers=fwd),
            stream=True,
        )
        if "text/event-stream" in upstream.headers.get("content-type", ""):
            return StreamingResponse(
                upstream.aiter_raw(),
                status_code=upstream.status_code,
                media_type="text/event-stream",
                background=None,
            )
        body = await upstream.aread()
        await upstream.aclose()
        return Response(body, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))

    return Starlette(routes=[Route("/{path:path}", proxy, methods=["GET", "POST"])])


@pytest.fixture(scope="module")
def router_url(_stub_pair) -> Iterator[str]:
    app = _router_app([s.url for s in _stub_pair], "x-session-id")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.005)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(5)


def test_sessions_stick_behind_a_header_hashing_router(router_url, stubs) -> None:
    config = ClientConfig(backends=[router_url], model="stub-model", health_check_interval_s=None)
    ids = [f"routed-{i}" for i in range(16)]
    with AgentSpecClient(config) as client:
        for sid in ids:
            with client.session(sid, group_id="one-group") as s:
                s.chat([{"role": "user", "content": "hi"}])
                s.stream_chat([{"role": "user", "content": "hi"}]).until_done()
                s.complete_tokens([1, 2], max_tokens=2)
                # Stats go through the router too and find the session where it ran.
                assert s.stats().calls == 3
    seen: dict[str, set[str]] = {}
    for stub in stubs:
        for r in stub.generation_requests():
            seen.setdefault(r.headers["x-session-id"], set()).add(stub.name)
    assert set(seen) == set(ids)
    assert all(len(names) == 1 for names in seen.values())  # every call of a session: one backend
    assert {n for names in seen.values() for n in names} == {"a", "b"}  # and the router spread them
