"""Sessions: one agent trajectory's calls, pinned to one backend, with failover.

:class:`Session` (sync) and :class:`AsyncSession` (async) have the same methods; the async
ones are coroutines, and ``stream_chat`` returns an (async) iterable stream in both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from httpx_sse import aconnect_sse

from agentspec.wire import SEEDS_PATH

from . import _wire, protocol
from ._core import SessionCore, chat_params, token_params
from ._inflight import AsyncGuard, SyncStreamPump, anext_or_none, run_guarded
from .attempts import Attempt
from .history import Seed
from .retrying import AsyncAttemptIterator, AttemptIterator
from .types import ChatResult, SeedReceipt, SessionStats, TokenCompletion, Turn

if TYPE_CHECKING:
    from .client import AgentSpecClient, AsyncAgentSpecClient

__all__ = ["AsyncChatStream", "AsyncSession", "ChatStream", "Session"]

_CHAT_PATH = "/v1/chat/completions"
_COMPLETIONS_PATH = "/v1/completions"
# The loops below leave only by returning from the attempt's block or by the error the
# retry machine (agentspec.client.attempts) stops the call with.
_UNREACHABLE = "unreachable: a call's attempts end by returning or raising"


def _stream_attempt(
    core: SessionCore,
    attempt: Attempt,
    params: Mapping[str, Any],
    extra_headers: Mapping[str, str] | None,
    resumable: bool,
    strip: bool,
) -> tuple[_wire.StreamReader, str | None, dict[str, str], dict[str, Any], int]:
    """One streamed attempt: its reader, URL (None when a resumed stream has nothing left to
    generate), headers, body and pending seeds. An attempt that resumes a cut stream asks
    for a text completion continuing from the token ids already delivered."""
    resume = attempt.resume_from
    if resume is None:
        headers, body, n_pending = core.prepare(attempt.backend, params, extra_headers)
        reader = _wire.StreamReader(attempt, resumable=resumable, strip=strip)
        return reader, attempt.backend + _CHAT_PATH, headers, body, n_pending
    reader = _wire.StreamReader(attempt, resumable=True, strip=strip, completion=True)
    rest = _wire.resume_params(params, resume)
    if rest is None:
        return reader, None, {}, {}, 0
    headers, body, n_pending = core.prepare(attempt.backend, rest, extra_headers)
    return reader, attempt.backend + _COMPLETIONS_PATH, headers, body, n_pending


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

    def _stats_request(self, backend: str) -> protocol.StatsRequest:
        return protocol.session_stats_request(backend, self.session_id, headers=self._headers())

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"backend={self.backend!r}"
        return (
            f"<{type(self).__name__} {self.session_id!r} group={self.group_id!r} turns={len(self._core.turns)} {state}>"
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

        A failure before any output reached the caller is retried on a healthy backend; after
        output, a plain-text stream is resumed there from the tokens delivered (the caller
        sees one stream), any other raises :class:`StreamInterruptedError` saying what was
        received (see docs/client.md, "Resumed streams").
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
        for attempt in self._attempts(stats=True):
            with attempt:
                request = self._stats_request(attempt.backend)
                get = partial(self._client._http.get, request.url, params=request.params, headers=request.headers)
                response = run_guarded(attempt, get)
                return protocol.read_session_stats(response, attempt.backend, self.session_id)
        raise AssertionError(_UNREACHABLE)

    # -- the I/O of one attempt; the retry machine decides the rest -----------------------

    def _attempts(self, *, stats: bool = False) -> AttemptIterator:
        return AttemptIterator(self._core.attempts(stats=stats), probe=self._client.check_health)

    def _post(
        self, path: str, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> tuple[dict[str, Any], str, int]:
        for attempt in self._attempts():
            with attempt:
                headers, body, n_pending = self._core.prepare(attempt.backend, params, extra_headers)
                post = partial(self._client._http.post, attempt.backend + path, json=body, headers=headers)
                response = run_guarded(attempt, post)
                data = protocol.response_json(response, attempt.backend)
                self._core.delivered(attempt.backend, n_pending)
                return data, attempt.backend, attempt.number
        raise AssertionError(_UNREACHABLE)

    def _stream(
        self, stream: ChatStream, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> Iterator[dict[str, Any]]:
        params, resumable, strip = _wire.stream_params(params, self._client.config.retry.resume_streams)
        for attempt in self._attempts():
            with attempt:
                reader, url, headers, body, n_pending = _stream_attempt(
                    self._core, attempt, params, extra_headers, resumable, strip
                )
                if url is None:
                    yield from reader.feed(_wire.finish_chunk())
                else:
                    pump = SyncStreamPump(attempt, self._client._http, url, body, headers)
                    try:
                        response = pump.open()
                        if response.status_code >= 300:
                            protocol.check_response(response, attempt.backend)
                        self._core.delivered(attempt.backend, n_pending)
                        for data in pump.events():
                            yield from reader.feed(data)
                            if reader.done:
                                break
                    finally:
                        pump.close(abort=not reader.done)
                yield from reader.finish()
                stream._result = self._core.record_stream(
                    params["messages"], reader.acc, attempt.backend, attempt.number
                )
                return


class ChatStream:
    """An iterator over the chunks (dicts, as the server sent them) of one streamed chat call.

    Use it in a ``with`` block, or iterate it to the end; ``result`` (a :class:`ChatResult`
    with the whole message) is set once the stream has ended. Closing it early records no turn.
    """

    def __init__(self, session: Session, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None) -> None:
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
        async for attempt in self._attempts(stats=True):
            with attempt:
                request = self._stats_request(attempt.backend)
                get = self._client._http.get(request.url, params=request.params, headers=request.headers)
                response = await AsyncGuard(attempt).run(get)
                return protocol.read_session_stats(response, attempt.backend, self.session_id)
        raise AssertionError(_UNREACHABLE)

    def _attempts(self, *, stats: bool = False) -> AsyncAttemptIterator:
        return AsyncAttemptIterator(self._core.attempts(stats=stats), probe=self._client.check_health)

    async def _post(
        self, path: str, params: Mapping[str, Any], extra_headers: Mapping[str, str] | None
    ) -> tuple[dict[str, Any], str, int]:
        async for attempt in self._attempts():
            with attempt:
                headers, body, n_pending = self._core.prepare(attempt.backend, params, extra_headers)
                guard = AsyncGuard(attempt)
                response = await guard.run(self._client._http.post(attempt.backend + path, json=body, headers=headers))
                data = protocol.response_json(response, attempt.backend)
                self._core.delivered(attempt.backend, n_pending)
                return data, attempt.backend, attempt.number
        raise AssertionError(_UNREACHABLE)

    async def _stream(
        self,
        stream: AsyncChatStream,
        params: Mapping[str, Any],
        extra_headers: Mapping[str, str] | None,
    ) -> AsyncIterator[dict[str, Any]]:
        params, resumable, strip = _wire.stream_params(params, self._client.config.retry.resume_streams)
        async for attempt in self._attempts():
            with attempt:
                reader, url, headers, body, n_pending = _stream_attempt(
                    self._core, attempt, params, extra_headers, resumable, strip
                )
                if url is None:
                    for chunk in reader.feed(_wire.finish_chunk()):
                        yield chunk
                else:
                    guard = AsyncGuard(attempt)
                    async with AsyncExitStack() as stack:
                        source = await guard.run(
                            stack.enter_async_context(
                                aconnect_sse(self._client._http, "POST", url, json=body, headers=headers)
                            )
                        )
                        if source.response.status_code >= 300:
                            await guard.run(source.response.aread())
                            protocol.check_response(source.response, attempt.backend)
                        self._core.delivered(attempt.backend, n_pending)
                        events = await stack.enter_async_context(aclosing(source.aiter_sse()))
                        while (event := await guard.run(anext_or_none(events))) is not None:
                            for chunk in reader.feed(event.data):
                                yield chunk
                            if reader.done:
                                break
                for chunk in reader.finish():
                    yield chunk
                stream._result = self._core.record_stream(
                    params["messages"], reader.acc, attempt.backend, attempt.number
                )
                return


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
