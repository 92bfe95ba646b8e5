"""SkyRL (``skyrl`` 0.4, Python >= 3.12) on ``agentspec serve`` engines.

SkyRL trains against external inference servers with ``run_engines_locally=false`` and
``external_server_urls`` (:func:`skyrl_overrides`). Out of the box its generator sends each
model turn to vLLM's scale-out endpoint ``/inference/v1/generate`` with one
``X-Session-ID: <prompt uid>_<repetition>`` per trajectory: agentspec's middleware does not
read that endpoint, and a per-trajectory routing key spreads a GRPO group over the engines.
This module takes over the token-generation call of SkyRL's ``RemoteInferenceClient``:

- every trajectory is an agentspec session and every prompt's ``n_samples_per_prompt``
  trajectories are one group (:func:`trajectory_ids`), scoped by run and policy version;
- generation is ``/v1/completions`` with a token-id prompt through agentspec's session-aware
  client, which pins each group to one engine (its samples draft from each other there),
  bounds load and fails over; SkyRL gets back exactly the token ids, log-probabilities and
  stop reasons it expects;
- SkyRL's weight sync (``increment_weight_version``) announces a new policy version to every
  engine (``POST /agentspec/v1/policy``), so older outputs stop drafting for newer samples.

In a SkyRL entrypoint (``BasePPOExp.get_inference_client`` is SkyRL's hook for this)::

    from skyrl.train.entrypoints.main_base import BasePPOExp
    from agentspec_rl.skyrl import with_agentspec

    class AgentspecExp(BasePPOExp):
        def get_inference_client(self):
            return with_agentspec(super().get_inference_client())

Importing this module needs neither SkyRL nor vLLM; :func:`with_agentspec` and
``AgentspecInferenceClient`` need ``skyrl`` in the trainer's environment.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any
from uuid import uuid4

import httpx

from agentspec import wire
from agentspec.client import AsyncAgentSpecClient, AsyncSession, ClientConfig
from agentspec_rl._plan import sample_session_id
from agentspec_rl.client import RolloutClient

# AgentspecInferenceClient (a subclass of SkyRL's client) is left out of __all__: a star
# import must not need SkyRL.
__all__ = [
    "AgentspecSessions",
    "TrajectoryIds",
    "skyrl_overrides",
    "trajectory_ids",
    "with_agentspec",
]

logger = logging.getLogger(__name__)

#: SkyRL's per-trajectory session id: ``f"{instance_id}_{repetition_id}"`` (its generators).
_SKYRL_SESSION = re.compile(r"^(?P<instance>.+)_(?P<repetition>\d+)$")
#: Sampling keys of SkyRL's vLLM dict that ``/v1/completions`` does not take.
_NOT_COMPLETION_FIELDS = frozenset({"n", "output_kind", "detokenize"})
#: Open trajectories one client keeps; the oldest is closed beyond it (SkyRL closes each
#: with ``finish_session``, so this bounds only trajectories nobody finished).
MAX_OPEN_TRAJECTORIES = 65536


def skyrl_overrides(
    engines: Sequence[str], *, served_model_name: str | None = None, proxy_url: str | None = None
) -> list[str]:
    """SkyRL's command-line overrides that point its generator at agentspec engines.

    ``engines``: the ``agentspec serve`` base URLs (SkyRL's control plane fans weight syncs,
    pause and resume out to them). ``proxy_url``: a router in front of them, for SkyRL's
    remaining data-plane calls; when None, SkyRL starts its own vllm-router over the engines.
    ``served_model_name``: the engines' ``--served-model-name``, when it is not the policy path.
    """
    if not engines:
        raise ValueError("at least one engine URL is needed")
    urls = [_check_url(u) for u in engines]
    prefix = "generator.inference_engine."
    out = [
        f"{prefix}run_engines_locally=false",
        f"{prefix}external_server_urls=[{','.join(repr(u) for u in urls)}]",
    ]
    if proxy_url is not None:
        out.append(f"{prefix}external_proxy_url={_check_url(proxy_url)!r}")
    if served_model_name is not None:
        out.append(f"{prefix}served_model_name={served_model_name!r}")
    return out


def _check_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"an engine URL starts with http:// or https://, got {url!r}")
    return url.rstrip("/")


@dataclass(frozen=True, slots=True)
class TrajectoryIds:
    """A SkyRL trajectory's agentspec session and group."""

    session_id: str
    group_id: str


