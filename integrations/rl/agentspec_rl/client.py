"""Rollout clients: :class:`RolloutClient` (threads) and :class:`AsyncRolloutClient` (anyio).

Both stand on agentspec's session-aware client: every sample is a session of its group,
and the client's router pins the group to one backend (so the group's samples draft from
each other), fails over when a backend dies, and keeps load bounded. Generation is token in,
token out (``/v1/completions`` with a token-id prompt and ``return_token_ids``): what RL
trains on is exactly what the policy sampled.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Self

import anyio
import httpx

from agentspec import wire
from agentspec.client import (
    AgentSpecClient,
    AsyncAgentSpecClient,
    ClientConfig,
    ServerRefusedError,
)
from agentspec_rl._builder import SampleBuilder
from agentspec_rl._plan import GroupPlan, plan_groups, sample_session_id
from agentspec_rl.sampling import SamplingParams
from agentspec_rl.types import EnvStep, Group, RolloutError, Sample, SampleState

__all__ = ["AsyncRolloutClient", "Environment", "RolloutClient"]

#: After each model turn: the observation to append, or None when the sample is done.
Environment = Callable[[SampleState], EnvStep | None]
AsyncEnvironment = Callable[[SampleState], EnvStep | None | Awaitable[EnvStep | None]]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ServerRefusedError):
        return f"the server refused it: {exc.message}"
    return str(exc) or type(exc).__name__


def _check_version(current: int | None, version: int) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a policy version is a non-negative integer, got {version!r}")
    if current is not None and version < current:
        raise ValueError(f"policy version {version} is older than the live one ({current})")


def _check_policy_answers(version: int, answers: Sequence[tuple[str, httpx.Response]]) -> None:
    """Raise for the first engine in ``answers`` (``(backend, response)``) that did not take
    policy ``version``: ``ValueError`` naming the engine when it already runs a newer one
    (409: the caller is behind), the HTTP error otherwise."""
    for backend, response in answers:
        if response.status_code == wire.POLICY_CONFLICT_STATUS:
            raise ValueError(f"engine {backend} refused policy version {version}: {_server_message(response)}")
    for _, response in answers:
        response.raise_for_status()


def _server_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text


PolicyRequest = tuple[str, str, dict[str, Any], dict[str, str]]  # backend, URL, body, headers

Job = tuple[GroupPlan, int]  # a group and the index of one of its samples


class _Base:
    """What both twins share: settings, the policy version, planning, assembling."""

    def __init__(self, max_concurrency: int) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.policy_version: int | None = None

    @staticmethod
    def _config(
        backends: Sequence[str] | None, model: str | None, config: ClientConfig | None, settings: dict[str, Any]
    ) -> ClientConfig:
        return config if config is not None else ClientConfig(backends=list(backends or ()), model=model, **settings)

    def _policy_requests(self, config: ClientConfig, version: int, keep_old_outputs: bool) -> list[PolicyRequest]:
        """Check ``version``; the ``POST /agentspec/v1/policy`` request for every backend."""
        _check_version(self.policy_version, version)
        headers = dict(config.default_headers)
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        body = {"version": version, "keep_old_outputs": keep_old_outputs}
        return [(backend, backend + wire.POLICY_PATH, body, headers) for backend in config.backends]

    @staticmethod
    def _plan(
        prompts: Sequence[Sequence[int]], n: int, group_ids: Sequence[str] | None, max_turns: int
    ) -> tuple[list[GroupPlan], list[Job]]:
        if max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {max_turns}")
        plans = plan_groups(prompts, n, group_ids)
        return plans, [(p, i) for p in plans for i in range(p.n)]

    @staticmethod
    def _one(results: list[Group | RolloutError]) -> Group:
        (result,) = results
        if isinstance(result, RolloutError):
            raise result
        return result

    def _builder(self, plan: GroupPlan, index: int) -> SampleBuilder:
        sid = sample_session_id(plan.group_id, index)
        return SampleBuilder(plan.group_id, index, sid, plan.prompt, self.policy_version)


class RolloutClient(_Base):
    """Rollouts on agentspec servers, from threads (sync).

    Args:
        backends: ``agentspec serve`` base URLs (or one router's).
        model: the served model name (the server's first when None).
        max_concurrency: samples in flight at once, all groups together.
        config: a full :class:`~agentspec.client.ClientConfig` instead of the two above.
    """

    def __init__(
        self,
        backends: Sequence[str] | None = None,
        model: str | None = None,
        *,
        max_concurrency: int = 64,
        config: ClientConfig | None = None,
        **client_settings: Any,
    ) -> None:
        super().__init__(max_concurrency)
        self._client = AgentSpecClient(self._config(backends, model, config, client_settings))

    @property
    def client(self) -> AgentSpecClient:
        """The session-aware client underneath (its router, backend health, pins)."""
        return self._client

    def on_weight_update(self, version: int, *, keep_old_outputs: bool = False) -> None:
        """Policy ``version`` is live: every server is told (``POST /agentspec/v1/policy``),
        and samples dispatched from now on record it.

        On the servers, requests already in flight finish under the version they started
        with, and what older versions generated stops drafting at the group and global
        levels, unless ``keep_old_outputs``. The live version again changes nothing, so a
        retry is harmless; an engine behind (one restarted at no version) catches up.

        Every engine is told before any failure is raised: ``ValueError`` for a version
        older than this client's, or than an engine's (naming the engine: it runs a newer
        policy than the caller knows), and the HTTP error when an engine does not take it.
        ``policy_version`` moves only when every engine took it.
        """
        timeout = self._client.config.read_timeout_s
        answers = [
            (backend, httpx.post(url, json=body, headers=headers, timeout=timeout))
            for backend, url, body, headers in self._policy_requests(self._client.config, version, keep_old_outputs)
        ]
        _check_policy_answers(version, answers)
        self.policy_version = version

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        n: int = 1,
        sampling: SamplingParams | None = None,
        *,
        group_id: str | None = None,
        env: Environment | None = None,
        max_turns: int = 1,
    ) -> Group:
        """``n`` samples of one prompt as one group; raises :class:`RolloutError` if any fails."""
        ids = None if group_id is None else [group_id]
        return self._one(
            self.generate_many([prompt_token_ids], n, sampling, group_ids=ids, env=env, max_turns=max_turns)
        )

    def generate_many(
        self,
        prompts: Sequence[Sequence[int]],
        n: int = 1,
        sampling: SamplingParams | None = None,
        *,
        group_ids: Sequence[str] | None = None,
        env: Environment | None = None,
        max_turns: int = 1,
    ) -> list[Group | RolloutError]:
        """A group of ``n`` samples per prompt, all in flight together (bounded by
        ``max_concurrency``). A group whose sample fails comes back as its
        :class:`RolloutError`; the other groups are unaffected."""
        plans, jobs = self._plan(prompts, n, group_ids, max_turns)
        sampling = sampling or SamplingParams()
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(jobs))) as pool:
            futures = [pool.submit(self._sample, p, i, sampling, env, max_turns) for p, i in jobs]
            outcomes = [f.exception() or f.result() for f in futures]
        return _assemble(plans, jobs, outcomes)

    def _sample(
        self, plan: GroupPlan, index: int, sampling: SamplingParams, env: Environment | None, max_turns: int
    ) -> Sample:
        builder = self._builder(plan, index)
        fields = sampling.request_fields(index)
        with self._client.session(builder.session_id, plan.group_id) as session:
            for turn in range(max_turns):
                state = builder.add_model_turn(session.complete_tokens(builder.next_prompt(), **fields))
                if env is None or turn + 1 == max_turns:
                    break
                builder.add_env_step(env(state))
                if builder.done:
                    break
        return builder.build()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncRolloutClient(_Base):
    """Async :class:`RolloutClient` (anyio); ``env`` may be a plain or an async function."""

    def __init__(
        self,
        backends: Sequence[str] | None = None,
        model: str | None = None,
        *,
        max_concurrency: int = 64,
        config: ClientConfig | None = None,
        **client_settings: Any,
    ) -> None:
        super().__init__(max_concurrency)
        self._client = AsyncAgentSpecClient(self._config(backends, model, config, client_settings))
        self._limit = anyio.CapacityLimiter(max_concurrency)

    @property
    def client(self) -> AsyncAgentSpecClient:
        return self._client

    async def on_weight_update(self, version: int, *, keep_old_outputs: bool = False) -> None:
        """See :meth:`RolloutClient.on_weight_update` (the servers are told concurrently)."""
        requests = self._policy_requests(self._client.config, version, keep_old_outputs)
        answers: dict[int, tuple[str, httpx.Response]] = {}

        async def post(http: httpx.AsyncClient, k: int) -> None:
            backend, url, body, headers = requests[k]
            answers[k] = (backend, await http.post(url, json=body, headers=headers))

        async with (
            httpx.AsyncClient(timeout=self._client.config.read_timeout_s) as http,
            anyio.create_task_group() as tg,
        ):
            for k in range(len(requests)):
                tg.start_soon(post, http, k)
        _check_policy_answers(version, [answers[k] for k in sorted(answers)])  # in the backends' order
        self.policy_version = version

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        n: int = 1,
        sampling: SamplingParams | None = None,
        *,
        group_id: str | None = None,
        env: AsyncEnvironment | None = None,
        max_turns: int = 1,
    ) -> Group:
        """See :meth:`RolloutClient.generate`."""
        ids = None if group_id is None else [group_id]
        return self._one(
            await self.generate_many([prompt_token_ids], n, sampling, group_ids=ids, env=env, max_turns=max_turns)
        )

    async def generate_many(
        self,
        prompts: Sequence[Sequence[int]],
        n: int = 1,
        sampling: SamplingParams | None = None,
        *,
        group_ids: Sequence[str] | None = None,
        env: AsyncEnvironment | None = None,
        max_turns: int = 1,
    ) -> list[Group | RolloutError]:
        """See :meth:`RolloutClient.generate_many`."""
        plans, jobs = self._plan(prompts, n, group_ids, max_turns)
        sampling = sampling or SamplingParams()
        outcomes: list[Sample | BaseException | None] = [None] * len(jobs)

        async def run(k: int, plan: GroupPlan, index: int) -> None:
            async with self._limit:
                try:
                    outcomes[k] = await self._sample(plan, index, sampling, env, max_turns)
                except Exception as exc:  # noqa: BLE001 - a failed sample fails its group only
                    outcomes[k] = exc

        async with anyio.create_task_group() as tg:
            for k, (plan, index) in enumerate(jobs):
                tg.start_soon(run, k, plan, index)
        return _assemble(plans, jobs, outcomes)

    async def _sample(
        self, plan: GroupPlan, index: int, sampling: SamplingParams, env: AsyncEnvironment | None, max_turns: int
    ) -> Sample:
        builder = self._builder(plan, index)
        fields = sampling.request_fields(index)
        async with self._client.session(builder.session_id, plan.group_id) as session:
            for turn in range(max_turns):
                completion = await session.complete_tokens(builder.next_prompt(), **fields)
                state = builder.add_model_turn(completion)
                if env is None or turn + 1 == max_turns:
                    break
                step = env(state)
                if inspect.isawaitable(step):
                    step = await step
                builder.add_env_step(step)
                if builder.done:
                    break
        return builder.build()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        await self._client.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _assemble(
    plans: Sequence[GroupPlan],
    jobs: Sequence[Job],
    outcomes: Sequence[Sample | BaseException | None],
) -> list[Group | RolloutError]:
    """Outcomes of every sample, back into their groups; a group with a failed sample fails."""
    by_group: dict[str, list[Sample]] = {p.group_id: [] for p in plans}
    failed: dict[str, RolloutError] = {}
    for (plan, index), outcome in zip(jobs, outcomes, strict=True):
        if isinstance(outcome, Sample):
            by_group[plan.group_id].append(outcome)
        elif plan.group_id not in failed:
            failed[plan.group_id] = RolloutError(
                plan.group_id, f"sample {index}: {_reason(outcome or RuntimeError('not run'))}"
            )
    return [
        failed.get(p.group_id)
        or Group(p.group_id, p.prompt, tuple(sorted(by_group[p.group_id], key=lambda s: s.index)))
        for p in plans
    ]
