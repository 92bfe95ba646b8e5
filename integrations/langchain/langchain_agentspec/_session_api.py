"""``ChatAgentSpec``'s session API: seeds, statistics, and a handle on one session.

The methods live in :class:`SessionAPI`, a mixin ``ChatAgentSpec`` inherits, so the chat
model itself holds only what makes a ``ChatOpenAI`` session-aware: the ids and seeds each
call carries, and where it goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable

from agentspec.client import Seed, SessionStats
from agentspec.wire import SeedKind, SeedScope

from ._ids import GROUP_ARG, SESSION_ARG, check_id, resolve_ids, run_metadata
from ._seeds import SeedBook
from ._stats import StatsClient, stats_headers

if TYPE_CHECKING:
    from .chat_models import ChatAgentSpec

__all__ = ["AgentSpecSession", "SessionAPI"]


class SessionAPI:
    """Seeds and statistics of a chat model's sessions (mixed into ``ChatAgentSpec``)."""

    if TYPE_CHECKING:
        # ChatAgentSpec's fields and state, which these methods read.
        session_id: str | None
        group_id: str | None
        stats_timeout_s: float
        default_headers: Any
        openai_api_key: Any
        _seed_book: SeedBook

        def backend_for(self, session_id: str | None = None, group_id: str | None = None) -> str: ...

    def _helper_session(self, session_id: str | None) -> str:
        """The session a helper (seed, stats) acts on: argument, model, enclosing run."""
        if session_id is not None:
            return check_id(SESSION_ARG, session_id)
        ids = resolve_ids(
            call_session_id=None,
            call_group_id=None,
            model_session_id=self.session_id,
            model_group_id=self.group_id,
            metadata=run_metadata(None),
        )
        if ids.session_id is None:
            msg = (
                "no session: pass session_id=..., set it on the model, or call from inside "
                "a run whose config names one (agentspec_session_id or LangGraph thread_id)"
            )
            raise ValueError(msg)
        return ids.session_id

    def session(self, session_id: str | None = None, group_id: str | None = None) -> AgentSpecSession:
        """A handle on one session: ``seed``, ``repair``, ``stats`` and a bound runnable.

        ```python
        s = llm.session("ticket-42")
        s.repair(failed_patch, feedback=test_output)
        s.runnable.invoke(messages)   # this call carries the seeds
        print(s.stats().calls)
        ```
        """
        sid = self._helper_session(session_id)
        gid = check_id(GROUP_ARG, group_id) if group_id is not None else None
        return AgentSpecSession(self, sid, gid)  # type: ignore[arg-type]  # self is a ChatAgentSpec

    # -- seeds ----------------------------------------------------------------------------

    def add_seed(
        self,
        content: str | Sequence[int],
        *,
        kind: SeedKind | str = SeedKind.PRIOR_TURN,
        scope: SeedScope | str = SeedScope.SESSION,
        session_id: str | None = None,
    ) -> None:
        """Put text (or token ids) into a session's draft index with its next call.

        (Named ``add_seed`` because ``seed`` is ChatOpenAI's sampling-seed field;
        ``llm.session(id).seed(...)`` is the same call.)

        Use it for what the next turns will likely repeat but the prompt no longer holds:
        turns a condenser dropped, a file about to be rewritten, a sibling's output.
        ``scope="group"`` seeds the session's group (shared by its sibling sessions).
        Seeds only guide drafting; the model never sees them.

        Args:
            content: text, or token ids of the served model's tokenizer.
            kind: ``prior_turn``, ``repair_attempt``, ``sibling_output`` or ``document``.
            scope: ``session`` or ``group``.
            session_id: the session; default: the model's, else the enclosing run's.

        Raises:
            ValueError: empty content, unknown kind or scope, or more pending seeds than
                the server takes in one request.
        """
        sid = self._helper_session(session_id)
        self._seed_book.add(sid, [Seed.of(content, kind, scope)])

    def repair(
        self,
        failed_attempt: str | Sequence[int],
        feedback: str | None = None,
        *,
        session_id: str | None = None,
    ) -> None:
        """Seed a failed attempt that the session's next turn will likely rewrite.

        ``failed_attempt`` goes in as ``repair_attempt``; ``feedback`` (an error, a failing
        test's output), when given, as ``document``, since a fix often quotes it. Put the
        feedback in the next call's messages too: seeds never reach the model itself.
        """
        sid = self._helper_session(session_id)
        seeds = [Seed.of(failed_attempt, SeedKind.REPAIR_ATTEMPT, SeedScope.SESSION)]
        if feedback:
            seeds.append(Seed.of(feedback, SeedKind.DOCUMENT, SeedScope.SESSION))
        self._seed_book.add(sid, seeds)

    def pending_seeds(self, session_id: str | None = None) -> list[dict[str, Any]]:
        """The session's seeds not yet sent, as they will appear on the wire."""
        return SeedBook.wire(self._seed_book.peek(self._helper_session(session_id)))

    def discard_seeds(self, session_id: str | None = None) -> int:
        """Drop the session's unsent seeds (e.g. after the server refused one); the count."""
        return self._seed_book.discard(self._helper_session(session_id))

    # -- statistics -----------------------------------------------------------------------

    def _stats_client(self) -> StatsClient:
        headers = stats_headers(self.default_headers, self.openai_api_key)
        return StatsClient(headers=headers, timeout_s=self.stats_timeout_s)

    def get_session_stats(self, session_id: str | None = None) -> SessionStats:
        """The server's statistics of a session (``GET /agentspec/v1/sessions/{id}``).

        Asks the backend the session's calls went to.

        Raises:
            SessionNotFoundError: that server holds no state for the session (no call of
                it reached the server yet, or the server evicted it).
            AuthenticationError: the server refused the API key.
            ServerRefusedError: any other 4xx.
            BackendUnavailableError: the server could not be reached, or answered 5xx.
        """
        sid = self._helper_session(session_id)
        return self._stats_client().get(self.backend_for(sid), sid, self.group_id)

    async def aget_session_stats(self, session_id: str | None = None) -> SessionStats:
        """Async twin of :meth:`get_session_stats`."""
        sid = self._helper_session(session_id)
        return await self._stats_client().aget(self.backend_for(sid), sid, self.group_id)


