"""A small real HTTP server that speaks the slice of the OpenAI API (plus agentspec's wire
additions) that the client uses, for fast tests and for measuring client overhead.

It is not a model: chat replies echo the last user message, token completions add one to
each prompt id. It checks ids and seeds with the same code as a real agentspec server
(:mod:`agentspec.wire`) and answers ``GET /agentspec/v1/sessions/{id}`` in the same shape,
so client tests observe the wire, and it can fail on demand (5xx, a cut stream, a hang
before answering or mid-stream, an unhealthy ``/health``, a stop). Chat streams carry
token ids when asked (``return_token_ids``, as vLLM's: the prompt's on the first chunk,
rendered by :func:`stub_render`), and a streamed token-id completion of a rendered chat
plus the start of its reply continues that reply, so a client can resume a cut stream.
Its "tokenizer" makes one token per UTF-8 byte of a text seed (what a byte-level tokenizer
without merges would), so its seeded-token counts are an upper bound of a real server's.

Needs ``starlette`` and ``uvicorn`` (both come with vLLM)::

    with StubServer() as server:
        client = AgentSpecClient(backends=[server.url])
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, Self

from agentspec import wire

__all__ = ["RecordedRequest", "StubServer", "stub_continuation", "stub_render", "stub_tokenize"]

VOCAB = 4096


def stub_tokenize(text: str) -> list[int]:
    """The stub's tokenizer: one token per UTF-8 byte."""
    return list(text.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request as the stub received it (headers lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def session_id(self) -> str | None:
        return self.headers.get(wire.SESSION_HEADER.lower())


@dataclasses.dataclass
class _SessionState:
    group_id: str | None = None
    calls: int = 0
    seeded_tokens: int = 0
    seeded_tokens_by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    seeds: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class StubServer:
    """An OpenAI-compatible stub on ``127.0.0.1``, served by uvicorn in a daemon thread.

    ``stop()`` closes the port (callers then see connection errors, as with a dead server);
    ``start()`` again reopens the same port with fresh state.
    """

    def __init__(self, port: int = 0, *, name: str = "stub", model: str = "stub-model") -> None:
        self.name = name
        self.model = model
        self._port = port
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self.requests: list[RecordedRequest] = []
        self.sessions: dict[str, _SessionState] = {}
        # Fault injection, read by the handlers. ``hang``: generation requests get no
        # answer until release(); ``hang_stream_after``: a stream stalls after that many
        # words until release().
        self.healthy = True
        self.fail_status: int | None = None
        self.fail_remaining = 0
        self.fail_retry_after: str | None = None
        self.cut_stream_after: int | None = None
        self.delay_s = 0.0
        self.hang = False
        self.hang_stream_after: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Self:
        import uvicorn

        if self.running:
            if not self._server.should_exit:
                return self
            # A stop is under way (in another thread): let it finish, then start afresh.
            assert self._thread is not None  # running
            self._thread.join(timeout=15)
            if self._thread.is_alive():
                raise RuntimeError(f"stub server {self.name} did not stop")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Restarting on the port of a stopped server must not wait out TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self._port))
        self._port = sock.getsockname()[1]
        self.reset()
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=f"stub-{self.name}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"stub server {self.name} did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout=5)
        if thread.is_alive():
            # uvicorn cancels held requests after its graceful timeout, but a held stream
            # can outlive that; a killed process would drop it: force the exit.
            server.force_exit = True
            thread.join(timeout=5)
        if self._thread is thread:  # not restarted meanwhile
            self._server = None
            self._thread = None

    def reset(self) -> None:
        """Forget recorded requests and sessions, clear faults."""
        with self._lock:
            self.requests = []
            self.sessions = {}
        self.healthy = True
        self.fail_status = None
        self.fail_remaining = 0
        self.fail_retry_after = None
        self.cut_stream_after = None
        self.delay_s = 0.0
        self.hang = False
        self.hang_stream_after = None

    def release(self) -> None:
        """End a :attr:`hang` (and a :attr:`hang_stream_after` stall): held requests go on."""
        self.hang = False
        self.hang_stream_after = None

    async def _hold(self, stalled: Any) -> None:
        # A hung backend (a stopped process) answers nothing: wait until released.
        while stalled():
            await asyncio.sleep(0.01)

    def fail_next(self, n: int = 1, status: int = 500, *, retry_after: str | float | None = None) -> None:
        """Answer the next ``n`` generation requests with ``status``, with a ``Retry-After``
        header when ``retry_after`` is given (seconds, or an HTTP date), as a rate-limiting
        proxy or an overloaded server in front of vLLM would."""
        self.fail_status = status
        self.fail_retry_after = None if retry_after is None else str(retry_after)
        self.fail_remaining = n

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def generation_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path.startswith("/v1/")]

    # -- the app ---------------------------------------------------------------------------

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        def error(status: int, message: str, param: str | None = None) -> JSONResponse:
            return JSONResponse(wire.error_body(message, "BadRequestError", status, param), status_code=status)

        async def health(request: Request) -> Response:
            return Response(status_code=200 if self.healthy else 503)

        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

        async def stats(request: Request) -> Response:
            sid = request.path_params["session_id"]
            with self._lock:
                state = self.sessions.get(sid)
            if not wire.is_valid_id(sid):
                err = wire.bad_id("path session id")
                return error(400, str(err), err.param)
            if state is None:
                return JSONResponse(
                    wire.error_body(f"no state for session {sid!r}", "NotFoundError", 404), status_code=404
                )
            # The stub drafts nothing; it holds exactly what was seeded.
            return JSONResponse(
                wire.session_stats_body(
                    sid,
                    state.group_id,
                    calls=state.calls,
                    seeded_tokens=state.seeded_tokens,
                    held_tokens=state.seeded_tokens,
                    seeded_tokens_by_kind=state.seeded_tokens_by_kind,
                )
            )

        async def receive(request: Request) -> tuple[Any, Response | None]:
            """Parse and record a POST; the response when a fault is injected or it is not JSON."""
            raw = await request.body()
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                return None, error(400, "body is not JSON")
            with self._lock:
                self.requests.append(
                    RecordedRequest(
                        request.method,
                        request.url.path,
                        {k.lower(): v for k, v in request.headers.items()},
                        body,
                    )
                )
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            await self._hold(lambda: self.hang)
            if self.fail_remaining > 0 and self.fail_status is not None:
                self.fail_remaining -= 1
                response = error(self.fail_status, "injected failure")
                if self.fail_retry_after is not None:
                    response.headers["Retry-After"] = self.fail_retry_after
                return body, response
            return body, None

        async def seeds(request: Request) -> Response:
            body, failed = await receive(request)
            if failed is not None:
                return failed
            try:
                wire.check_seeds_request(body)
                sid, gid, total = self._accept(request.headers, body, call=False)
            except wire.WireError as exc:
                return error(400, str(exc), exc.param)
            return JSONResponse(wire.seeds_response_body(sid, gid, total))

        async def generate(request: Request) -> Response:
            body, failed = await receive(request)
            if failed is not None:
                return failed
            if not isinstance(body, dict):
                return error(400, "body is not a JSON object")
            try:
                self._accept(request.headers, body)
            except wire.WireError as exc:
                return error(400, str(exc), exc.param)
            chat = request.url.path.endswith("/chat/completions")
            prompt = body.get("prompt")
            if not chat and not (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
                return error(400, "the stub completes token-id prompts only")
            if body.get("stream"):
                stream = self._stream(body) if chat else self._stream_completion(body)
                return StreamingResponse(stream, media_type="text/event-stream")
            return JSONResponse(self._chat(body) if chat else self._completion(body))

        return Starlette(
            routes=[
                Route("/health", health),
                Route("/v1/models", models),
                Route("/v1/chat/completions", generate, methods=["POST"]),
                Route("/v1/completions", generate, methods=["POST"]),
                Route(wire.SESSION_STATS_PATH + "{session_id:path}", stats),
                Route(wire.SEEDS_PATH, seeds, methods=["POST"]),
            ]
        )

    # -- request handling ------------------------------------------------------------------

    def _accept(self, headers: Any, body: dict[str, Any], *, call: bool = True) -> tuple[str | None, str | None, int]:
        """Check ids and seeds as the agentspec server does, and count them (``call``: as a
        generation request). Returns the session, the group and the seeded tokens."""
        sid, gid = wire.resolve_ids(body, headers.get)
        specs = wire.parse_seeds(body.get(wire.SEEDS_FIELD) or [], session_id=sid, group_id=gid)
        total = 0
        by_kind: dict[str, int] = {}
        for spec in specs:
            ids = stub_tokenize(spec.text) if spec.text is not None else list(spec.token_ids or ())
            wire.check_vocabulary(spec, ids, VOCAB)
            total += len(ids)
            by_kind[spec.kind.value] = by_kind.get(spec.kind.value, 0) + len(ids)
            if total > wire.MAX_SEED_TOKENS_PER_REQUEST:
                raise wire.seed_tokens_over_limit(wire.MAX_SEED_TOKENS_PER_REQUEST, spec.where)
        if sid is None:
            return sid, gid, total
        with self._lock:
            state = self.sessions.setdefault(sid, _SessionState())
            state.group_id = gid or sid
            state.calls += int(call)
            state.seeded_tokens += total
            for kind, n in by_kind.items():
                state.seeded_tokens_by_kind[kind] = state.seeded_tokens_by_kind.get(kind, 0) + n
            state.seeds.extend(body.get(wire.SEEDS_FIELD) or [])
        return sid, gid, total

    def _reply_text(self, body: dict[str, Any]) -> str:
        last = ""
        for message in body.get("messages") or ():
            if message.get("role") == "user" and isinstance(message.get("content"), str):
                last = message["content"]
        return f"echo: {last}"

    def _tool_call(self, body: dict[str, Any]) -> dict[str, Any] | None:
        tools = body.get("tools") or []
        if not tools or body.get("tool_choice") in (None, "none"):
            return None
        name = tools[0].get("function", {}).get("name", "tool")
        return {
            "id": "call_0",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"echo": self._reply_text(body)})},
        }

    def _chat(self, body: dict[str, Any]) -> dict[str, Any]:
        call = self._tool_call(body)
        text = self._reply_text(body)
        message: dict[str, Any] = {"role": "assistant", "content": None if call else text}
        if call:
            message["tool_calls"] = [call]
        n = len(text.split())
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if call else "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
        }

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body["prompt"]
        n = int(body.get("max_tokens") or 16)
        out = [(prompt[-1] + 1 + i) % VOCAB for i in range(n)]
        choice: dict[str, Any] = {
            "index": 0,
            "text": " ".join(str(t) for t in out),
            "finish_reason": "length",
            "token_ids": out if body.get("return_token_ids") else None,
            "prompt_token_ids": prompt if body.get("return_token_ids") else None,
            "logprobs": None,
        }
        if body.get("logprobs") is not None:
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" for t in out],
                "token_logprobs": [-0.5] * n,
                "top_logprobs": [{f"token_id:{t}": -0.5} for t in out],
                "text_offset": list(range(n)),
            }
        return {
            "id": "cmpl-stub",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [choice],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n},
        }

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        def event(delta: dict[str, Any], finish: str | None = None, token_ids: list[int] | None = None) -> bytes:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            if token_ids is not None:
                choice["token_ids"] = token_ids
            chunk = {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "model": body.get("model") or self.model,
                "choices": [choice],
            }
            return f"data: {json.dumps(chunk)}\n\n".encode()

        ids = bool(body.get("return_token_ids"))
        cut = self.cut_stream_after
        self.cut_stream_after = None
        first = event({"role": "assistant", "content": ""})
        if ids:  # as vLLM: the prompt's ids on the first chunk, each chunk's own ids
            chunk = json.loads(first[len(b"data: ") :])
            chunk.update(prompt_token_ids=stub_tokenize(stub_render(body.get("messages") or [])), prompt_text=None)
            first = f"data: {json.dumps(chunk)}\n\n".encode()
        yield first
        words = self._reply_text(body).split(" ")
        call = self._tool_call(body)
        stall = self.hang_stream_after
        for i, word in enumerate(words):
            if stall is not None and i >= stall:
                await self._hold(lambda: self.hang_stream_after is not None)
            if cut is not None and i >= cut:
                # Abort mid-stream: uvicorn drops the connection without the final chunk.
                raise ConnectionAbortedError("injected stream cut")
            piece = word if i == 0 else " " + word
            yield event({"content": piece}, token_ids=stub_tokenize(piece) if ids else None)
            await asyncio.sleep(0)
        if call:
            yield event({"tool_calls": [{"index": 0, **call}]})
        yield event({}, "tool_calls" if call else "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            n = len(words)
            usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def _stream_completion(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """A streamed token-id completion. A prompt that renders a chat (:func:`stub_render`)
        plus part of its reply continues that reply (how a client resumes a cut chat
        stream); any other prompt counts up from its last id, as :meth:`_completion`."""
        prompt = body["prompt"]
        ids = bool(body.get("return_token_ids"))
        pieces: list[tuple[str, list[int]]]
        rest = stub_continuation(prompt)
        if rest is not None:
            pieces = [(p, stub_tokenize(p)) for p in re.findall(r"\s*\S+", rest)]
        else:
            n = int(body.get("max_tokens") or 16)
            pieces = [
                (("" if i == 0 else " ") + str(t), [t])
                for i, t in enumerate((prompt[-1] + 1 + i) % VOCAB for i in range(n))
            ]
        finish = "stop" if rest is not None else "length"
        cut = self.cut_stream_after
        self.cut_stream_after = None
        for i, (text, token_ids) in enumerate(pieces):
            if cut is not None and i >= cut:
                raise ConnectionAbortedError("injected stream cut")
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish if i == len(pieces) - 1 else None,
                "stop_reason": None,
            }
            if ids:
                choice["prompt_token_ids"] = prompt if i == 0 else None
                choice["token_ids"] = token_ids
            chunk = {
                "id": "cmpl-stub",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or self.model,
                "choices": [choice],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            await asyncio.sleep(0)
        if (body.get("stream_options") or {}).get("include_usage"):
            n = sum(len(t) for _, t in pieces)
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n, "total_tokens": len(prompt) + n}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


_ASSISTANT = "<|assistant|>"


def stub_render(messages: list[dict[str, Any]]) -> str:
    """The stub's chat template: ``<|role|>content`` per message, then ``<|assistant|>``."""
    out = []
    for message in messages:
        content = message.get("content")
        out.append(f"<|{message.get('role')}|>{content if isinstance(content, str) else ''}")
    return "".join(out) + _ASSISTANT


def stub_continuation(prompt: list[int]) -> str | None:
    """The rest of the stub's chat reply when ``prompt`` is a rendered chat plus a start
    of its reply (token ids, one per byte), else None."""
    if any(t > 255 for t in prompt):
        return None
    text = bytes(prompt).decode("utf-8", "replace")
    at = text.rfind(_ASSISTANT)
    if at < 0:
        return None
    head, delivered = text[:at], text[at + len(_ASSISTANT) :]
    users = re.findall(r"<\|user\|>(.*?)(?=<\||$)", head, flags=re.DOTALL)
    reply = f"echo: {users[-1] if users else ''}"
    return reply[len(delivered) :] if reply.startswith(delivered) else None
