"""agentspec's protocol for integrations: what a request carries, and the session-stats call.

The names on the wire live in :mod:`agentspec.wire`; this module puts them together the one
way every agentspec client does, so that a framework integration writes none of it again:

- the headers and body fields that tie a request to a session and group
  (:func:`session_headers`, :func:`session_xargs`, :func:`with_session`), with seeds
  (:func:`seeds_field`, :func:`seeds_request_body`);
- the session-stats request (:func:`session_stats_request`) and the reading of its answer
  into :class:`~agentspec.client.SessionStats` (:func:`read_session_stats`);
- the one mapping of an HTTP answer to the client's exceptions (:func:`check_response`).

It performs no I/O of its own: the caller owns the HTTP client (its transport, timeouts and
pool). :func:`fetch_session_stats` and :func:`afetch_session_stats` are the one-call
twins for an ``httpx.Client`` and an ``httpx.AsyncClient`` the caller passes in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from agentspec.wire import (
    BODY_SESSION_FIELD,
    CACHE_SALT_FIELD,
    GROUP_HEADER,
    SEEDS_FIELD,
    SESSION_HEADER,
    SESSION_STATS_PATH,
    XARG_GROUP,
    XARG_SESSION,
    XARGS_FIELD,
)

from .attempts import parse_retry_after
from .errors import AuthenticationError, BackendUnavailableError, ServerRefusedError, SessionNotFoundError
from .history import Seed
from .types import SessionStats

__all__ = [
    "StatsRequest",
    "afetch_session_stats",
    "check_response",
    "error_message",
    "fetch_session_stats",
    "read_session_stats",
    "response_json",
    "seeds_field",
    "seeds_request_body",
    "session_headers",
    "session_stats_request",
    "session_stats_url",
    "session_xargs",
    "with_session",
]

# ---------------------------------------------------------------------------- what a request carries


def session_headers(
    session_id: str | None,
    group_id: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """``base`` plus the headers that name the session and group (``X-Session-Id``,
    ``X-Group-Id``), which routers in front of the servers hash.

    The group defaults to the session, so a router hashing ``X-Group-Id`` keeps a session
    without a group in one place too. The ids are set last: a header of the caller's must
    not split one session across servers. Without ids, ``base`` unchanged.
    """
    headers = dict(base or {})
    if session_id is not None:
        headers[SESSION_HEADER] = session_id
    group = group_id or session_id
    if group is not None:
        headers[GROUP_HEADER] = group
    return headers


def session_xargs(
    session_id: str | None,
    group_id: str | None = None,
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``base`` (a request's ``vllm_xargs``) plus the session and group ids; the group
    defaults to the session, as in :func:`session_headers`."""
    xargs = dict(base or {})
    if session_id is not None:
        xargs[XARG_SESSION] = session_id
    group = group_id or session_id
    if group is not None:
        xargs[XARG_GROUP] = group
    return xargs


