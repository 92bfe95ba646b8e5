"""One call's attempts: a sans-I/O state machine for retries, failover and pinning.

The sync and async sessions, the router's helpers and the framework integrations all drive
this one machine; they do the I/O (send, sleep, probe) and report what happened, the machine
decides what comes next. It reads no clock and sleeps nowhere, so every transition is
testable without a server (tests/client/test_attempts.py).

A shell's loop::

    machine = router.attempts(key, policy)
    while not machine.done:
        action = machine.next_action()    # raises when the call cannot go on
        if isinstance(action, Wait):      # backoff, or the server's Retry-After
            sleep(action.seconds)
        elif isinstance(action, Probe):   # no backend is up: probe the down ones once
            probe(action.backends)
        else:                             # an Attempt on action.backend
            with action:                  # reports success, or classifies the failure and
                result = send(action)     # suppresses it when the machine retries

What an outcome means:

- success: the backend took the request (``delivered``); the call is over;
- a backend failure (connection error, timeout, 5xx, a broken stream): the backend is
  marked down with :func:`describe`'s reason and the next attempt goes elsewhere while
  another backend is a candidate (the group is re-pinned, so a session re-seeds its history
  there); after output reached the caller, a stream the shell marked resumable
  (``Received.resumable``: plain text, token ids known) goes on in a next attempt that
  carries the output as ``resume_from``; any other call stops with
  :class:`~agentspec.client.StreamInterruptedError`, carrying what was received;
- the backend marked down while the attempt is in flight (``Attempt.on_mark_down``): the
  shell interrupts its I/O and raises ``attempt.interrupted()``, a backend failure;
- 429 (busy): the same backend later, if the policy retries 429s; nothing is marked down;
- any other error (4xx, or one the classifier does not know): raised at once;
- no candidate backend: one :class:`Probe` (when the shell can probe), then
  :class:`~agentspec.client.NoHealthyBackendError`;
- ``max_attempts`` attempts made: the last error is raised.

Before every attempt the caller's ``check_open`` runs, so a session closed between two
attempts (during a backoff, say) stops there.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from enum import StrEnum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from .config import RetryPolicy
from .errors import (
    BackendUnavailableError,
    NoHealthyBackendError,
    ServerRefusedError,
    StreamInterruptedError,
)

if TYPE_CHECKING:
    from .router import BackendRouter

logger = logging.getLogger(__name__)

__all__ = [
    "Attempt",
    "CallAttempts",
    "Classifier",
    "Failure",
    "FailureKind",
    "Probe",
    "Received",
    "Wait",
    "classify_error",
    "describe",
    "parse_retry_after",
]


# ---------------------------------------------------------------------------- outcomes


class FailureKind(StrEnum):
    """What a failed attempt says."""

    BACKEND = "backend"
    """The backend failed (connection error, timeout, 5xx, a broken stream): mark it down,
    fail over."""
    BUSY = "busy"
    """The backend is up but busy (429): retry it later, mark nothing."""
    REFUSED = "refused"
    """The request itself is at fault (another 4xx), or the error is not a transport one:
    raise at once."""


@dataclass(frozen=True)
class Failure:
    """A failed attempt, classified."""

    kind: FailureKind
    error: BaseException
    """What the caller sees when the call stops on this failure."""
    reason: str | None = None
    """The reason recorded in the backend's health state; :func:`describe` of ``error``
    when None."""
    retry_after_s: float | None = None
    """The server's ``Retry-After`` in seconds, when it sent one."""


Classifier = Callable[[BaseException, str], Failure]
"""``classify(error, backend) -> Failure``: what an exception raised by an attempt means."""


