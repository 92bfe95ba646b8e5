"""verl's agent loop on agentspec engines: a GRPO group's samples on one engine, token in and out.

verl (0.9) runs rollouts through an agent loop manager whose workers hand every agent loop
a *server manager*: an object with ``async generate(request_id, *, prompt_ids,
sampling_params, ...)`` returning verl's ``TokenOutput``. The manager class is chosen by
the config key ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (a dotted
path). This module provides:

- :class:`AgentspecServerClient`: that server manager, sending each call to ``agentspec
  serve`` engines through agentspec's session-aware client (``/v1/completions`` with token
  ids in and out). verl's ``request_id`` (one per trajectory, kept across its turns) names
  the agentspec session; the sample's GRPO group (verl's ``uid``) names the agentspec group,
  so the group's samples are pinned to one engine and draft from each other.
- ``AgentspecAgentLoopManager`` (verl's default V1 trainer, ``trainer.use_v1=true``) and
  ``AgentspecAgentLoopManagerV0`` (the legacy trainer): verl's own managers with that client
  in place of verl's, and workers that tell the client which group each trajectory belongs
  to. They are built on first access, so importing this module needs no verl.

The user's config (see ``examples/rl/verl_agent_loop.py``)::

    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=agentspec_rl.verl.AgentspecAgentLoopManager
    +actor_rollout_ref.rollout.custom.agentspec.backends='[http://gpu1:8001,http://gpu2:8001]'
    +actor_rollout_ref.rollout.custom.agentspec.model=my-policy

What the adapter does not do: move weights. verl's checkpoint engine updates verl's own
rollout replicas; the agentspec engines must be given each new policy by the deployment.
The managers announce every new ``global_steps`` to the engines as the policy version
(``POST /agentspec/v1/policy``; ``announce_policy_versions: false`` turns it off), so that
drafts learned under old weights retire; an engine that refuses one (it holds a newer
version, say from an earlier run) is logged, and training goes on.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from agentspec import wire
from agentspec.client import AsyncSession, ClientConfig
from agentspec_rl.client import AsyncRolloutClient, RolloutClient
from agentspec_rl.sampling import SamplingParams

if TYPE_CHECKING:
    from verl.workers.rollout.replica import TokenOutput

__all__ = [
    "CONFIG_PATH",
    "SAMPLING_KEYS",
    "AgentspecServerClient",
    "RolloutDefaults",
    "request_fields",
]

logger = logging.getLogger(__name__)

#: Where the adapter's settings live in verl's config (``RolloutConfig.custom`` is verl's
#: free-form extension point): ``actor_rollout_ref.rollout.custom.agentspec``.
CONFIG_PATH = "actor_rollout_ref.rollout.custom.agentspec"

#: The column of verl's batch that names a sample's GRPO group (one uuid per prompt and step).
GROUP_KEY = "uid"

#: The sampling parameters the adapter maps, and what each becomes on ``/v1/completions``.
SAMPLING_KEYS: Mapping[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k (-1: no cut)",
    "max_tokens": "max_tokens (absent: verl's rule from prompt_length and response_length)",
    "max_new_tokens": "max_tokens (SGLang's spelling)",
    "logprobs": "a truthy value returns the sampled token's log-probability (logprobs=0)",
    "seed": "seed",
    "stop_token_ids": "stop_token_ids",
    "stop": "stop (strings)",
    "repetition_penalty": "repetition_penalty (absent: rollout.repetition_penalty)",
    "ignore_eos": "ignore_eos (absent: rollout.ignore_eos)",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}

# Passed through as vLLM request fields, unchanged.
_PASSED = ("stop", "repetition_penalty", "ignore_eos", "min_tokens", "presence_penalty", "frequency_penalty")


@dataclasses.dataclass(frozen=True, slots=True)
class RolloutDefaults:
    """The parts of verl's rollout config that decide a request verl's own server would make:
    the length budget (when ``sampling_params`` has no ``max_tokens``) and the defaults it
    fills in."""

    prompt_length: int = 512
    response_length: int = 512
    max_model_len: int | None = None
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    full_determinism: bool = False
    seed: int = 42

    @classmethod
    def from_rollout_config(cls, rollout: Any) -> RolloutDefaults:
        """From ``config.actor_rollout_ref.rollout`` (a DictConfig, a dataclass or a mapping)."""
        defaults = cls()
        values = {f.name: _get(rollout, f.name, getattr(defaults, f.name)) for f in dataclasses.fields(cls)}
        return cls(**values)

    def max_tokens(self, prompt_len: int) -> int:
        """verl's server's budget for a request without ``max_tokens``: at most
        ``response_length``, and what is left of ``prompt_length + response_length``."""
        return min(self.response_length, self.prompt_length + self.response_length - prompt_len)


def request_fields(sampling_params: Mapping[str, Any], prompt_len: int, defaults: RolloutDefaults) -> dict[str, Any]:
    """The ``/v1/completions`` fields for verl's ``sampling_params`` (see :data:`SAMPLING_KEYS`).

    Raises ``ValueError`` naming a parameter the adapter does not map, or a prompt that
    leaves no room to generate within ``max_model_len``.
    """
    unknown = sorted(set(sampling_params) - set(SAMPLING_KEYS))
    if unknown:
        raise ValueError(
            f"sampling parameter {unknown[0]!r} is not supported by agentspec's verl adapter "
            f"(supported: {', '.join(SAMPLING_KEYS)})"
        )
    params = dict(sampling_params)
    if "max_tokens" in params and "max_new_tokens" in params:
        raise ValueError("give max_tokens or max_new_tokens, not both")
    max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
    if max_tokens is None:
        max_tokens = defaults.max_tokens(prompt_len)
    if defaults.max_model_len is not None:
        room = defaults.max_model_len - prompt_len
        if room < 1:
            raise ValueError(
                f"a prompt of {prompt_len} tokens leaves no room to generate"
                f" within max_model_len={defaults.max_model_len}"
            )
        max_tokens = min(max_tokens, room)
    params.setdefault("repetition_penalty", defaults.repetition_penalty)
    params.setdefault("ignore_eos", defaults.ignore_eos)
    seed = params.get("seed")
    if seed is None and defaults.full_determinism:
        seed = defaults.seed
    sampling = SamplingParams(
        max_tokens=max(1, int(max_tokens)),
        temperature=params.get("temperature", 1.0),
        top_p=params.get("top_p", 1.0),
        top_k=params.get("top_k", -1),
        seed=seed,
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        logprobs=bool(params.get("logprobs", False)),
        extra={k: params[k] for k in _PASSED if params.get(k) is not None},
    )
    # Index 0: verl's seed is the request's own (RolloutClient adds the sample index).
    return sampling.request_fields(0)


@dataclasses.dataclass
class _Trajectory:
    """One agent loop run: its group, its step, and the sessions its calls opened."""

    client: AgentspecServerClient
    group_id: str | None
    step: int | None
    stack: AsyncExitStack
    sessions: dict[str, AsyncSession] = dataclasses.field(default_factory=dict)


_trajectory: contextvars.ContextVar[_Trajectory | None] = contextvars.ContextVar(
    "agentspec_verl_trajectory", default=None
)


class AgentspecServerClient:
    """verl's server manager (the ``server_manager`` of every agent loop) on agentspec engines.

    ``await generate(request_id, prompt_ids=..., sampling_params=...)`` sends one model turn
    to ``/v1/completions`` (token ids in and out) through agentspec's session-aware client
    and returns verl's ``TokenOutput`` (token ids, log-probabilities when
    ``sampling_params["logprobs"]``, ``stop_reason`` ``completed``/``aborted``).

    Inside :meth:`trajectory` (the adapter's workers enter it around every agent loop), a
    call's session is ``<group>/<request_id>`` in that group, and stays open until the
    trajectory ends: the group's samples are pinned to one engine. Outside, the session is
    ``request_id`` alone.

    Picklable (verl sends the client to its worker actors): the live client is made in each
    process on first use.

    Args:
        backends: ``agentspec serve`` base URLs.
        model: the served model name (the server's first when None).
        defaults: verl's rollout lengths and defaults (:meth:`from_verl_config` reads them).
        config: a full :class:`~agentspec.client.ClientConfig` instead of backends and model.
        client_settings: more :class:`~agentspec.client.ClientConfig` fields.
    """

    def __init__(
        self,
        backends: Sequence[str] | None = None,
        model: str | None = None,
        *,
        defaults: RolloutDefaults | None = None,
        config: ClientConfig | None = None,
        **client_settings: Any,
    ) -> None:
        if config is None:
            config = ClientConfig(backends=list(backends or ()), model=model, **client_settings)
        elif backends is not None or model is not None or client_settings:
            raise TypeError("pass either a ClientConfig or backends, model and settings, not both")
        self.config = config
        self.defaults = defaults or RolloutDefaults()
        self._rollouts: AsyncRolloutClient | None = None

    @classmethod
    def from_verl_config(cls, config: Any) -> AgentspecServerClient:
        """From verl's whole config: the settings at :data:`CONFIG_PATH` (``backends``,
        ``model``, and any :class:`~agentspec.client.ClientConfig` field under ``client``),
        the lengths from ``actor_rollout_ref.rollout``."""
        rollout = _get(_get(config, "actor_rollout_ref", None), "rollout", None)
        settings = _plain(_get(_get(rollout, "custom", None), "agentspec", None))
        if not isinstance(settings, Mapping) or not settings.get("backends"):
            raise ValueError(
                f"agentspec's verl adapter needs its engines in {CONFIG_PATH}.backends: set "
                f"'+{CONFIG_PATH}.backends=[http://host:port,...]' (and .model, the served model name)"
            )
        unknown = sorted(set(settings) - _SETTINGS)
        if unknown:
            raise ValueError(f"unknown setting {unknown[0]!r} in {CONFIG_PATH} (known: {', '.join(sorted(_SETTINGS))})")
        backends = settings["backends"]
        if isinstance(backends, str):
            backends = [b for b in backends.split(",") if b]
        return cls(
            list(backends),
            settings.get("model"),
            defaults=RolloutDefaults.from_rollout_config(rollout),
            **dict(settings.get("client") or {}),
        )

    @property
    def rollouts(self) -> AsyncRolloutClient:
        """agentspec-rl's async rollout client underneath (made on first use, per process)."""
        if self._rollouts is None:
            self._rollouts = AsyncRolloutClient(config=self.config)
        return self._rollouts

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "defaults": self.defaults}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config = state["config"]
        self.defaults = state["defaults"]
        self._rollouts = None

    @asynccontextmanager
    async def trajectory(self, group_id: str | None, step: int | None = None) -> AsyncIterator[None]:
        """The calls made inside (in this task) are one trajectory of group ``group_id``:
        their sessions join the group and stay open until the block ends. ``step`` is verl's
        ``global_steps`` of the batch, returned in ``TokenOutput.extra_fields``."""
        if group_id is not None and (not wire.is_valid_id(group_id) or len(group_id) > 64):
            raise ValueError(f"group id {group_id!r} must be 1 to 64 characters of letters, digits and . _ : @ / -")
        async with AsyncExitStack() as stack:
            token = _trajectory.set(_Trajectory(self, group_id, step, stack))
            try:
                yield
            finally:
                _trajectory.reset(token)

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        image_data: Sequence[Any] | None = None,
        video_data: Sequence[Any] | None = None,
        audio_data: Sequence[Any] | None = None,
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        priority: int = 0,
        mm_processor_output: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """One model turn, as verl's server manager does it (see the class docstring).

        ``priority`` is accepted and not sent (agentspec engines schedule first come, first
        served). Raises ``NotImplementedError`` for images, video or audio, ``TypeError`` for
        an argument verl's server manager does not take, ``ValueError`` for a sampling
        parameter the adapter does not map (:data:`SAMPLING_KEYS`).
        """
        from verl.workers.rollout.replica import TokenOutput

        if kwargs:
            raise TypeError(f"agentspec's verl adapter does not take {', '.join(sorted(kwargs))}")
        if image_data or video_data or audio_data or mm_processor_output is not None:
            raise NotImplementedError("agentspec's verl adapter is text only: no images, video or audio")
        del mm_processor_kwargs, priority  # only about media and scheduling; see the docstring
        if not wire.is_valid_id(request_id):
            raise ValueError(f"request id {request_id!r} is not a valid agentspec session id")
        prompt = [int(t) for t in prompt_ids]
        fields = request_fields(sampling_params, len(prompt), self.defaults)
        trajectory = _trajectory.get()
        if trajectory is not None and trajectory.client is self:
            session = await self._session_of(trajectory, request_id)
            completion = await session.complete_tokens(prompt, **fields)
            step = trajectory.step
        else:
            async with self.rollouts.client.session(request_id) as session:
                completion = await session.complete_tokens(prompt, **fields)
            step = None
        logprobs = None
        if "logprobs" in fields:
            logprobs = [float(lp) if lp is not None else _missing(request_id) for lp in completion.logprobs or ()]
            if len(logprobs) != len(completion.token_ids):
                _missing(request_id)
        extra: dict[str, Any] = {"agentspec_backend": completion.backend}
        if step is not None:
            # verl's server reports the weights' version; the adapter knows the batch's step.
            extra.update(global_steps=step, min_global_steps=step, max_global_steps=step)
        return TokenOutput(
            token_ids=list(completion.token_ids),
            log_probs=logprobs,
            stop_reason=_STOP_REASONS.get(completion.finish_reason or "", completion.finish_reason),
            extra_fields=extra,
        )

    async def _session_of(self, trajectory: _Trajectory, request_id: str) -> AsyncSession:
        session = trajectory.sessions.get(request_id)
        if session is None:
            sid = request_id if trajectory.group_id is None else f"{trajectory.group_id}/{request_id}"
            session = await trajectory.stack.enter_async_context(self.rollouts.client.session(sid, trajectory.group_id))
            trajectory.sessions[request_id] = session
        return session

    def announce(self, version: int, *, keep_old_outputs: bool = False) -> None:
        """Tell every engine that policy ``version`` is live (``POST /agentspec/v1/policy``),
        from synchronous code: what older versions generated stops drafting (unless
        ``keep_old_outputs``). The managers call it with each new ``global_steps``."""
        with RolloutClient(config=self.config) as client:
            client.on_weight_update(version, keep_old_outputs=keep_old_outputs)