class AgentSpecSession:
    """One agentspec session of a :class:`ChatAgentSpec` (see :meth:`ChatAgentSpec.session`).

    A thin handle: the pending seeds live in the model, so seeds added here are sent by
    any call of the session, whether it comes through :attr:`runnable`, a LangGraph thread
    of the same id, or ``llm.invoke(..., session_id=...)``.
    """

    def __init__(self, model: ChatAgentSpec, session_id: str, group_id: str | None = None) -> None:
        self.model = model
        self.session_id = session_id
        self.group_id = group_id

    @property
    def runnable(self) -> Runnable[LanguageModelInput, BaseMessage]:
        """The model bound to this session (and group)."""
        ids = {SESSION_ARG: self.session_id}
        if self.group_id is not None:
            ids[GROUP_ARG] = self.group_id
        return self.model.bind(**ids)

    def seed(
        self,
        content: str | Sequence[int],
        *,
        kind: SeedKind | str = SeedKind.PRIOR_TURN,
        scope: SeedScope | str = SeedScope.SESSION,
    ) -> None:
        """See :meth:`ChatAgentSpec.add_seed`."""
        self.model.add_seed(content, kind=kind, scope=scope, session_id=self.session_id)

    def repair(self, failed_attempt: str | Sequence[int], feedback: str | None = None) -> None:
        """See :meth:`ChatAgentSpec.repair`."""
        self.model.repair(failed_attempt, feedback, session_id=self.session_id)

    @property
    def pending_seeds(self) -> list[dict[str, Any]]:
        """The session's seeds not yet sent, as they will appear on the wire."""
        return self.model.pending_seeds(self.session_id)

    def discard_seeds(self) -> int:
        """Drop the session's unsent seeds; the count."""
        return self.model.discard_seeds(self.session_id)

    @property
    def backend(self) -> str:
        """The backend this session's calls go to."""
        if self.group_id is not None and self.model.failover is not None:
            return self.model.backend_for(group_id=self.group_id)
        return self.model.backend_for(self.session_id)

    def stats(self) -> SessionStats:
        """See :meth:`ChatAgentSpec.get_session_stats`."""
        return self.model.get_session_stats(self.session_id)

    async def astats(self) -> SessionStats:
        """Async twin of :meth:`stats`."""
        return await self.model.aget_session_stats(self.session_id)

    def __repr__(self) -> str:
        return f"<AgentSpecSession {self.session_id!r} group={self.group_id!r}>"
