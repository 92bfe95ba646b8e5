"""Sessions: one agent trajectory's calls, pinned to one backend, with failover.

:class:`Session` (sync) and :class:`AsyncSession` (async) have the same methods; the async
ones are coroutines, and ``stream_chat`` returns an (async) iterable stream in both.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

import anyio
import httpx

from agentspec.wire import SEEDS_PATH, SESSION_STATS_PATH

from . import _wire
from ._core import SessionCore, chat_params, token_params
from .errors import BackendUnavailableError, ServerRefusedError, StreamInterruptedError
from .history import Seed
from .types import ChatResult, SeedReceipt, SessionStats, TokenCompletion, Turn

if TYPE_CHECKING:
    from .client import AgentSpecClient, AsyncAgentSpecClient

__all__ = ["AsyncChatStream", "AsyncSession", "ChatStream", "Session"]

# Transport failures that say nothing about the request itself: fail over and retry.
_TRANSIENT = (httpx.TransportError, BackendUnavailableError, json.JSONDecodeError)


def _stream_error(event: Mapping[str, Any], backend: str) -> Exception:
    """An ``{"error": ...}`` event inside a stream: a refusal (4xx code) or a failure."""
    err = event.get("error")
    message = err.get("message") if isinstance(err, Mapping) else str(err)
    code = err.get("code") if isinstance(err, Mapping) else None
    if isinstance(code, int) and 400 <= code < 500:
        return ServerRefusedError(code, str(message), backend=backend, body=dict(event))
    return BackendUnavailableError(backend, f"error event in stream: {message}")


class _SessionBase:
    """What both twins share: ids, transcript, seeds."""

    _core: SessionCore

    @property
    def session_id(self) -> str:
        return self._core.session_id

    @property
    def group_id(self) -> str:
        """The group; the session id itself when no group was given."""
        return self._core.group_id

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The session's completed calls, in order. Failover never drops one."""
        return tuple(self._core.turns)

    @property
    def backend(self) -> str | None:
        """The backend that holds the session's history (None before the first call)."""
        return self._core.backend

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def pending_seeds(self) -> tuple[Seed, ...]:
        """Seeds waiting for the session's next request."""
        return tuple(self._core.pending)

    def seed(self, content: str | Sequence[int], kind: str = "prior_turn", scope: str = "session") -> Seed:
        """Put text or token ids into the session's (``scope="group"``: group's) draft index.

        The seed travels with the session's next request (``agentspec_seeds``), or at once
        with :meth:`send_seeds`. ``kind`` is one of ``prior_turn``, ``repair_attempt``,
        ``sibling_output``, ``document``.
        """
        return self._core.add_seed(content, kind, scope)

    def repair(self, failed_attempt: str | Sequence[int], feedback: str | None = None) -> None:
        """Mark ``failed_attempt`` as the output the next turn will likely rewrite.

        It is seeded as ``repair_attempt``; ``feedback`` (an error message, a failing test's
        output), when given, as ``document``, since a fix often quotes it. Send the feedback in
        the next call's messages as well: seeds only guide drafting, the model never sees them.
        """
        self._core.add_seed(failed_attempt, "repair_attempt", "session")
        if feedback:
            self._core.add_seed(feedback, "document", "session")

    def discard_seeds(self) -> None:
        """Drop seeds not yet sent (for instance after the server refused one)."""
        self._core.pending.clear()

    def _headers(self) -> dict[str, str]:
        # The ids go on every request, stats included: a router in front hashes them.
        return _wire.request_headers(self.session_id, self.group_id, self._core.client.headers, None)

    def _stats_url(self, backend: str) -> str:
        # Ids may hold '/', which must not split the path.
        return f"{backend}{SESSION_STATS_PATH}{quote(self.session_id, safe='')}"

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"backend={self.backend!r}"
        return (
            f"<{type(self).__name__} {self.session_id!r} group={self.group_id!r} "
            f"turns={len(self._core.turns)} {state}>"
        )


