"""Session pinning and failover as an httpx transport, for clients agentspec did not write.

Any client built on httpx (the OpenAI SDK, LangChain's ``ChatOpenAI``, LiteLLM's OpenAI
route) can route through several agentspec servers by taking an ``httpx.Client`` whose
transport is a :class:`FailoverTransport`:

```python
import httpx, openai
from agentspec.client import Failover, FailoverTransport

failover = Failover(["http://gpu1:8000", "http://gpu2:8000"])
client = openai.OpenAI(
    base_url="http://gpu1:8000/v1",  # any of the backends
    api_key="none",
    http_client=httpx.Client(transport=FailoverTransport(failover)),
)
client.chat.completions.create(..., extra_headers={"X-Session-Id": "task-17"})
```

Each request addressed to one of the backends goes to the backend its pin key (the
``X-Group-Id`` header, else ``X-Session-Id``; see :mod:`agentspec.client.protocol`) is pinned
to by :class:`~agentspec.client.router.BackendRouter`: rendezvous hashing with bounded load,
so a group's calls meet their draft index. A request without ids takes the backends in turn;
a request to any other URL passes through untouched.

When an attempt cannot connect, times out, or is answered 5xx, the backend is marked down
and the same request goes to the next backend at once (each backend once per request by
default). A 4xx or 429 answer is the caller's: the SDK's own retry honours ``Retry-After``.

Limits, by design:

- **A stream that breaks after its headers arrived is not moved.** The caller may already
  have shown part of the reply; the transport cannot know. The error reaches the caller
  (httpx's ``RemoteProtocolError`` / ``ReadError``), the backend is marked down, and the
  session's next request goes elsewhere. A non-streamed reply is read whole inside the
  attempt, so one cut mid-body does fail over. agentspec's own client
  (:class:`~agentspec.client.AgentSpecClient`) resumes cut streams; use it where that matters.
- **The SDK's ``max_retries`` stacks on top.** A request that fails on every backend is
  retried by the SDK (after its back-off), and each retry fails over again: up to
  ``(max_retries + 1) * len(backends)`` attempts. Failover is immediate; the SDK's retries
  are for outages of every backend at once. Set ``max_retries=0`` to try each backend once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence

import httpx

from agentspec.wire import GROUP_HEADER, SESSION_HEADER

from .attempts import describe
from .config import RetryPolicy
from .router import BackendRouter, classify_http_error

__all__ = ["AsyncFailoverTransport", "Failover", "FailoverTransport", "failover_policy"]

_UNREACHABLE = "unreachable: a request's attempts end by returning or raising"


def failover_policy(n_backends: int) -> RetryPolicy:
    """Each backend at most once per request, without waiting: the SDK above the transport
    retries the whole request (429 included, honouring ``Retry-After``) with its back-off."""
    return RetryPolicy(
        max_attempts=max(1, min(n_backends, 20)),
        backoff_initial_s=0.0,
        backoff_max_s=0.0,
        retry_on_429=False,
    )


class Failover:
    """What the sync and async transports of one set of backends share: the router (pins
    and health), the retry policy, and where each session's last request went.

    ``backends`` are base URLs (``/v1`` optional) or a :class:`BackendRouter` to share with
    other code. A router built here re-tries a down backend ``cooldown_s`` after its last
    failure (no prober runs) and remembers ``max_groups`` groups. Thread-safe.
    """

    def __init__(
        self,
        backends: Sequence[str] | BackendRouter,
        *,
        load_factor: float = 1.25,
        cooldown_s: float = 30.0,
        max_groups: int = 10_000,
        policy: RetryPolicy | None = None,
        max_sessions: int = 10_000,
    ) -> None:
        if isinstance(backends, BackendRouter):
            self.router = backends
        else:
            self.router = BackendRouter(backends, load_factor=load_factor, cooldown_s=cooldown_s, max_groups=max_groups)
        self.policy = policy if policy is not None else failover_policy(len(self.router.backends))
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def backends(self) -> tuple[str, ...]:
        return self.router.backends

    def backend_for(self, session_id: str | None = None, group_id: str | None = None) -> str:
        """Where a session's requests go: the backend its last request was answered by,
        else where its group (``group_id``, else the session itself) is pinned now."""
        if session_id is not None:
            with self._lock:
                known = self._sessions.get(session_id)
            if known is not None:
                return known
        backend = self.router.resolve(group_id or session_id)
        if backend is None:  # a router without a cool-down, every backend down
            return self.router.backends[0]
        return backend

    # -- what the transports ask ----------------------------------------------------------

    def target(self, url: httpx.URL) -> str | None:
        """The rest of ``url`` after the backend it is addressed to, or None for other URLs."""
        text = str(url)
        for backend in self.router.backends:
            if text == backend or text.startswith((backend + "/", backend + "?")):
                return text[len(backend) :]
        return None

    @staticmethod
    def pin_key(headers: httpx.Headers) -> str | None:
        return headers.get(GROUP_HEADER) or headers.get(SESSION_HEADER)

    def answered(self, headers: httpx.Headers, backend: str) -> None:
        """A backend answered a session's request: its stats and seeds live there now."""
        session = headers.get(SESSION_HEADER)
        if session is None:
            return
        with self._lock:
            self._sessions[session] = backend
            self._sessions.move_to_end(session)
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)

    def broke(self, backend: str, error: BaseException) -> None:
        """A stream broke after its headers: the backend is suspect for the next request."""
        self.router.mark_down(backend, f"stream broke: {describe(error)}")