def describe(exc: BaseException) -> str:
    """The one format of a failure's reason in a backend's health state: ``Type: message``
    (a :class:`BackendUnavailableError`'s own reason, which is already in that form)."""
    if isinstance(exc, BackendUnavailableError):
        return exc.reason
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify_error(exc: BaseException, backend: str) -> Failure:
    """The default classifier, for agentspec's own errors.

    :class:`BackendUnavailableError` → backend failure; :class:`ServerRefusedError` 429 →
    busy; anything else → refused (raised unchanged). A shell turns its transport's errors
    into :class:`BackendUnavailableError` first.
    """
    if isinstance(exc, BackendUnavailableError):
        return Failure(FailureKind.BACKEND, exc, exc.reason, exc.retry_after_s)
    if isinstance(exc, ServerRefusedError) and exc.status_code == 429:
        return Failure(FailureKind.BUSY, exc, retry_after_s=exc.retry_after_s)
    return Failure(FailureKind.REFUSED, exc)


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds to wait before retrying, from a response's headers; None when absent or
    unreadable.

    ``retry-after-ms`` (milliseconds, sent by some OpenAI-compatible servers) wins, then
    ``Retry-After`` as seconds or as an HTTP date, relative to ``now`` (UNIX time). May be
    zero or negative (a date in the past): the machine then falls back to its backoff.
    """
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = _header(headers, name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        return None if math.isnan(seconds) else seconds
    value = _header(headers, "retry-after")
    if value is None:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT
        when = when.replace(tzinfo=UTC)
    return when.timestamp() - now


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    for key, value in headers.items():  # a plain dict: look names up case-insensitively
        if key.lower() == name:
            return value
    return None


# ---------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Wait:
    """Sleep this long, then ask for the next action."""

    seconds: float


@dataclass(frozen=True)
class Probe:
    """No backend is a candidate: probe these (``GET /health``), then ask again."""

    backends: tuple[str, ...]


@dataclass
class Received:
    """Output of a call that has already reached the caller.

    Once it is non-empty the call cannot be retried without repeating it. It can be resumed
    when the shell says so (``resumable``: a plain-text stream whose prompt and output
    token ids are known): the next attempt then carries it as
    :attr:`Attempt.resume_from` and continues the output from ``token_ids``.
    """

    chunks: int = 0
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    """The output's token ids, as far as the caller has received them."""
    prompt_token_ids: list[int] | None = None
    """The prompt's token ids, as the server rendered them."""
    resumable: bool = False
    """Whether the shell can continue this output elsewhere exactly from ``token_ids``."""
    state: Any = None
    """The shell's own record of the output (its accumulator), handed to the resumption."""

    def __bool__(self) -> bool:
        return self.chunks > 0

    def copy(self) -> Received:
        return Received(self.chunks, self.text, list(self.token_ids), self.prompt_token_ids, self.resumable, self.state)


class Attempt:
    """One attempt of a call, on one backend. Use it as a context manager around the I/O:
    leaving the block normally reports success; an ``Exception`` is classified, and
    suppressed when the machine retries. Other exceptions (cancellation, ``GeneratorExit``)
    end the call without marking anything."""

    def __init__(self, machine: CallAttempts, number: int, backend: str, previous_backend: str | None) -> None:
        self.number = number
        """1 for the first attempt."""
        self.backend = backend
        """The base URL to send this attempt to."""
        self.previous_backend = previous_backend
        """The previous attempt's backend (None for the first one)."""
        self.received = Received()
        """What reached the caller: this attempt's output, after :attr:`resume_from`'s."""
        self.resume_from: Received | None = None
        """The output of the call's earlier attempts, when this attempt resumes a stream
        cut after output: it continues from those token ids instead of starting over."""
        self.cancelled: str | None = None
        """Why the attempt was cancelled (its backend was marked down while it was in
        flight), or None."""
        self._machine = machine
        self._watch: int | None = None

    def on_mark_down(self, cancel: Callable[[str], object]) -> None:
        """Call ``cancel(reason)`` if the attempt's backend is marked down (by a health
        probe, or another call's failure) while the attempt is in flight. The shell's
        ``cancel`` interrupts its I/O (a cancel scope, a closed connection); the attempt's
        block then raises a :class:`BackendUnavailableError` (:meth:`interrupted` says
        which), and the machine retries elsewhere as after any transport failure. Must not
        block. One callback per attempt; a later call replaces it."""

        def fire(reason: str) -> None:
            if self.cancelled is None:
                self.cancelled = reason
            cancel(reason)

        router = self._machine.router
        if self._watch is not None:
            router.unwatch(self._watch)
        self._watch = router.watch(self.backend, fire)

    def interrupted(self) -> BackendUnavailableError:
        """The error an attempt cancelled by a mark-down raises from its block."""
        return BackendUnavailableError(
            self.backend, f"cancelled in flight: marked down ({self.cancelled or 'no reason'})"
        )

    def _unwatch(self) -> None:
        if self._watch is not None:
            self._machine.router.unwatch(self._watch)
            self._watch = None

    def output(self, text: str = "", chunks: int = 1) -> None:
        """Record output handed to the caller (a streamed chunk and its text)."""
        self.received.chunks += chunks
        self.received.text += text

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        machine = self._machine
        if exc is None:
            machine.succeeded(self)
            return False
        if not isinstance(exc, Exception):
            machine.abandoned(self)
            return False
        error = machine.failed(self, exc)
        if error is None:
            return True  # the machine retries: the loop asks for the next action
        if error is exc or machine.reraise:
            return False
        raise error from exc

    def __repr__(self) -> str:
        return f"<Attempt {self.number} on {self.backend}>"