# verl's stop reasons: its vLLM server reports 'completed' for EOS, a stop token or the length
# budget, and 'aborted' for an aborted request.
_STOP_REASONS = {"stop": "completed", "length": "completed", "abort": "aborted"}

_SETTINGS = frozenset({"backends", "model", "client", "announce_policy_versions", "keep_old_outputs"})


def _missing(request_id: str) -> float:
    raise RuntimeError(f"request {request_id!r}: the server returned no log-probability for some generated tokens")


def _get(obj: Any, key: str, default: Any) -> Any:
    """``obj.key`` of a DictConfig, dataclass or mapping; ``default`` when absent or None."""
    if obj is None:
        return default
    value = obj.get(key, None) if isinstance(obj, Mapping) or hasattr(obj, "get") else getattr(obj, key, None)
    return default if value is None else value


def _plain(value: Any) -> Any:
    """A DictConfig/ListConfig as plain dicts and lists (anything else unchanged)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:
        return value
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _step_of(value: Any) -> int | None:
    """verl's ``global_steps`` of a batch as an int (it may come wrapped: NonTensorData, a
    tensor, a numpy scalar, one value per row); None when there is none."""
    value = getattr(value, "data", value)
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list | tuple):
        steps = [s for s in (_step_of(v) for v in value) if s is not None]
        return max(steps) if steps else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


# -- verl's classes, built on first access -------------------------------------------------------


def _actor_base(cls: Any) -> type:
    """The Python class behind a class verl decorated with ``@ray.remote``."""
    if isinstance(cls, type):
        return cls
    meta = getattr(cls, "__ray_metadata__", None)
    modified = getattr(meta, "modified_class", None)
    if not isinstance(modified, type):
        raise TypeError(f"cannot find the class behind Ray actor class {cls!r}")
    return modified.__bases__[0]


def _worker_class(base: type, name: str) -> type:
    """``base`` (verl's agent loop worker), each agent loop run inside the client's trajectory
    of its sample's group (the batch's ``uid``) and step."""

    async def _run_agent_loop(
        self: Any, sampling_params: dict[str, Any], trajectory: dict[str, Any], **kwargs: Any
    ) -> Any:
        client = self.llm_client
        run = super(cls, self)._run_agent_loop  # type: ignore[misc]
        if not isinstance(client, AgentspecServerClient):
            return await run(sampling_params, trajectory, **kwargs)
        group = kwargs.get(GROUP_KEY)
        async with client.trajectory(None if group is None else str(group), _step_of(trajectory.get("step"))):
            return await run(sampling_params, trajectory, **kwargs)

    cls = type(name, (base,), {"_run_agent_loop": _run_agent_loop, "__module__": __name__, "__qualname__": name})
    return cls


def _announce_quietly(client: AgentspecServerClient, step: int, keep_old_outputs: bool) -> bool:
    """Announce ``step`` as the policy version; a refusal is logged, not raised, because
    drafting is an optimisation: training must not stop for it (an engine left at a newer
    version by an earlier run refuses a resumed run's steps until they pass it)."""
    try:
        client.announce(step, keep_old_outputs=keep_old_outputs)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        logger.warning(
            "agentspec: could not announce policy version %s to the engines (%s); older outputs keep"
            " drafting until a later step is announced",
            step,
            exc,
        )
        return False
    return True


def _manager_class(base: type, worker: type, name: str) -> type:
    """``base`` (verl's agent loop manager) with :class:`AgentspecServerClient` as its
    client, ``worker`` as its workers, and each new ``global_steps`` announced."""
    import ray

    def __init__(self: Any, config: Any, llm_client: Any = None, *args: Any, **kwargs: Any) -> None:
        del llm_client  # verl's own client: its replicas get no requests from this manager
        base.__init__(self, config, AgentspecServerClient.from_verl_config(config), *args, **kwargs)
        self.agent_loop_workers_class = ray.remote(worker)
        settings = _plain(_get(_get(_get(config, "actor_rollout_ref", None), "rollout", None), "custom", None)) or {}
        options = settings.get("agentspec") or {}
        self._agentspec_announce = bool(options.get("announce_policy_versions", True))
        self._agentspec_keep_old = bool(options.get("keep_old_outputs", False))
        self._agentspec_version: int | None = None

    def _announce_step(self: Any, prompts: Any) -> None:
        if not self._agentspec_announce:
            return
        meta = getattr(prompts, "meta_info", None)
        raw = meta.get("global_steps") if isinstance(meta, Mapping) else _get(prompts, "global_steps", None)
        step = _step_of(raw)
        if step is not None and (self._agentspec_version is None or step > self._agentspec_version):
            _announce_quietly(self.llm_client, step, self._agentspec_keep_old)
            self._agentspec_version = step

    def generate_sequences(self: Any, prompts: Any) -> Any:
        _announce_step(self, prompts)
        return base.generate_sequences(self, prompts)

    namespace = {
        "__init__": __init__,
        "generate_sequences": generate_sequences,
        "__module__": __name__,
        "__qualname__": name,
    }
    return type(name, (base,), namespace)


def _build(name: str) -> type:
    if name in ("AgentspecAgentLoopWorkerV0", "AgentspecAgentLoopManagerV0"):
        from verl.experimental.agent_loop.agent_loop import (
            AgentLoopManager,
            AgentLoopWorker,
        )

        worker = _cached(
            "AgentspecAgentLoopWorkerV0", lambda: _worker_class(AgentLoopWorker, "AgentspecAgentLoopWorkerV0")
        )
        if name == "AgentspecAgentLoopWorkerV0":
            return worker
        return _manager_class(AgentLoopManager, worker, name)
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    worker = _cached(
        "AgentspecAgentLoopWorker", lambda: _worker_class(_actor_base(AgentLoopWorkerTQ), "AgentspecAgentLoopWorker")
    )
    if name == "AgentspecAgentLoopWorker":
        return worker
    return _manager_class(AgentLoopManagerTQ, worker, name)


_LAZY = frozenset(
    {
        "AgentspecAgentLoopManager",
        "AgentspecAgentLoopWorker",
        "AgentspecAgentLoopManagerV0",
        "AgentspecAgentLoopWorkerV0",
    }
)


def _cached(name: str, make: Any) -> type:
    # One class object per name and process: pickling by reference (Ray) must find it again.
    found = globals().get(name)
    if found is None:
        found = make()
        globals()[name] = found
    return found  # type: ignore[no-any-return]


def __getattr__(name: str) -> type:
    """The verl classes, built (importing verl) on first access:

    - ``AgentspecAgentLoopManager`` / ``AgentspecAgentLoopWorker``: verl's V1 trainer's
      (``AgentLoopManagerTQ``, the default of verl 0.9);
    - ``AgentspecAgentLoopManagerV0`` / ``AgentspecAgentLoopWorkerV0``: the legacy trainer's
      (``trainer.use_v1=false``, ``AgentLoopManager``).
    """
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return _cached(name, lambda: _build(name))
    except ImportError as exc:
        raise ImportError(f"agentspec_rl.verl.{name} needs verl 0.9 (pip install 'verl>=0.9,<0.10'): {exc}") from exc
