"""Exceptions raised by the agentspec client.

Everything the client raises on purpose derives from :class:`AgentSpecClientError`, so a
caller can catch one type. Errors that are also the caller's fault keep a familiar base
(:class:`InvalidIdError` and :class:`InvalidSeedError` are ``ValueError`` too) so existing
``except ValueError`` handlers keep working.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentspec.wire import ID_RULE

__all__ = [
    "AgentSpecClientError",
    "AuthenticationError",
    "BackendUnavailableError",
    "ClientClosedError",
    "InvalidIdError",
    "InvalidSeedError",
    "NoHealthyBackendError",
    "ServerRefusedError",
    "SessionClosedError",
    "SessionNotFoundError",
    "StreamInterruptedError",
]


class AgentSpecClientError(Exception):
    """Base class of every error the agentspec client raises."""


class InvalidIdError(AgentSpecClientError, ValueError):
    """A session or group id breaks the wire rule: 1–128 chars of ``[A-Za-z0-9._:@/-]``."""

    def __init__(self, field: str, value: object) -> None:
        self.field = field
        self.value = value
        super().__init__(f"invalid {field} {value!r}: ids are {ID_RULE}")


class InvalidSeedError(AgentSpecClientError, ValueError):
    """A seed is malformed (empty, wrong kind or scope, bad token ids) or over a limit."""


class SessionClosedError(AgentSpecClientError):
    """A call was made on a session that has been closed."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} is closed")


class ClientClosedError(AgentSpecClientError):
    """A call was made through a client that has been closed."""

    def __init__(self) -> None:
        super().__init__("the agentspec client is closed")


class NoHealthyBackendError(AgentSpecClientError):
    """Every configured backend is marked down (and a fresh probe found none back)."""

    def __init__(self, backends: Sequence[str], last_error: BaseException | None = None) -> None:
        self.backends = tuple(backends)
        self.last_error = last_error
        detail = f"; last error: {last_error!r}" if last_error is not None else ""
        super().__init__(
            f"no healthy backend among {len(self.backends)} configured ({', '.join(self.backends)}){detail}"
        )


class BackendUnavailableError(AgentSpecClientError):
    """One backend failed a call (connection error, timeout or 5xx).

    The client handles it by marking the backend down and failing over; callers see it only
    as the ``last_error`` of a :class:`NoHealthyBackendError` or when retries run out.
    """

    def __init__(
        self,
        backend: str,
        reason: str,
        status_code: int | None = None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        self.backend = backend
        self.reason = reason
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        """The server's ``Retry-After`` in seconds (a 503 may send one), else None."""
        super().__init__(f"backend {backend} failed: {reason}")


class ServerRefusedError(AgentSpecClientError):
    """The server answered 4xx: the request itself is wrong and retrying will not help.

    ``message`` is the server's own explanation (vLLM's ``error.message`` when present).
    A 429 ("too many requests") is retried on the same backend first (``RetryPolicy``);
    it is raised when retries run out or ``retry_on_429`` is off.
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        backend: str,
        body: Any = None,
        retry_after_s: float | None = None,
        param: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.message = message
        self.backend = backend
        self.body = body
        self.retry_after_s = retry_after_s
        """The server's ``Retry-After`` in seconds (429 and 503 may send one), else None."""
        self.param = param
        """The request field the server named as wrong (the wire error body's ``param``), else None."""
        super().__init__(self._describe())

    def _describe(self) -> str:
        return f"{self.backend} refused the request ({self.status_code}): {self.message}"


class AuthenticationError(ServerRefusedError):
    """The server answered 401 or 403: it was started with ``--api-key`` and the request
    carried no key, or another one."""

    def _describe(self) -> str:
        return (
            f"{self.backend} refused the API key ({self.status_code}): {self.message}; "
            "pass the key the server was started with (--api-key)"
        )


class SessionNotFoundError(ServerRefusedError):
    """``GET /agentspec/v1/sessions/{id}``: the server holds no state for the session.

    Either no call of the session has reached that server yet, or the server evicted it.
    ``session_id`` names the session asked for (None when the caller did not say).
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        backend: str,
        body: Any = None,
        retry_after_s: float | None = None,
        param: str | None = None,
        session_id: str | None = None,
    ) -> None:
        self.session_id = session_id
        super().__init__(status_code, message, backend=backend, body=body, retry_after_s=retry_after_s, param=param)

    def _describe(self) -> str:
        if self.session_id is None:
            return super()._describe()
        return (
            f"{self.backend} holds no state for session {self.session_id!r} ({self.status_code}): "
            "no call of the session has reached that server yet, or the server evicted it"
        )


class StreamInterruptedError(AgentSpecClientError):
    """A streamed response broke after part of it had reached the caller, and could not be
    resumed (tools, structured output, several choices, log-probabilities: see
    docs/client.md, "Resumed streams"; or its resumptions ran out of attempts).

    The client cannot retry transparently (the caller has already consumed output), so it
    says exactly what was received; the backend has been marked down and the session's next
    call goes to a healthy one, re-seeded with the session's history. The interrupted call
    is not recorded as a turn.
    """

    def __init__(
        self,
        backend: str,
        *,
        received_text: str,
        received_chunks: int,
        cause: BaseException | None = None,
    ) -> None:
        self.backend = backend
        self.received_text = received_text
        self.received_chunks = received_chunks
        self.cause = cause
        preview = received_text if len(received_text) <= 80 else received_text[:77] + "..."
        super().__init__(
            f"stream from {backend} was cut after {received_chunks} chunk(s) "
            f"({len(received_text)} characters received: {preview!r})" + (f": {cause!r}" if cause is not None else "")
        )
