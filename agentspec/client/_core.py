"""State shared by the sync and async twins, with no I/O: the client's router, and one
session's ids, transcript, history, pending seeds and the attempts of its calls."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from . import _wire
from .attempts import CallAttempts
from .config import ClientConfig
from .errors import InvalidSeedError, SessionClosedError
from .history import History, Seed, message_text
from .router import BackendRouter
from .types import ChatResult, TokenCompletion, Turn


class ClientCore:
    """The router (backends, health, pins) and request defaults of one client instance."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.router = BackendRouter(config.backends, load_factor=config.load_factor)
        headers = {"Accept": "application/json", **config.default_headers}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self.headers = headers
        self.closed = False
        # Statistics live on one server: asking another would only find nothing there.
        self.stats_policy = config.retry.model_copy(update={"max_attempts": 1})


class SessionCore:
    """One session's state. Calls of one session are expected one at a time (a trajectory
    is sequential); the lock only keeps the bookkeeping consistent if they are not."""

    def __init__(self, client: ClientCore, session_id: str, group_id: str | None) -> None:
        self.client = client
        self.session_id = _wire.check_id("session_id", session_id)
        self.group_id = _wire.check_id("group_id", group_id) if group_id is not None else session_id
        self.turns: list[Turn] = []
        self.history = History(client.config.history_max_chars, client.config.history_max_tokens)
        self.pending: list[Seed] = []
        # The backend whose draft index holds this session's history. A call that lands
        # elsewhere carries the history as seeds first.
        self.backend: str | None = None
        self.closed = False
        self._lock = threading.Lock()
        client.router.open_session(self.group_id)

    # -- lifecycle -------------------------------------------------------------------------

    def check_open(self) -> None:
        if self.closed:
            raise SessionClosedError(self.session_id)
        if self.client.closed:
            raise SessionClosedError(self.session_id)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self.client.router.close_session(self.group_id)

    def attempts(self, *, stats: bool = False) -> CallAttempts:
        """The retry machine of one call of the session (``stats``: a statistics request,
        one attempt, to the backend holding the session when that is up)."""
        return self.client.router.attempts(
            self.group_id,
            self.client.stats_policy if stats else self.client.config.retry,
            check_open=self.check_open,
            prefer=self.backend if stats else None,
            probe=True,
        )

    # -- seeds -----------------------------------------------------------------------------

    def add_seed(self, content: str | Sequence[int], kind: str, scope: str) -> Seed:
        self.check_open()
        seed = Seed.of(content, kind, scope)
        with self._lock:
            if len(self.pending) >= self.client.config.max_seeds_per_request:
                raise InvalidSeedError(
                    f"at most {self.client.config.max_seeds_per_request} seeds can wait for "
                    "the next request (server limit); make a call or discard_seeds() first"
                )
            self.pending.append(seed)
        return seed

    # -- one attempt -----------------------------------------------------------------------

    def prepare(
        self,
        backend: str,
        params: Mapping[str, Any],
        extra_headers: Mapping[str, str] | None,
    ) -> tuple[dict[str, str], dict[str, Any], int]:
        """Headers and body of one attempt on ``backend``, and how many pending seeds it carries.

        When the session moves to a backend that has not seen its history (failover, or the
        group was re-pinned by a sibling session), the history goes first, as seeds.
        """
        with self._lock:
            pending = list(self.pending)
            reseed = self.backend is not None and backend != self.backend
        limit = self.client.config.max_seeds_per_request
        history = self.history.seeds(limit - len(pending)) if reseed else []
        seeds = [s.to_wire() for s in history] + [s.to_wire() for s in pending]
        headers = _wire.request_headers(self.session_id, self.group_id, self.client.headers, extra_headers)
        body = _wire.request_body(params, session_id=self.session_id, group_id=self.group_id, seeds=seeds)
        return headers, body, len(pending)

    def delivered(self, backend: str, n_pending: int) -> None:
        """``backend`` accepted a request: its index now holds the history and those seeds."""
        with self._lock:
            sent, self.pending = self.pending[:n_pending], self.pending[n_pending:]
            for seed in sent:
                self.history.add(seed)
            self.backend = backend

    # -- recording -------------------------------------------------------------------------

    def record_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        body: Mapping[str, Any],
        backend: str,
        attempts: int,
    ) -> ChatResult:
        choice = _wire.first_choice(body, backend)
        message = dict(choice.get("message") or {})
        return self._chat_result(
            messages,
            message,
            choice.get("finish_reason"),
            body.get("usage"),
            backend,
            attempts,
            dict(body),
            streamed=False,
        )

    def record_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        acc: _wire.ChatAccumulator,
        backend: str,
        attempts: int,
    ) -> ChatResult:
        raw = dict(acc.last_chunk or {})
        return self._chat_result(
            messages,
            acc.message(),
            acc.finish_reason,
            acc.usage,
            backend,
            attempts,
            raw,
            streamed=True,
        )

    def _chat_result(
        self,
        messages: Sequence[Mapping[str, Any]],
        message: dict[str, Any],
        finish_reason: str | None,
        usage: Any,
        backend: str,
        attempts: int,
        raw: dict[str, Any],
        *,
        streamed: bool,
    ) -> ChatResult:
        with self._lock:
            turn = Turn(
                index=len(self.turns),
                kind="chat",
                backend=backend,
                attempts=attempts,
                text=message_text(message),
                finish_reason=finish_reason,
                streamed=streamed,
                messages=tuple(dict(m) for m in messages),
                message=message,
                usage=dict(usage) if isinstance(usage, Mapping) else None,
            )
            self.turns.append(turn)
            self.history.add_chat_turn(messages, message)
        return ChatResult(
            message=message,
            finish_reason=finish_reason,
            usage=turn.usage,
            backend=backend,
            raw=raw,
            turn=turn,
        )

    def record_tokens(
        self,
        prompt: Sequence[int],
        body: Mapping[str, Any],
        backend: str,
        attempts: int,
    ) -> TokenCompletion:
        choice = _wire.first_choice(body, backend)
        token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
        prompt_ids = choice.get("prompt_token_ids")
        logprobs = choice.get("logprobs") or None
        token_logprobs = top = None
        if isinstance(logprobs, Mapping):
            token_logprobs = tuple(logprobs.get("token_logprobs") or ())
            top = tuple(logprobs.get("top_logprobs") or ())
        text = choice.get("text") or ""
        usage = body.get("usage")
        with self._lock:
            turn = Turn(
                index=len(self.turns),
                kind="tokens",
                backend=backend,
                attempts=attempts,
                text=text,
                finish_reason=choice.get("finish_reason"),
                prompt_token_ids=tuple(prompt),
                output_token_ids=token_ids,
                usage=dict(usage) if isinstance(usage, Mapping) else None,
            )
            self.turns.append(turn)
            self.history.add_token_turn(prompt, token_ids)
        return TokenCompletion(
            token_ids=token_ids,
            text=text,
            finish_reason=turn.finish_reason,
            prompt_token_ids=tuple(prompt_ids) if prompt_ids is not None else None,
            logprobs=token_logprobs,
            top_logprobs=top,
            usage=turn.usage,
            backend=backend,
            raw=dict(body),
            turn=turn,
        )


