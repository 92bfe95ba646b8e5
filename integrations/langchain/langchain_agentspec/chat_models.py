"""``ChatAgentSpec``: LangChain's OpenAI chat model, made session-aware for agentspec.

Everything a LangChain user relies on (tool calling, structured output, streaming, async,
callbacks, usage metadata) is ``ChatOpenAI``'s own code on the Chat Completions API. What
this class adds happens around each call:

1. it resolves the call's agentspec session and group (call argument, model field, run
   metadata ``agentspec_session_id``, LangGraph's ``thread_id``);
2. it puts them on the wire as ``X-Session-Id``/``X-Group-Id`` headers and in
   ``vllm_xargs`` (docs/wire.md), with the session's pending seeds in ``agentspec_seeds``,
   merging a per-call ``extra_body`` into the model's instead of replacing it;
3. with several ``backends`` its HTTP clients take agentspec's failover transport
   (:mod:`agentspec.client.transport`), which pins the group to one backend by rendezvous
   hashing with bounded load, marks a backend down when it fails, and sends the request to
   another one while no output has reached the caller.

What a request carries and the session-stats request are agentspec's protocol layer
(:mod:`agentspec.client.protocol`); the seed and statistics methods live in
``_session_api`` (mixed in), so this module holds only the ``ChatOpenAI`` subclass.
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Self

import httpx
from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.chat_models import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from pydantic import Field, PrivateAttr, model_validator

from agentspec.client import AsyncFailoverTransport, Failover, FailoverTransport, Seed, normalise_backend, protocol

from ._ids import GROUP_ARG, SESSION_ARG, CallIds, check_id, resolve_ids, run_metadata, with_session_metadata
from ._seeds import SeedBook
from ._session_api import AgentSpecSession, SessionAPI
from ._stats import NO_KEY

__all__ = ["AgentSpecSession", "ChatAgentSpec", "merge_extra_body"]

BASE_URL_ENV: Final = "AGENTSPEC_BASE_URL"
API_KEY_ENV: Final = "AGENTSPEC_API_KEY"


def merge_extra_body(base: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict[str, Any]:
    """``override`` merged into ``base``; nested mappings merge key by key, ``override`` wins.

    Plain ``ChatOpenAI`` lets a per-call ``extra_body`` replace the model's, which would drop,
    say, a model-level ``top_k`` the moment a call adds ``structured_outputs``.
    """
    out: dict[str, Any] = copy.deepcopy(dict(base or {}))
    for key, value in (override or {}).items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_extra_body(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _api_base(url: str) -> str:
    """An OpenAI-compatible base URL ending in ``/v1`` (agentspec's backends omit it)."""
    return normalise_backend(url) + "/v1"


@dataclass
class _Call:
    """One prepared call: its ids, its request kwargs, and the seeds it carries."""

    ids: CallIds
    kwargs: dict[str, Any]
    seeds: list[Seed] = field(default_factory=list)


class ChatAgentSpec(SessionAPI, ChatOpenAI):
    r"""Chat model for vLLM servers run by ``agentspec serve`` (or plain vLLM).

    A drop-in replacement for ``ChatOpenAI`` pointed at vLLM: only the class name and its
    base URL change. Each call is tied to an agentspec *session* so that the server's
    draft index holds the session's earlier turns and speculates them into the new one.

    Setup:
        ``pip install langchain-agentspec`` and start a server with
        ``agentspec serve MODEL --enable-auto-tool-choice --tool-call-parser hermes``.
        The base URL may also come from ``AGENTSPEC_BASE_URL``, the key from
        ``AGENTSPEC_API_KEY`` (vLLM accepts any key unless started with ``--api-key``).

    Key init args:
        model: str
            The served model name.
        base_url: str | None
            One server, with or without the ``/v1`` suffix.
        backends: list[str] | None
            Several servers; each session/group is pinned to one of them.
        session_id: str | None
            A fixed session for every call of this model instance.
        group_id: str | None
            A fixed group (sessions expected to write alike, e.g. the samples of a prompt).
        temperature, max_tokens, ...: as in ``ChatOpenAI``.

    Instantiate:
        ```python
        from langchain_agentspec import ChatAgentSpec

        llm = ChatAgentSpec(model="qwen", base_url="http://localhost:8000", max_tokens=256)
        ```

    Sessions:
        The session of a call is, in this order: the call's ``session_id`` argument
        (``llm.invoke(msgs, session_id="s1")`` or ``llm.bind(session_id="s1")``), the
        model's ``session_id``, run metadata ``agentspec_session_id``, LangGraph's
        ``thread_id``. The group: the call's ``group_id``, the model's, run metadata
        ``agentspec_group_id``; without one the group is the session.

        ```python
        graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})
        # every model call of that thread is agentspec session "ticket-42"
        ```

    Seeds:
        ```python
        session = llm.session("ticket-42")
        session.repair(failed_code, feedback=pytest_output)
        session.seed(open("utils.py").read(), kind="document")
        # or: llm.add_seed(text, session_id="ticket-42"), llm.repair(..., session_id=...)
        ```
        Seeds travel with the session's next call and only guide drafting: the model
        never sees them, and greedy outputs do not change.

    Tool calling, structured output, streaming, async, usage metadata:
        As ``ChatOpenAI`` on the Chat Completions API (``use_responses_api=False``);
        streamed usage is on (``stream_usage=True``).
    """

    session_id: str | None = None
    """The session of every call, unless a call names its own."""
    group_id: str | None = None
    """The group of every call, unless a call names its own."""
    backends: list[str] | None = None
    """Several agentspec servers (base URLs, ``/v1`` optional). Mutually exclusive with
    ``base_url``. A group is pinned to one by rendezvous hashing with bounded load."""
    failover: Failover | None = Field(default=None, exclude=True, repr=False)
    """The pins and health of ``backends`` (built from them unless given). Pass one
    :class:`~agentspec.client.Failover` to several models to pin their sessions alike."""
    load_factor: float = Field(default=1.25, ge=1.0)
    """Bounded-load factor of the pinning: no backend takes more than
    ``ceil(load_factor * (groups + 1) / n)`` groups when a new one is placed."""
    backend_cooldown_s: float = Field(default=30.0, ge=0.0)
    """After a failure a backend gets no new calls for this long; then the next call that
    lands there tells whether it is back."""
    max_seeds_per_request: int = Field(default=16, ge=1)
    """The server's per-request seed limit (``agentspec serve`` default: 16)."""
    stats_timeout_s: float = Field(default=10.0, gt=0)
    """Timeout of ``get_session_stats``."""

    # vLLM serves Chat Completions; the Responses API it has is partial.
    use_responses_api: bool | None = False
    # With a custom base URL ChatOpenAI leaves streamed usage off; vLLM supports it.
    stream_usage: bool | None = True

    _seed_book: SeedBook = PrivateAttr(default_factory=SeedBook)

    # -- construction ---------------------------------------------------------------------

    @model_validator(mode="before")
    @classmethod
    def _agentspec_defaults(cls, values: Any) -> Any:
        """Fill the base URL and key the agentspec way before ChatOpenAI builds its clients.

        Runs before ChatOpenAI's own validation, which otherwise falls back to
        ``OPENAI_API_KEY``: a user's OpenAI key has no business going to a vLLM server.
        """
        if not isinstance(values, dict):
            return values
        values = dict(values)
        url_keys = ("base_url", "openai_api_base")
        given_url = next((values[k] for k in url_keys if values.get(k)), None)
        failover = values.get("failover")
        backends = values.get("backends") or (list(failover.backends) if isinstance(failover, Failover) else None)
        if backends:
            if isinstance(backends, str):
                backends = [backends]
            values["backends"] = list(dict.fromkeys(normalise_backend(b) for b in backends))
            if isinstance(failover, Failover) and set(values["backends"]) != set(failover.backends):
                msg = "backends and failover name different servers; pass one of them"
                raise ValueError(msg)
            # A serialized model carries both (base_url is then the first backend).
            if given_url and normalise_backend(str(given_url)) not in values["backends"]:
                msg = "pass either base_url or backends, not both"
                raise ValueError(msg)
            # ChatOpenAI builds its clients for one URL; the transport sends each request
            # to its session's backend.
            given_url = values["backends"][0]
            values.update(_failover_clients(values, cls))
        given_url = given_url or os.environ.get(BASE_URL_ENV)
        if given_url:
            for k in url_keys:
                values.pop(k, None)
            values["base_url"] = _api_base(given_url)
        if not any(values.get(k) is not None for k in ("api_key", "openai_api_key")):
            values["api_key"] = os.environ.get(API_KEY_ENV) or NO_KEY
        for key in (SESSION_ARG, GROUP_ARG):
            if values.get(key) is not None:
                values[key] = check_id(key, values[key])
        return values

    @model_validator(mode="after")
    def _agentspec_state(self) -> Self:
        if self.use_responses_api:
            msg = "ChatAgentSpec speaks the Chat Completions API; use_responses_api must be False"
            raise ValueError(msg)
        self._seed_book = SeedBook(max_per_session=self.max_seeds_per_request)
        return self

    # -- LangChain identity ---------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "agentspec-chat"

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """``["langchain_agentspec", "chat_models"]``."""
        return ["langchain_agentspec", "chat_models"]

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "agentspec"
        return params

    # -- entry points: make configurable's session keys visible as run metadata ---------

    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        return super().invoke(input, with_session_metadata(config), stop=stop, **kwargs)

    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        return await super().ainvoke(input, with_session_metadata(config), stop=stop, **kwargs)

    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        yield from super().stream(input, with_session_metadata(config), stop=stop, **kwargs)

    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        async for chunk in super().astream(input, with_session_metadata(config), stop=stop, **kwargs):
            yield chunk

    # -- where a session goes -------------------------------------------------------------

    def backend_for(self, session_id: str | None = None, group_id: str | None = None) -> str:
        """The backend base URL (without ``/v1``) a session's (or group's) calls go to."""
        if self.failover is None:
            return normalise_backend(str(self.openai_api_base))
        if group_id is not None:
            return self.failover.backend_for(group_id=check_id(GROUP_ARG, group_id))
        sid = self._helper_session(session_id)
        # Where the session's calls went (its group may have come from run metadata).
        return self.failover.backend_for(sid, self.group_id)

    # -- preparing a call -----------------------------------------------------------------

    def _prepare(self, run_manager: Any | None, kwargs: dict[str, Any]) -> _Call:
        """Resolve ids, merge ``extra_body``, attach headers and pending seeds."""
        kwargs = dict(kwargs)
        ids = resolve_ids(
            call_session_id=kwargs.pop(SESSION_ARG, None),
            call_group_id=kwargs.pop(GROUP_ARG, None),
            model_session_id=self.session_id,
            model_group_id=self.group_id,
            metadata=run_metadata(run_manager),
        )
        body = merge_extra_body(self.extra_body, kwargs.pop("extra_body", None))
        headers = dict(kwargs.pop("extra_headers", None) or {})
        # The group defaults to the session, as agentspec's client sends it: routers
        # hashing X-Group-Id then keep such a session in one place too.
        headers = protocol.session_headers(ids.session_id, ids.group_id, headers)
        seeds = self._seed_book.take(ids.session_id) if ids.session_id is not None else []
        body = protocol.with_session(body, ids.session_id, ids.group_id, seeds)
        kwargs["extra_body"] = body or None
        if headers:
            kwargs["extra_headers"] = headers
        return _Call(ids=ids, kwargs=kwargs, seeds=seeds)

    def _failed(self, call: _Call) -> None:
        # The server did not apply the seeds of a failed call: keep them for the next one.
        if call.ids.session_id is not None:
            self._seed_book.restore(call.ids.session_id, call.seeds)

    # -- the four entry points ------------------------------------------------------------

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(run_manager, kwargs)
        try:
            return super()._generate(messages, stop=stop, run_manager=run_manager, **call.kwargs)
        except Exception:
            self._failed(call)
            raise

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        call = self._prepare(run_manager, kwargs)
        try:
            return await super()._agenerate(messages, stop=stop, run_manager=run_manager, **call.kwargs)
        except Exception:
            self._failed(call)
            raise

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        call = self._prepare(run_manager, kwargs)
        started = False
        try:
            for chunk in super()._stream(messages, stop=stop, run_manager=run_manager, **call.kwargs):
                started = True
                yield chunk
        except Exception:
            if not started:  # once output arrived, the server took the seeds
                self._failed(call)
            raise

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        call = self._prepare(run_manager, kwargs)
        started = False
        try:
            async for chunk in super()._astream(messages, stop=stop, run_manager=run_manager, **call.kwargs):
                started = True
                yield chunk
        except Exception:
            if not started:
                self._failed(call)
            raise


def _failover_clients(values: dict[str, Any], model: type[ChatAgentSpec]) -> dict[str, Any]:
    """The ``failover`` and the two HTTP clients through it, for a model with ``backends``.

    Clients of the caller's own are kept when they come with the ``failover`` their
    transports route with: the model must know where its sessions went.
    """
    failover = values.get("failover")
    own_clients = values.get("http_client") is not None or values.get("http_async_client") is not None
    if own_clients and not isinstance(failover, Failover):
        msg = (
            "with backends and your own http_client/http_async_client, pass failover= too: the "
            "agentspec.client.Failover their transports (FailoverTransport, AsyncFailoverTransport) use"
        )
        raise ValueError(msg)
    if not isinstance(failover, Failover):
        fields = model.model_fields
        failover = Failover(
            values["backends"],
            load_factor=values.get("load_factor", fields["load_factor"].default),
            cooldown_s=values.get("backend_cooldown_s", fields["backend_cooldown_s"].default),
        )
    clients = {"failover": failover}
    if values.get("http_client") is None:
        clients["http_client"] = httpx.Client(transport=FailoverTransport(failover))
    if values.get("http_async_client") is None:
        clients["http_async_client"] = httpx.AsyncClient(transport=AsyncFailoverTransport(failover))
    return clients