def seeds_field(seeds: Iterable[Seed | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Seeds as the entries of ``agentspec_seeds`` (build one with :meth:`Seed.of`)."""
    return [seed.to_wire() if isinstance(seed, Seed) else dict(seed) for seed in seeds]


def with_session(
    body: Mapping[str, Any],
    session_id: str | None,
    group_id: str | None = None,
    seeds: Iterable[Seed | Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A copy of a generation request's JSON ``body`` tied to a session and group.

    The ids go into ``vllm_xargs`` (merged with what the body holds, the ids winning), and
    ``seeds`` after any ``agentspec_seeds`` the body already carries. Without ids the body
    keeps its ``vllm_xargs`` as it was.
    """
    out = dict(body)
    if session_id is not None or group_id is not None:
        out[XARGS_FIELD] = session_xargs(session_id, group_id, out.get(XARGS_FIELD))
    wire_seeds = seeds_field(seeds)
    if wire_seeds:
        out[SEEDS_FIELD] = [*(out.get(SEEDS_FIELD) or []), *wire_seeds]
    return out


def seeds_request_body(
    session_id: str | None,
    seeds: Iterable[Seed | Mapping[str, Any]],
    *,
    group_id: str | None = None,
    cache_salt: str | None = None,
) -> dict[str, Any]:
    """The body of ``POST /agentspec/v1/seeds`` (seeds without generating).

    The session goes in the request's ``session_id`` field, a group (when given) in
    ``vllm_xargs``; ``cache_salt`` narrows the tenant the seeds are filed under, as it does
    for a generation request.
    """
    body: dict[str, Any] = {SEEDS_FIELD: seeds_field(seeds)}
    if session_id is not None:
        body[BODY_SESSION_FIELD] = session_id
    if group_id is not None:
        body[XARGS_FIELD] = {XARG_GROUP: group_id}
    if cache_salt is not None:
        body[CACHE_SALT_FIELD] = cache_salt
    return body


# ---------------------------------------------------------------------------- one error mapping


def error_message(response: httpx.Response) -> tuple[str, Any]:
    """The server's explanation of an error response, and the parsed body (the text when it
    is not JSON). The response body must have been read."""
    try:
        body: Any = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        text = response.text.strip()
        return (text or response.reason_phrase or "no message"), text
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            return err["message"], body
        if isinstance(err, str):
            return err, body
        for key in ("message", "detail"):
            if isinstance(body.get(key), str):
                return body[key], body
    return json.dumps(body)[:500], body


def _param(body: Any) -> str | None:
    """The ``param`` of a wire error body (:func:`agentspec.wire.error_body`)."""
    err = body.get("error") if isinstance(body, Mapping) else None
    param = err.get("param") if isinstance(err, Mapping) else None
    return param if isinstance(param, str) else None


def check_response(response: httpx.Response, backend: str, *, session_id: str | None = None) -> None:
    """Raise the client's exception for an answer that is not a success; None for a 2xx.

    - 5xx: :class:`BackendUnavailableError` (the server failed; another one may take it);
    - 401, 403: :class:`AuthenticationError` (the API key is missing or wrong);
    - 404 to a request about a session (``session_id`` given):
      :class:`SessionNotFoundError` naming the session and the backend;
    - any other 4xx: :class:`ServerRefusedError` with the server's message and, from a wire
      error body, the ``param`` it names (429 too: a retry policy may retry it).

    Every one carries the server's ``Retry-After``. The response body must have been read.
    """
    code = response.status_code
    if 200 <= code < 300:
        return
    message, body = error_message(response)
    retry_after = parse_retry_after(response.headers, time.time())
    if code >= 500:
        raise BackendUnavailableError(backend, f"{code}: {message}", status_code=code, retry_after_s=retry_after)
    details: dict[str, Any] = {"backend": backend, "body": body, "retry_after_s": retry_after, "param": _param(body)}
    if code in (401, 403):
        raise AuthenticationError(code, message, **details)
    if code == 404 and session_id is not None:
        raise SessionNotFoundError(code, message, session_id=session_id, **details)
    raise ServerRefusedError(code, message, **details)


def response_json(response: httpx.Response, backend: str, *, session_id: str | None = None) -> Any:
    """The JSON of a successful answer; raises as :func:`check_response` does, and
    :class:`BackendUnavailableError` for a body that is not JSON."""
    check_response(response, backend, session_id=session_id)
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BackendUnavailableError(backend, f"malformed JSON response: {exc}") from exc


# ---------------------------------------------------------------------------- session statistics


def session_stats_url(backend: str, session_id: str) -> str:
    """``GET`` this URL for one session's statistics on the server at ``backend`` (its base
    URL, without ``/v1``)."""
    # Ids may hold '/', which must not split the path.
    return f"{backend.rstrip('/')}{SESSION_STATS_PATH}{quote(session_id, safe='')}"


@dataclass(frozen=True, slots=True)
class StatsRequest:
    """The ``GET`` of one session's statistics, ready for any HTTP client:
    ``http.get(r.url, params=r.params, headers=r.headers)``."""

    backend: str
    session_id: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


def session_stats_request(
    backend: str,
    session_id: str,
    *,
    headers: Mapping[str, str] | None = None,
    cache_salt: str | None = None,
) -> StatsRequest:
    """The request for one session's statistics.

    ``headers`` are sent as given: the caller's key (``Authorization``) and the headers a
    router in front hashes, which must take the request to the server that holds the
    session (:func:`session_headers` writes agentspec's). A session is read within the
    caller's tenant: the API key and, when its calls sent one, their ``cache_salt``, which
    goes as a query parameter here.
    """
    params = {CACHE_SALT_FIELD: cache_salt} if cache_salt is not None else {}
    return StatsRequest(backend, session_id, session_stats_url(backend, session_id), dict(headers or {}), params)


def read_session_stats(response: httpx.Response, backend: str, session_id: str) -> SessionStats:
    """The statistics in an answer to :func:`session_stats_request`, with ``backend`` filled
    in; raises as :func:`check_response` does (a 404 is :class:`SessionNotFoundError`), and
    :class:`BackendUnavailableError` for a body that is not a JSON object."""
    data = response_json(response, backend, session_id=session_id)
    if not isinstance(data, Mapping):
        raise BackendUnavailableError(backend, f"malformed statistics of session {session_id!r}: not a JSON object")
    return SessionStats.model_validate({**data, "backend": backend})


def _unreachable(request: StatsRequest, exc: httpx.TransportError) -> BackendUnavailableError:
    reason = f"could not be reached for the statistics of session {request.session_id!r}: {exc!r}"
    return BackendUnavailableError(request.backend, reason)


def fetch_session_stats(
    http: httpx.Client,
    backend: str,
    session_id: str,
    *,
    headers: Mapping[str, str] | None = None,
    cache_salt: str | None = None,
) -> SessionStats:
    """One session's statistics from the server at ``backend``, through the caller's client.

    Raises:
        SessionNotFoundError: that server holds no state for the session.
        AuthenticationError: the server refused the API key.
        ServerRefusedError: any other 4xx.
        BackendUnavailableError: the server could not be reached, or answered 5xx or
            something that is not statistics.
    """
    request = session_stats_request(backend, session_id, headers=headers, cache_salt=cache_salt)
    try:
        response = http.get(request.url, params=request.params, headers=request.headers)
    except httpx.TransportError as exc:
        raise _unreachable(request, exc) from exc
    return read_session_stats(response, backend, session_id)


async def afetch_session_stats(
    http: httpx.AsyncClient,
    backend: str,
    session_id: str,
    *,
    headers: Mapping[str, str] | None = None,
    cache_salt: str | None = None,
) -> SessionStats:
    """Async twin of :func:`fetch_session_stats`."""
    request = session_stats_request(backend, session_id, headers=headers, cache_salt=cache_salt)
    try:
        response = await http.get(request.url, params=request.params, headers=request.headers)
    except httpx.TransportError as exc:
        raise _unreachable(request, exc) from exc
    return read_session_stats(response, backend, session_id)