def chat_params(
    messages: Sequence[Mapping[str, Any]],
    model: str | None,
    default_model: str | None,
    params: Mapping[str, Any],
    *,
    stream: bool,
) -> dict[str, Any]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError("messages must be a sequence of message dicts")
    if not messages:
        raise ValueError("messages is empty")
    for m in messages:
        if not isinstance(m, Mapping) or "role" not in m:
            raise ValueError(f"each message must be a dict with a 'role', got {m!r}")
    if "stream" in params:
        raise TypeError("use stream_chat() for streaming, chat() for a whole response")
    out: dict[str, Any] = {"model": model or default_model, "messages": [dict(m) for m in messages]}
    out.update(params)
    out["stream"] = stream
    return out


def token_params(
    prompt_token_ids: Sequence[int],
    model: str | None,
    default_model: str | None,
    params: Mapping[str, Any],
) -> tuple[list[int], dict[str, Any]]:
    if isinstance(prompt_token_ids, (str, bytes)):
        raise TypeError("prompt_token_ids must be a sequence of token ids, not text")
    prompt = list(prompt_token_ids)
    if not prompt:
        raise ValueError("prompt_token_ids is empty")
    for t in prompt:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"prompt_token_ids must be non-negative ints, got {t!r}")
    if params.get("stream"):
        raise TypeError("complete_tokens() does not stream")
    out: dict[str, Any] = {"model": model or default_model, "prompt": prompt}
    # Token-in/token-out: the caller holds ids, so ask vLLM for ids back.
    out["return_token_ids"] = True
    out.update(params)
    out["stream"] = False
    return prompt, out