# ---------------------------------------------------------------------------- the machine


class CallAttempts:
    """The attempts of one call: which backend, how long to wait, when to give up.

    ``router`` supplies the candidates, the pins and the health marks; ``key`` is the
    call's pin key (its group; None spreads key-less calls round-robin). ``check_open``
    runs before every attempt. ``classify`` turns an attempt's exception into a
    :class:`Failure` (default :func:`classify_error`). ``prefer`` is a backend the first
    attempt goes to when it is a candidate (a session's stats live where its history is).
    ``probe``: whether the shell can probe (else no :class:`Probe` is asked for).
    ``reraise``: shells of frameworks with their own error types re-raise the attempt's
    original exception when the call stops, rather than agentspec's. ``rng`` draws the jitter.

    Not thread-safe: one call, one driver. The router it uses is.
    """

    def __init__(
        self,
        router: BackendRouter,
        key: str | None,
        policy: RetryPolicy | None = None,
        *,
        check_open: Callable[[], None] | None = None,
        classify: Classifier = classify_error,
        prefer: str | None = None,
        probe: bool = False,
        reraise: bool = False,
        rng: random.Random | None = None,
    ) -> None:
        self.router = router
        self.key = key
        self.policy = policy if policy is not None else RetryPolicy()
        self.reraise = reraise
        self.attempts: list[Attempt] = []
        """Attempts made so far, in order."""
        self.delays: list[float] = []
        """The delay chosen before each retry (0 when none was waited)."""
        self.last_error: BaseException | None = None
        self.done = False
        """Whether the call is over (it succeeded, stopped, or was abandoned)."""
        self.delivered: Attempt | None = None
        """The attempt that succeeded."""
        self._check_open = check_open
        self._classify = classify
        self._prefer = prefer
        self._can_probe = probe
        self._uniform = (rng if rng is not None else random.Random()).random
        self._current: Attempt | None = None
        self._failed_on: list[str] = []  # backends that failed this call, in order
        self._retry_after: tuple[str, float] | None = None
        self._waited = False
        self._probed = False
        self._previous_delay: float | None = None
        self._resume: Received | None = None

    # -- what next ------------------------------------------------------------------------

    def next_action(self) -> Wait | Probe | Attempt:
        """The next thing to do: wait, probe, or make an attempt.

        Raises ``check_open``'s error, or :class:`NoHealthyBackendError` when no backend is
        a candidate (after one probe, when the shell can probe).
        """
        if self.done:
            raise RuntimeError("this call is over")
        if self._current is not None:
            raise RuntimeError(f"attempt {self._current.number} has not reported its outcome")
        if self._check_open is not None:
            self._check_open()
        backend = self._select()
        if backend is None:
            if self._can_probe and not self._probed:
                self._probed = True
                return Probe(tuple(self.router.down()))
            self.done = True
            raise NoHealthyBackendError(self.router.backends, self.last_error)
        if self.attempts and not self._waited:
            self._waited = True
            delay = self._delay_before(backend)
            self.delays.append(delay)
            if delay > 0:
                return Wait(delay)
        previous = self.attempts[-1].backend if self.attempts else None
        attempt = Attempt(self, len(self.attempts) + 1, backend, previous)
        if self._resume is not None:
            attempt.resume_from = self._resume
            attempt.received = self._resume.copy()
        self.attempts.append(attempt)
        self._current = attempt
        self._waited = self._probed = False
        return attempt

    def _select(self) -> str | None:
        if not self.attempts and self._prefer is not None and self.router.is_candidate(self._prefer):
            return self._prefer
        # A backend that failed this call is taken again only when nothing else is left.
        return self.router.resolve(self.key, exclude=self._failed_on)

    def _delay_before(self, backend: str) -> float:
        if self._retry_after is not None and self._retry_after[0] == backend:
            # The server said when: believe it, within the cap (the openai SDK's rule).
            return max(0.0, min(self._retry_after[1], self.policy.retry_after_max_s))
        delay = self.policy.backoff(len(self.attempts) + 1, self._uniform, self._previous_delay)
        self._previous_delay = delay
        return max(0.0, delay)

    # -- outcomes -------------------------------------------------------------------------

    def succeeded(self, attempt: Attempt) -> None:
        """``attempt``'s backend took the request: the call is over."""
        self._finish(attempt)
        self.router.record_success(attempt.backend)
        self.delivered = attempt
        self.done = True

    def abandoned(self, attempt: Attempt) -> None:
        """The caller gave up on ``attempt`` (cancelled, or closed a stream): nothing is
        marked, the call is over."""
        self._finish(attempt)
        self.done = True

    def failed(self, attempt: Attempt, error: BaseException) -> BaseException | None:
        """``attempt`` raised ``error``. Returns None when the call goes on (ask for the next
        action), else the exception the call ends with."""
        self._finish(attempt)
        failure = self._classify(error, attempt.backend)
        self.last_error = failure.error
        self._retry_after = None
        if failure.kind is FailureKind.REFUSED:
            return self._stop(failure.error)
        if failure.kind is FailureKind.BACKEND:
            if attempt.cancelled is None:
                reason = failure.reason if failure.reason is not None else describe(failure.error)
                logger.warning("agentspec: backend %s failed (%s); marking it down", attempt.backend, reason)
                self.router.mark_down(attempt.backend, reason)
            else:  # it is down already, with the reason that cancelled this attempt
                logger.warning(
                    "agentspec: backend %s marked down (%s) with a request in flight; retrying",
                    attempt.backend,
                    attempt.cancelled,
                )
            if attempt.backend not in self._failed_on:
                self._failed_on.append(attempt.backend)
        elif not self.policy.retry_on_429:
            return self._stop(failure.error)
        if attempt.received:
            # Output reached the caller: a retry would repeat it. A backend failure of a
            # stream the shell can resume (plain text, token ids known) continues from the
            # tokens delivered, elsewhere; anything else stops the call.
            if (
                failure.kind is FailureKind.BACKEND
                and attempt.received.resumable
                and self.policy.resume_streams
                and len(self.attempts) < self.policy.max_attempts
            ):
                logger.warning(
                    "agentspec: stream from %s cut after %d token(s); resuming elsewhere",
                    attempt.backend,
                    len(attempt.received.token_ids),
                )
                self._resume = attempt.received.copy()
                return None
            return self._stop(
                StreamInterruptedError(
                    attempt.backend,
                    received_text=attempt.received.text,
                    received_chunks=attempt.received.chunks,
                    cause=error,
                )
            )
        if failure.retry_after_s is not None and failure.retry_after_s > 0:
            self._retry_after = (attempt.backend, failure.retry_after_s)
        if len(self.attempts) >= self.policy.max_attempts:
            return self._stop(failure.error)
        return None

    def _finish(self, attempt: Attempt) -> None:
        if attempt is not self._current:
            raise RuntimeError(f"{attempt!r} is not the attempt in flight")
        attempt._unwatch()
        self._current = None

    def _stop(self, error: BaseException) -> BaseException:
        self.done = True
        return error
