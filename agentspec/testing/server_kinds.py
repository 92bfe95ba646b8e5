"""The kinds of real vLLM server the test suites share, described once.

A :class:`ServerKind` says how one server is configured; the pytest plugin
(:mod:`agentspec.testing.pytest_plugin`) turns each entry of :data:`SERVER_KINDS` into a
fixture, starts each kind at most once per run, and stops it after its last user.
:func:`agentspec.testing.pytest_plugin.server_fixture` makes a fixture of a kind of one's own.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentspec.engine.settings import DrafterSettings, EngineSettings
from agentspec.index.policy import IndexConfig
from agentspec.testing.server import DEFAULT_KV_CACHE_BYTES, VLLMServer

#: Index budgets of the shared test servers: small enough that a test can drive the index
#: past them (eviction), large enough that no other test notices.
TEST_INDEX_CONFIG = IndexConfig(
    global_max_tokens=100_000,
    sessions_max_tokens=400_000,
    session_max_tokens=50_000,
    max_sessions=32,
    seed_max_tokens=40_000,
    seed_max_total_tokens=50_000,
)

#: The API keys of the ``secured`` kind.
SECURED_API_KEYS = ("key-tenant-a", "key-tenant-b")
#: The replica ids of the ``fleet-a`` and ``fleet-b`` kinds, and their Redis stream.
FLEET = ("fleet-a", "fleet-b")
FLEET_STREAM = "agentspec-test-fleet"
#: An interpreter with ``vllm-agentspec[cpu]`` that builds the tiny model and runs the
#: servers, for suites whose own environment has no vLLM.
ENV_SERVER_PYTHON = "AGENTSPEC_SERVER_PYTHON"


#: The served name of the real model's kinds, and their options beside the test servers'
#: own (a repeated option replaces): its fp32 KV cache takes 45 KiB a token, so 256 MiB
#: holds 5.8k tokens, two sequences of 2,048.
REAL_MODEL_NAME = "smollm2"
REAL_MODEL_ARGS: tuple[str, ...] = ("--served-model-name", REAL_MODEL_NAME)


def _no_real_model() -> Path:
    raise RuntimeError("this run's KindContext was given no real_model_dir")


def server_python() -> str | None:
    """The interpreter named by ``$AGENTSPEC_SERVER_PYTHON``, or None (this one serves)."""
    return os.environ.get(ENV_SERVER_PYTHON) or None


@dataclass(frozen=True)
class KindContext:
    """What every kind is built from in one test run."""

    model_dir: Path
    log_dir: Path
    #: The folder the agentspec replicas exchange their outputs through.
    exchange_dir: Path
    #: Starts the run's ``redis-server`` on first call and returns its URL.
    redis_url: Callable[[], str]
    #: Builds the real model (:mod:`agentspec.testing.real_model`) on first call and
    #: returns its folder; the kinds with ``model="real"`` serve it.
    real_model_dir: Callable[[], Path] = lambda: _no_real_model()


@dataclass(frozen=True)
class ServerKind:
    """One configuration of a test server.

    ``settings`` builds the engine settings (None: plain vLLM, no agentspec); a kind that
    tests kill (``disposable``) is started afresh for its next user.
    """

    name: str
    description: str
    settings: Callable[[KindContext], EngineSettings] | None
    extra_args: tuple[str, ...] = ()
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    disposable: bool = False
    #: ``tiny`` (the tiny model, served as ``tiny``) or ``real`` (SmolLM2-135M-Instruct,
    #: served as :data:`REAL_MODEL_NAME`).
    model: str = "tiny"
    #: Environment variables the server starts with (``extra_env`` of :meth:`launch` adds).
    env: tuple[tuple[str, str], ...] = ()

    def launch(self, context: KindContext, *, extra_env: dict[str, str] | None = None) -> VLLMServer:
        """Start this kind's server and return at once (see :meth:`VLLMServer.wait_ready`)."""
        settings = self.settings(context) if self.settings is not None else None
        real = self.model == "real"
        return VLLMServer.launch(
            context.real_model_dir() if real else context.model_dir,
            agentspec=settings is not None,
            settings=settings,
            extra_args=(*REAL_MODEL_ARGS, *self.extra_args) if real else self.extra_args,
            log_dir=context.log_dir,
            kv_cache_bytes=self.kv_cache_bytes,
            python=server_python(),
            name=self.name,
            extra_env={**dict(self.env), **(extra_env or {})},
        )