def _safe(text: str, limit: int) -> str:
    """``text`` when it is a valid id part of at most ``limit`` characters, else a digest."""
    if wire.is_valid_id(text) and len(text) <= limit:
        return text
    return "h" + hashlib.sha256(text.encode()).hexdigest()[:16]


def trajectory_ids(skyrl_session_id: object, *, run_id: str, version: int) -> TrajectoryIds:
    """The agentspec ids of the SkyRL trajectory ``skyrl_session_id``.

    SkyRL names trajectory ``r`` of prompt ``uid`` ``"<uid>_<r>"`` (``uid`` is the dataset
    row, so the next epoch reuses it). Its group is ``<run_id>.v<version>.<uid>`` and the
    session ``<group>/<r>``: all samples of a prompt form one group, and a later epoch under
    a newer policy, or another run, never continues an older session. A ``uid`` outside the
    id alphabet (or too long) is replaced by a digest; an id of another form is a session
    alone (its own group).
    """
    scope = f"{run_id}.v{version}"
    raw = str(skyrl_session_id)
    if m := _SKYRL_SESSION.match(raw):
        group = f"{scope}.{_safe(m['instance'], 117 - len(scope))}"
        return TrajectoryIds(sample_session_id(group, int(m["repetition"])), group)
    session = f"{scope}.{_safe(raw, 127 - len(scope))}"
    return TrajectoryIds(session, session)