class Session(_SessionBase):
    """A sync session. Make it with :meth:`AgentSpecClient.session`; close it (or use
    ``with``) to release its share of its backend's load."""

    def __init__(self, client: AgentSpecClient, session_id: str, group_id: str | None) -> None:
        self._client = client
        self._core = SessionCore(client._core, session_id, group_id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the session. Idempotent; later calls raise :class:`SessionClosedError`."""
        self._core.close()

    # -- calls -----------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatResult:
        """``POST /v1/chat/completions``: messages in, the assistant message out.

        ``params`` pass through to the body unchanged (``max_tokens``, ``temperature``,
        ``tools``, ``tool_choice``, ``extra_body``...). Tool calls come back in
        ``result.message["tool_calls"]``.
        """
        self._core.check_open()
        body = chat_params(messages, model, self._client.config.model, params, stream=False)
        data, backend, attempts = self._post("/v1/chat/completions", body, extra_headers)
        return self._core.record_chat(body["messages"], data, backend, attempts)

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatStream:
        """Streaming chat: iterate the returned :class:`ChatStream` for the chunks.

        A failure before any output reached the caller is retried on a healthy backend; a
        failure after raises :class:`StreamInterruptedError` saying what was received.
        """
        self._core.check_open()
        body = chat_params(messages, model, self._client.config.model, params, stream=True)
        return ChatStream(self, body, extra_headers)

    def complete_tokens(
        self,
        prompt_token_ids: Sequence[int],
        *,
        model: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> TokenCompletion:
        """Token ids in, token ids out: ``POST /v1/completions`` with a token-id prompt.

        Asks vLLM for ``return_token_ids``; pass ``logprobs=k`` (and vLLM's
        ``return_tokens_as_token_ids=True``) for per-token log-probabilities.
        """
        self._core.check_open()
        prompt, body = token_params(prompt_token_ids, model, self._client.config.model, params)
        data, backend, attempts = self._post("/v1/completions", body, extra_headers)
        return self._core.record_tokens(prompt, data, backend, attempts)

    def send_seeds(self) -> SeedReceipt:
        """Deliver the pending seeds now, without generating (``POST /agentspec/v1/seeds``).

        For seeds that should be in the index before the session's next call is even
        written: text a context condenser just dropped, a sibling's finished output. It
        goes to the session's backend with the same failover as a call. With no seeds
        pending, nothing is sent.
        """
        self._core.check_open()
        if not self._core.pending:
            return SeedReceipt(session_id=self.session_id, group_id=self.group_id, backend=self.backend)
        data, backend, _ = self._post(SEEDS_PATH, {}, None)
        return SeedReceipt.model_validate({**data, "backend": backend})

    def stats(self) -> SessionStats:
        """The server's statistics of this session, from the backend holding it.

        Raises :class:`SessionNotFoundError` when that server holds no state for it.
        """
        self._core.check_open()
        backend = self._core.stats_backend() or self._client._backend_for(self.group_id)
        try:
            response = self._client._http.get(self._stats_url(backend), headers=self._headers())
        except httpx.TransportError as exc:
            self._client._core.mark_down(backend, repr(exc))
            raise BackendUnavailableError(backend, repr(exc)) from exc
        _wire.classify(response, backend, stats=True)
        return SessionStats.model_validate({**response.json(), "backend": backend})

    # -- retry loop ------------------------------------------------------------------------

    def _post(
        self, path: str, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> tuple[dict[str, Any], str, int]:
        retry = self._client.config.retry
        last: Exception | None = None
        for attempt in range(1, retry.max_attempts + 1):
            if attempt > 1:
                time.sleep(retry.delay(attempt))
            backend = self._client._backend_for(self.group_id, last)
            headers, body, n_pending = self._core.prepare(backend, params, extra_headers)
            try:
                response = self._client._http.post(backend + path, json=body, headers=headers)
                _wire.classify(response, backend)
                data = response.json()
            except _wire.TooManyRequests as exc:
                if not retry.retry_on_429:
                    raise ServerRefusedError(429, str(exc), backend=backend) from exc
                last = ServerRefusedError(429, str(exc), backend=backend)
                continue
            except _TRANSIENT as exc:
                last = _as_unavailable(backend, exc)
                self._client._core.mark_down(backend, str(last))
                continue
            self._core.delivered(backend, n_pending)
            return data, backend, attempt
        assert last is not None
        raise last

    def _stream(
        self, stream: ChatStream, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> Iterator[dict[str, Any]]:
        retry = self._client.config.retry
        last: Exception | None = None
        for attempt in range(1, retry.max_attempts + 1):
            if attempt > 1:
                time.sleep(retry.delay(attempt))
            self._core.check_open()
            backend = self._client._backend_for(self.group_id, last)
            headers, body, n_pending = self._core.prepare(backend, params, extra_headers)
            acc = _wire.ChatAccumulator()
            held: list[dict[str, Any]] = []
            yielded = 0
            finished = False
            try:
                with self._client._http.stream(
                    "POST", backend + "/v1/chat/completions", json=body, headers=headers
                ) as response:
                    if response.status_code >= 300:
                        response.read()
                        _wire.classify(response, backend)
                    self._core.delivered(backend, n_pending)
                    for line in response.iter_lines():
                        event = _wire.parse_sse_line(line)
                        if event is None:
                            continue
                        if event is _wire.DONE:
                            finished = True
                            break
                        assert isinstance(event, dict)
                        if "error" in event:
                            raise _stream_error(event, backend)
                        acc.feed(event)
                        held.append(event)
                        if yielded == 0 and not acc.carries_output(event):
                            continue  # a role header: hold it so a failure now stays retryable
                        for chunk in held:
                            yielded += 1
                            yield chunk
                        held.clear()
                    if not finished and acc.finish_reason is None:
                        raise BackendUnavailableError(backend, "stream ended without [DONE]")
            except _wire.TooManyRequests as exc:
                if not retry.retry_on_429:
                    raise ServerRefusedError(429, str(exc), backend=backend) from exc
                last = ServerRefusedError(429, str(exc), backend=backend)
                continue
            except _TRANSIENT as exc:
                self._client._core.mark_down(backend, repr(exc))
                if yielded:
                    raise StreamInterruptedError(
                        backend, received_text=acc.text, received_chunks=yielded, cause=exc
                    ) from exc
                last = _as_unavailable(backend, exc)
                continue
            yield from held
            stream._result = self._core.record_stream(params["messages"], acc, backend, attempt)
            return
        assert last is not None
        raise last


class ChatStream:
    """An iterator over the chunks (dicts, as the server sent them) of one streamed chat call.

    Use it in a ``with`` block, or iterate it to the end; ``result`` (a :class:`ChatResult`
    with the whole message) is set once the stream has ended. Closing it early records no turn.
    """

    def __init__(
        self, session: Session, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> None:
        self._result: ChatResult | None = None
        self._iter = session._stream(self, params, extra_headers)

    @property
    def result(self) -> ChatResult | None:
        return self._result

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        return next(self._iter)

    def until_done(self) -> ChatResult:
        """Consume the rest of the stream and return the whole result."""
        for _ in self:
            pass
        assert self._result is not None
        return self._result

    def close(self) -> None:
        self._iter.close()  # type: ignore[attr-defined]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSession(_SessionBase):
    """The async twin of :class:`Session` (anyio: asyncio or trio)."""

    def __init__(self, client: AsyncAgentSpecClient, session_id: str, group_id: str | None) -> None:
        self._client = client
        self._core = SessionCore(client._core, session_id, group_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session. Never awaits anything, so it completes even when cancelled."""
        self._core.close()

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> ChatResult:
        """Async :meth:`Session.chat`."""
        self._core.check_open()
        body = chat_params(messages, model, self._client.config.model, params, stream=False)
        data, backend, attempts = await self._post("/v1/chat/completions", body, extra_headers)
        return self._core.record_chat(body["messages"], data, backend, attempts)

    def stream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> AsyncChatStream:
        """Async :meth:`Session.stream_chat`: ``async for chunk in session.stream_chat(...)``."""
        self._core.check_open()
        body = chat_params(messages, model, self._client.config.model, params, stream=True)
        return AsyncChatStream(self, body, extra_headers)

    async def complete_tokens(
        self,
        prompt_token_ids: Sequence[int],
        *,
        model: str | None = None,
        extra_headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> TokenCompletion:
        """Async :meth:`Session.complete_tokens`."""
        self._core.check_open()
        prompt, body = token_params(prompt_token_ids, model, self._client.config.model, params)
        data, backend, attempts = await self._post("/v1/completions", body, extra_headers)
        return self._core.record_tokens(prompt, data, backend, attempts)

    async def send_seeds(self) -> SeedReceipt:
        """Deliver the pending seeds now, without generating; see :meth:`Session.send_seeds`."""
        self._core.check_open()
        if not self._core.pending:
            return SeedReceipt(session_id=self.session_id, group_id=self.group_id, backend=self.backend)
        data, backend, _ = await self._post(SEEDS_PATH, {}, None)
        return SeedReceipt.model_validate({**data, "backend": backend})

    async def stats(self) -> SessionStats:
        """Async :meth:`Session.stats`."""
        self._core.check_open()
        backend = self._core.stats_backend() or await self._client._backend_for(self.group_id)
        try:
            response = await self._client._http.get(self._stats_url(backend), headers=self._headers())
        except httpx.TransportError as exc:
            self._client._core.mark_down(backend, repr(exc))
            raise BackendUnavailableError(backend, repr(exc)) from exc
        _wire.classify(response, backend, stats=True)
        return SessionStats.model_validate({**response.json(), "backend": backend})

    async def _post(
        self, path: str, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> tuple[dict[str, Any], str, int]:
        retry = self._client.config.retry
        last: Exception | None = None
        for attempt in range(1, retry.max_attempts + 1):
            if attempt > 1:
                await anyio.sleep(retry.delay(attempt))
            backend = await self._client._backend_for(self.group_id, last)
            headers, body, n_pending = self._core.prepare(backend, params, extra_headers)
            try:
                response = await self._client._http.post(backend + path, json=body, headers=headers)
                _wire.classify(response, backend)
                data = response.json()
            except _wire.TooManyRequests as exc:
                if not retry.retry_on_429:
                    raise ServerRefusedError(429, str(exc), backend=backend) from exc
                last = ServerRefusedError(429, str(exc), backend=backend)
                continue
            except _TRANSIENT as exc:
                last = _as_unavailable(backend, exc)
                self._client._core.mark_down(backend, str(last))
                continue
            self._core.delivered(backend, n_pending)
            return data, backend, attempt
        assert last is not None
        raise last

    async def _stream(
        self,
        stream: AsyncChatStream,
        params: Mapping[str, Any],
        extra_headers: Mapping[str, str] | None,
    ) -> AsyncIterator[dict[str, Any]]:
        retry = self._client.config.retry
        last: Exception | None = None
        for attempt in range(1, retry.max_attempts + 1):
            if attempt > 1:
                await anyio.sleep(retry.delay(attempt))
            self._core.check_open()
            backend = await self._client._backend_for(self.group_id, last)
            headers, body, n_pending = self._core.prepare(backend, params, extra_headers)
            acc = _wire.ChatAccumulator()
            held: list[dict[str, Any]] = []
            yielded = 0
            finished = False
            try:
                async with self._client._http.stream(
                    "POST", backend + "/v1/chat/completions", json=body, headers=headers
                ) as response:
                    if response.status_code >= 300:
                        await response.aread()
                        _wire.classify(response, backend)
                    self._core.delivered(backend, n_pending)
                    async for line in response.aiter_lines():
                        event = _wire.parse_sse_line(line)
                        if event is None:
                            continue
                        if event is _wire.DONE:
                            finished = True
                            break
                        assert isinstance(event, dict)
                        if "error" in event:
                            raise _stream_error(event, backend)
                        acc.feed(event)
                        held.append(event)
                        if yielded == 0 and not acc.carries_output(event):
                            continue
                        for chunk in held:
                            yielded += 1
                            yield chunk
                        held.clear()
                    if not finished and acc.finish_reason is None:
                        raise BackendUnavailableError(backend, "stream ended without [DONE]")
            except _wire.TooManyRequests as exc:
                if not retry.retry_on_429:
                    raise ServerRefusedError(429, str(exc), backend=backend) from exc
                last = ServerRefusedError(429, str(exc), backend=backend)
                continue
            except _TRANSIENT as exc:
                self._client._core.mark_down(backend, repr(exc))
                if yielded:
                    raise StreamInterruptedError(
                        backend, received_text=acc.text, received_chunks=yielded, cause=exc
                    ) from exc
                last = _as_unavailable(backend, exc)
                continue
            for chunk in held:
                yield chunk
            stream._result = self._core.record_stream(params["messages"], acc, backend, attempt)
            return
        assert last is not None
        raise last


class AsyncChatStream:
    """Async twin of :class:`ChatStream`: ``async with`` it, ``async for`` its chunks."""

    def __init__(
        self,
        session: AsyncSession,
        params: Mapping[str, Any],
        extra_headers: Mapping[str, str] | None,
    ) -> None:
        self._result: ChatResult | None = None
        self._iter = session._stream(self, params, extra_headers)

    @property
    def result(self) -> ChatResult | None:
        return self._result

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self

    async def __anext__(self) -> dict[str, Any]:
        return await self._iter.__anext__()

    async def until_done(self) -> ChatResult:
        async for _ in self:
            pass
        assert self._result is not None
        return self._result

    async def aclose(self) -> None:
        await self._iter.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _as_unavailable(backend: str, exc: BaseException) -> BackendUnavailableError:
    if isinstance(exc, BackendUnavailableError):
        return exc
    if isinstance(exc, json.JSONDecodeError):
        return BackendUnavailableError(backend, f"malformed JSON response: {exc}")
    return BackendUnavailableError(backend, f"{type(exc).__name__}: {exc}")