def build_with_server_python(builder: str, model_dir: Path) -> Path:
    """A drafter of the tiny model (``builder``, a function of
    :mod:`agentspec.testing.tiny_model`), built by the interpreter that serves."""
    python = server_python()
    if python is None:
        from agentspec.testing import tiny_model

        return Path(getattr(tiny_model, builder)(model_dir))
    code = f"import sys; from agentspec.testing.tiny_model import {builder} as b; print(b(sys.argv[1]))"
    built = subprocess.run([python, "-c", code, str(model_dir)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise RuntimeError(f"{ENV_SERVER_PYTHON}={python} could not build {builder}:\n{built.stderr[-2000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


def _replica(share_across_tenants: bool, steps: str) -> Callable[[KindContext], EngineSettings]:
    # Every step logged, for the engine-fidelity tests (agentspec.replay.step_replay).
    def settings(c: KindContext) -> EngineSettings:
        return EngineSettings(
            index=TEST_INDEX_CONFIG,
            exchange_dir=str(c.exchange_dir),
            share_across_tenants=share_across_tenants,
            step_log_dir=str(c.log_dir / steps),
        )

    return settings


def _fleet(replica: str) -> Callable[[KindContext], EngineSettings]:
    # Replicas on "two machines": only Redis between them. The stream is named so that a
    # test can reach it (corrupt entries, trimming).
    def settings(c: KindContext) -> EngineSettings:
        return EngineSettings(
            index=TEST_INDEX_CONFIG,
            exchange_url=f"{c.redis_url()}?stream={FLEET_STREAM}",
            replica_id=replica,
            exchange_interval_s=0.1,
        )

    return settings


def _index_only(c: KindContext) -> EngineSettings:
    return EngineSettings(index=TEST_INDEX_CONFIG)


SERVER_KINDS: dict[str, ServerKind] = {
    k.name: k
    for k in (
        ServerKind(
            "agentspec",
            "``agentspec serve`` on the tiny model (served name ``tiny``, hermes tool calling); "
            "tenants isolated, outputs exchanged with ``peer`` through a shared folder",
            _replica(False, "steps-agentspec"),
        ),
        ServerKind("plain", "plain vLLM on the tiny model without speculation: the losslessness reference", None),
        ServerKind(
            "hybrid",
            "``agentspec serve --agentspec-drafter`` with the tiny model as its own draft model (4 tokens): "
            "a drafter that always agrees, so a fault in the draft KV cache shows as a rejected draft; under "
            "the fixed batch rule, because the cost budget would rightly never pay for a drafter as large as "
            "the target on a CPU, and the tests are about switching paths",
            lambda c: EngineSettings(
                index=TEST_INDEX_CONFIG,
                drafter=DrafterSettings(model=str(c.model_dir), num_tokens=4),
                draft_budget="batch",
            ),
        ),
        ServerKind(
            "hybrid-sampled",
            "``agentspec serve --agentspec-drafter`` with an EAGLE-3 head in train-drafter's layout (a reduced "
            "draft vocabulary mapped by ``d2t``), whose drafts vLLM samples (``draft_sample_method: probabilistic``)",
            lambda c: EngineSettings(
                index=TEST_INDEX_CONFIG,
                drafter=DrafterSettings(
                    model=str(build_with_server_python("build_tiny_reduced_eagle3_head", c.model_dir)),
                    num_tokens=3,
                    method="eagle3",
                ),
                draft_budget="batch",  # as hybrid's: every path taken, whatever it costs here
            ),
            extra_args=("--speculative-config", '{"draft_sample_method": "probabilistic"}'),
        ),
        ServerKind(
            "spare",
            "an ``agentspec serve`` of its own that a test may kill (a backend failing); "
            "its next user gets a fresh one",
            _index_only,
            disposable=True,
        ),
        ServerKind(
            "peer",
            "a second ``agentspec serve``, a replica of ``agentspec`` (the shared exchange folder) "
            "that shares drafting across tenants (the operator's option)",
            _replica(True, "steps-peer"),
        ),
        ServerKind(
            "secured",
            "``agentspec serve`` with API keys (``SECURED_API_KEYS``) and two API servers "
            "(``--api-server-count 2``: Prometheus multiprocess mode, which its metrics test is about)",
            _index_only,
            # Scale-out on: vLLM's /inference/v1/generate is a route agentspec's middleware
            # does not rewrite. One option, several values (a repeated option replaces).
            extra_args=("--api-key", *SECURED_API_KEYS, "--enable-scale-out", "--api-server-count", "2"),
        ),
        ServerKind(
            "real",
            "``agentspec serve`` on the real model (SmolLM2-135M-Instruct, served as ``smollm2``): "
            "real text, for acceptance and identity on it; its steps logged (the live benchmark's smoke test); "
            "vLLM's development routes on (the RL benchmark's smoke test reloads weights in place)",
            lambda c: EngineSettings(index=TEST_INDEX_CONFIG, step_log_dir=str(c.log_dir / "steps-real")),
            model="real",
            env=(("VLLM_SERVER_DEV_MODE", "1"),),
        ),
        ServerKind(
            "real-plain",
            "plain vLLM on the real model without speculation: the reference on real text",
            None,
            model="real",
        ),
        ServerKind(
            "real-suffix",
            "vLLM's own suffix method on the real model, without agentspec (so without its fix of "
            "vLLM 0.32's CPU rejection sampler): the negative control of the sampled-distribution test",
            None,
            extra_args=("--speculative-config", '{"method": "suffix"}'),
            model="real",
        ),
        *(
            ServerKind(
                replica,
                f"``agentspec serve`` replica ``{replica}`` exchanging outputs with the other through a real "
                "``redis-server``; tenants isolated",
                _fleet(replica),
            )
            for replica in FLEET
        ),
    )
}
"""Every kind, in the order the plugin groups tests by: a module runs after those whose
kinds all come earlier here, so that each server stops as soon as its last user is done."""