def _readdressed(request: httpx.Request, url: str) -> httpx.Request:
    # Host must follow the URL; the body was read so every attempt can send it again.
    headers = request.headers.copy()
    headers.pop("host", None)
    return httpx.Request(request.method, url, headers=headers, content=request.content, extensions=request.extensions)


def _is_stream(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("text/event-stream")


def _server_error(request: httpx.Request, response: httpx.Response) -> httpx.HTTPStatusError:
    """A 5xx answer as the error the router classifies as the backend's failure."""
    return httpx.HTTPStatusError(f"{response.status_code} from {request.url}", request=request, response=response)


class _WatchedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, failover: Failover, backend: str) -> None:
        self._inner, self._failover, self._backend = inner, failover, backend

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._inner
        except httpx.TransportError as exc:
            self._failover.broke(self._backend, exc)
            raise

    def close(self) -> None:
        self._inner.close()


class _AsyncWatchedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, failover: Failover, backend: str) -> None:
        self._inner, self._failover, self._backend = inner, failover, backend

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.TransportError as exc:
            self._failover.broke(self._backend, exc)
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


class FailoverTransport(httpx.BaseTransport):
    """An httpx transport that pins sessions to backends and fails over (module docs).

    ``failover`` is a :class:`Failover` (share one between the sync and async transports
    of a client, and between clients that should pin alike) or the backends' URLs.
    ``transport`` sends the attempts (default ``httpx.HTTPTransport()``).
    """

    def __init__(
        self,
        failover: Failover | Sequence[str],
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.failover = failover if isinstance(failover, Failover) else Failover(failover)
        self._inner = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        rest = self.failover.target(request.url)
        if rest is None:
            return self._inner.handle_request(request)
        request.read()  # every attempt sends the same body
        failover = self.failover
        try:
            for attempt in failover.router.retry(
                failover.pin_key(request.headers), failover.policy, classify=classify_http_error, reraise=True
            ):
                with attempt:
                    response = self._inner.handle_request(_readdressed(request, attempt.backend + rest))
                    if response.status_code >= 500:
                        response.read()
                        raise _server_error(request, response)
                    if _is_stream(response):
                        response.stream = _WatchedStream(response.stream, failover, attempt.backend)  # type: ignore[arg-type]
                    else:
                        response.read()  # a body cut here still fails over
                    failover.answered(request.headers, attempt.backend)
                    return response
        except httpx.HTTPStatusError as stopped:
            return stopped.response  # every backend answered 5xx: the caller sees the last
        raise AssertionError(_UNREACHABLE)

    def close(self) -> None:
        self._inner.close()


class AsyncFailoverTransport(httpx.AsyncBaseTransport):
    """Async :class:`FailoverTransport` (``httpx.AsyncClient(transport=...)``)."""

    def __init__(
        self,
        failover: Failover | Sequence[str],
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.failover = failover if isinstance(failover, Failover) else Failover(failover)
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        rest = self.failover.target(request.url)
        if rest is None:
            return await self._inner.handle_async_request(request)
        await request.aread()
        failover = self.failover
        try:
            async for attempt in failover.router.aretry(
                failover.pin_key(request.headers), failover.policy, classify=classify_http_error, reraise=True
            ):
                with attempt:
                    response = await self._inner.handle_async_request(_readdressed(request, attempt.backend + rest))
                    if response.status_code >= 500:
                        await response.aread()
                        raise _server_error(request, response)
                    if _is_stream(response):
                        response.stream = _AsyncWatchedStream(response.stream, failover, attempt.backend)  # type: ignore[arg-type]
                    else:
                        await response.aread()
                    failover.answered(request.headers, attempt.backend)
                    return response
        except httpx.HTTPStatusError as stopped:
            return stopped.response
        raise AssertionError(_UNREACHABLE)

    async def aclose(self) -> None:
        await self._inner.aclose()