def completion_fields(sampling_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """SkyRL's vLLM sampling dict as ``/v1/completions`` fields (None values dropped)."""
    params = dict(sampling_params or {})
    if params.get("n", 1) != 1:
        raise ValueError("n > 1 is not supported: SkyRL samples a group with generator.n_samples_per_prompt")
    return {k: v for k, v in params.items() if v is not None and k not in _NOT_COMPLETION_FIELDS}


@dataclass
class _LoopState:
    client: AsyncAgentSpecClient
    sessions: OrderedDict[str, AsyncSession] = field(default_factory=OrderedDict)


class AgentspecSessions:
    """SkyRL trajectories as agentspec sessions on ``engines`` (no SkyRL needed).

    Args:
        engines: ``agentspec serve`` base URLs.
        model: the served model name (each call may name another, e.g. a LoRA adapter).
        run_id: scopes this run's ids (a random one when None): 1 to 24 id characters.
        keep_old_outputs: passed to every policy announcement (see docs/wire.md).
        config: a full :class:`~agentspec.client.ClientConfig` instead of ``engines``/``model``.
        client_settings: more :class:`~agentspec.client.ClientConfig` fields (``api_key``, ...).

    One session-aware client serves each event loop that calls it. Picklable: the copy
    starts without open sessions or connections.
    """

    def __init__(
        self,
        engines: Sequence[str] | None = None,
        model: str | None = None,
        *,
        run_id: str | None = None,
        keep_old_outputs: bool = False,
        config: ClientConfig | None = None,
        **client_settings: Any,
    ) -> None:
        run_id = run_id if run_id is not None else uuid4().hex[:8]
        if not wire.is_valid_id(run_id) or len(run_id) > 24:
            raise ValueError(f"run_id {run_id!r} must be 1 to 24 characters of letters, digits and . _ : @ / -")
        self.config = (
            config if config is not None else ClientConfig(backends=list(engines or ()), model=model, **client_settings)
        )
        self.run_id = run_id
        self.keep_old_outputs = keep_old_outputs
        self.announced: int | None = None
        """The last policy version announced to the engines."""
        self._base: int | None = None
        self._loops: dict[asyncio.AbstractEventLoop, _LoopState] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_loops": {}}

    def ids(self, skyrl_session_id: object, version: int) -> TrajectoryIds:
        """:func:`trajectory_ids` of this run."""
        return trajectory_ids(skyrl_session_id, run_id=self.run_id, version=version)

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        for other in [lp for lp in self._loops if lp.is_closed()]:
            del self._loops[other]  # its connections died with it
        if loop not in self._loops:
            self._loops[loop] = _LoopState(AsyncAgentSpecClient(self.config))
        return self._loops[loop]

    async def _session(self, skyrl_session_id: object, version: int) -> AsyncSession:
        state = self._state()
        key = str(skyrl_session_id)
        session = state.sessions.get(key)
        if session is None or session.closed:
            ids = self.ids(key, version)
            session = state.client.session(ids.session_id, ids.group_id)
            state.sessions[key] = session
            while len(state.sessions) > MAX_OPEN_TRAJECTORIES:
                await state.sessions.popitem(last=False)[1].aclose()
        state.sessions.move_to_end(key)
        return session

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling_params: Mapping[str, Any] | None,
        skyrl_session_id: object | None,
        *,
        version: int = 0,
        model: str | None = None,
        cache_salt: str | None = None,
    ) -> dict[str, Any]:
        """One model turn of a SkyRL trajectory, answered as SkyRL's raw-token result:
        ``{"response_ids", "response_logprobs", "stop_reason", "routed_experts",
        "rollout_sample_support"}``.

        ``skyrl_session_id`` names the trajectory (SkyRL's ``session_ids`` entry): its turns
        share a session until :meth:`finish`; None is a session of one call. ``version``
        (SkyRL's ``weight_version``) scopes the ids of a trajectory's first turn.
        """
        params = completion_fields(sampling_params)
        if cache_salt is not None:
            params[wire.CACHE_SALT_FIELD] = cache_salt
        alone = skyrl_session_id is None or skyrl_session_id == ""
        key = uuid4().hex if alone else skyrl_session_id
        session = await self._session(key, version)
        try:
            completion = await session.complete_tokens(prompt_token_ids, model=model, **params)
        finally:
            if alone:
                await self.finish(key)
        want_logprobs = params.get("logprobs") is not None
        return {
            "response_ids": list(completion.token_ids),
            "response_logprobs": list(completion.logprobs or ()) if want_logprobs else None,
            "stop_reason": completion.finish_reason,
            "routed_experts": None,
            "rollout_sample_support": None,
        }

    async def finish(self, skyrl_session_id: object) -> None:
        """The trajectory is done (SkyRL's ``finish_session``): close its session."""
        state = self._loops.get(asyncio.get_running_loop())
        session = state.sessions.pop(str(skyrl_session_id), None) if state else None
        if session is not None:
            await session.aclose()

    def announce(self, skyrl_version: int) -> int:
        """Tell every engine that SkyRL's weight sync number ``skyrl_version`` is live; returns
        the policy version announced.

        Versions only move forward on a server, and a long-lived engine may already hold a
        newer one from an earlier run: the first announcement reads the engines' live versions
        (``GET /agentspec/v1/stats``) and numbers this run's versions after them. Raises the
        HTTP error when an engine does not take it.
        """
        if self._base is None:
            self._base = max((v for v in self._live_versions() if v is not None), default=0)
        version = self._base + skyrl_version
        if self.announced is not None and version <= self.announced:
            return self.announced
        with RolloutClient(config=self.config) as rollouts:
            rollouts.policy_version = self.announced
            rollouts.on_weight_update(version, keep_old_outputs=self.keep_old_outputs)
        self.announced = version
        return version

    def _live_versions(self) -> list[int | None]:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        out = []
        for engine in self.config.backends:
            r = httpx.get(engine + wire.SERVER_STATS_PATH, headers=headers, timeout=self.config.read_timeout_s)
            engine_stats = r.raise_for_status().json().get("engine") or {}
            out.append(engine_stats.get("policy_version"))
        return out

    async def aclose(self) -> None:
        """Close the sessions and the client of the running event loop."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            for session in state.sessions.values():
                await session.aclose()
            await state.client.aclose()


# ------------------------------------------------------------------------- SkyRL glue

_UNSUPPORTED = {
    "enable_return_routed_experts": "routed-expert replay needs SkyRL's own /skyrl/v1/generate endpoint",
    "enable_return_sample_support_set": "sample-support capture needs SkyRL's own /skyrl/v1/generate endpoint",
}


def _define_client() -> type:
    from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
        RemoteInferenceClient,
    )

    @dataclass
    class AgentspecInferenceClient(RemoteInferenceClient):  # type: ignore[misc]
        """SkyRL's ``RemoteInferenceClient`` whose token generation runs on agentspec
        sessions (see the module docstring); everything else is SkyRL's."""

        agentspec: AgentspecSessions | None = None

        def __post_init__(self) -> None:
            super().__post_init__()
            for name, why in _UNSUPPORTED.items():
                if getattr(self, name, False):
                    raise ValueError(f"agentspec engines do not support {name}: {why}")
            if self.agentspec is None:
                self.agentspec = AgentspecSessions(self.server_urls, self.model_name)

        async def _generate_single(
            self,
            prompt_token_ids: list[int],
            sampling_params: dict[str, Any],
            session_id: Any,
            model: str,
            mm_features: Any = None,
            cache_salt: str | None = None,
            routed_experts_prompt_start: int | None = None,
            return_sample_support: bool = False,
        ) -> dict[str, Any]:
            if mm_features:
                raise ValueError("agentspec engines take token-only prompts: multimodal features are not supported")
            if routed_experts_prompt_start is not None or return_sample_support:
                raise ValueError("agentspec engines do not return routed experts or sample support")
            assert self.agentspec is not None
            return await self.agentspec.generate(
                prompt_token_ids,
                sampling_params,
                session_id,
                version=self.weight_version,
                model=model,
                cache_salt=cache_salt,
            )

        async def finish_session(self, session_id: str) -> None:
            assert self.agentspec is not None
            await self.agentspec.finish(session_id)
            await super().finish_session(session_id)

        def increment_weight_version(self) -> None:
            super().increment_weight_version()
            assert self.agentspec is not None
            try:
                self.agentspec.announce(self.weight_version)
            except Exception as exc:  # noqa: BLE001 - drafting is an optimisation: never stop training for it
                logger.warning(
                    "agentspec: could not announce policy version %s to the engines (%s); older outputs keep"
                    " drafting until the next weight sync",
                    self.weight_version,
                    exc,
                )

    AgentspecInferenceClient.__module__ = __name__
    AgentspecInferenceClient.__qualname__ = "AgentspecInferenceClient"
    return AgentspecInferenceClient


def __getattr__(name: str) -> Any:
    # Defined on first use (it subclasses SkyRL's client); a module attribute from then on,
    # so pickled clients (SkyRL ships its client to Ray workers) find their class.
    if name == "AgentspecInferenceClient":
        try:
            cls = _define_client()
        except ImportError as exc:
            raise ImportError(f"AgentspecInferenceClient needs SkyRL: pip install 'skyrl>=0.4' ({exc})") from exc
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_agentspec(client: Any, **settings: Any) -> Any:
    """SkyRL's ``RemoteInferenceClient`` ``client`` (as ``BasePPOExp.get_inference_client``
    builds it) turned into an ``AgentspecInferenceClient`` over the same engines.

    ``settings`` go to :class:`AgentspecSessions` (``run_id``, ``keep_old_outputs``, ``api_key``,
    ...); its engines are ``client.server_urls`` and its model ``client.model_name``.
    """
    # The class defined once (module attribute from then on), so that every client made here
    # is of the class pickle finds by name.
    cls = globals().get("AgentspecInferenceClient") or __getattr__("AgentspecInferenceClient")
    kept = {f.name: getattr(client, f.name) for f in fields(client) if f.init and not f.name.startswith("_")}
    sessions = AgentspecSessions(list(client.server_urls), client.model_name, **settings)
    return cls(**kept, agentspec=sessions)
