"""pytest plugin: the tiny test model and real vLLM servers on it, shared by every suite.

Opt-in: installing agentspec does not load it into anyone's pytest runs. Load it with
``pytest -p agentspec.testing.pytest_plugin``, or ``pytest_plugins =
["agentspec.testing.pytest_plugin"]`` in a root ``conftest.py`` (as this repository does,
for agentspec's tests and the integrations' alike, which then share the servers).

Fixtures: ``tiny_model_dir`` (the tiny model, built into ``$AGENTSPEC_TINY_MODEL_DIR`` when
set, else into the session's temporary folder), one session fixture per server kind of
:data:`agentspec.testing.server_kinds.SERVER_KINDS`:

- ``agentspec_server``, ``plain_server``, ``agentspec_peer_server``,
  ``agentspec_secured_server``, ``agentspec_hybrid_server``,
  ``agentspec_hybrid_sampled_server``, ``agentspec_spare_server`` (a test may kill it);
- ``agentspec_fleet_servers`` (the two Redis replicas) and ``redis_exchange`` (their
  ``redis-server``),
- ``agentspec_real_server`` and ``plain_real_server``: ``agentspec serve`` and plain vLLM
  on a real model, SmolLM2-135M-Instruct (:mod:`agentspec.testing.real_model`, built on
  first use into ``$AGENTSPEC_REAL_MODEL_DIR`` when set, else the session's temporary
  folder), and ``suffix_real_server``, vLLM's own suffix method on it,

and :func:`server_fixture` for a kind of one's own. How the servers are run:

- the run is reordered so that tests using the same servers run together (a module stays
  in one piece; modules without servers first), every test that uses a server fixture is
  marked ``server``, and a test that asks for one by name at run time
  (``request.getfixturevalue``) says so with ``@pytest.mark.server("fixture_name")``;
- servers start a few at a time (:mod:`agentspec.testing.server_pool`), each with 300 s
  from its own launch, and stop after their last test; one that cannot start fails its
  tests with one line naming the kind, what ran out and its log file, and no other test.

Without vLLM installed (the base install, or only the ``test`` extra), the tests that ask
for a server or the tiny model are skipped with the reason; importing the plugin needs
neither vLLM nor the draft index.

A suite whose own environment cannot hold vLLM (the OpenHands package needs Python 3.12,
vLLM's CPU build another) names an interpreter that has ``vllm-agentspec[cpu]`` in
``$AGENTSPEC_SERVER_PYTHON``: that one then builds the tiny model and runs the servers,
and the tests talk to them over HTTP as before.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentspec._extras import install_hint
from agentspec.testing.redis_server import NO_REDIS, RedisServer, redis_server_binary
from agentspec.testing.server import ServerStartError
from agentspec.testing.server_kinds import (
    ENV_SERVER_PYTHON,
    FLEET,
    FLEET_STREAM,
    SECURED_API_KEYS,
    SERVER_KINDS,
    TEST_INDEX_CONFIG,
    KindContext,
    ServerKind,
    server_python,
)
from agentspec.testing.server_pool import ServerPool

__all__ = [
    "ENV_SERVER_PYTHON",
    "FLEET",
    "FLEET_STREAM",
    "NO_VLLM",
    "SECURED_API_KEYS",
    "TEST_INDEX_CONFIG",
    "server_fixture",
    "server_python",
]

NO_VLLM = f"vLLM is not installed ({install_hint('serve')})"
#: What building the tiny model imports (all of them come with vLLM).
TINY_MODEL_MODULES = ("torch", "transformers", "tokenizers")
#: The attribute a server fixture's function carries: the kinds it returns.
KINDS_ATTR = "agentspec_server_kinds"

_PLAN = pytest.StashKey[list[tuple[ServerKind, ...]]]()
_INDEX = pytest.StashKey[dict[str, int]]()
_POOL = pytest.StashKey[ServerPool]()


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


def server_fixture(*kinds: ServerKind, doc: str | None = None) -> Any:
    """A session fixture returning the server of ``kinds[0]`` (several kinds: a tuple).

    Assign it in a ``conftest.py`` or plugin module; the name it is assigned to is the
    fixture's name::

        slow_server = server_fixture(ServerKind("slow", "...", settings=...))
    """

    def fixture(_agentspec_server_pool: ServerPool) -> Any:
        servers = tuple(_server(_agentspec_server_pool, kind) for kind in kinds)
        return servers if len(servers) > 1 else servers[0]

    setattr(fixture, KINDS_ATTR, kinds)
    fixture.__doc__ = doc or kinds[0].description
    return pytest.fixture(scope="session")(fixture)


def _server(pool: ServerPool, kind: ServerKind) -> Any:
    try:
        return pool.get(kind)
    except ServerStartError as error:
        failure = str(error)
    # Outside the except block: a failure raised inside it would print the error twice.
    pytest.fail(failure, pytrace=False)


# -- fixtures --------------------------------------------------------------------------------

agentspec_server = server_fixture(SERVER_KINDS["agentspec"])
plain_server = server_fixture(SERVER_KINDS["plain"])
agentspec_peer_server = server_fixture(SERVER_KINDS["peer"])
agentspec_secured_server = server_fixture(SERVER_KINDS["secured"])
agentspec_hybrid_server = server_fixture(SERVER_KINDS["hybrid"])
agentspec_hybrid_sampled_server = server_fixture(SERVER_KINDS["hybrid-sampled"])
agentspec_spare_server = server_fixture(SERVER_KINDS["spare"])
agentspec_fleet_servers = server_fixture(
    *(SERVER_KINDS[r] for r in FLEET), doc="The Redis replicas " + ", ".join(FLEET)
)
agentspec_real_server = server_fixture(SERVER_KINDS["real"])
plain_real_server = server_fixture(SERVER_KINDS["real-plain"])
suffix_real_server = server_fixture(SERVER_KINDS["real-suffix"])


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


class _LazyRealModel:
    """The real model (:mod:`agentspec.testing.real_model`), built by the first kind that
    serves it, by the interpreter that serves (``$AGENTSPEC_SERVER_PYTHON`` or this one)."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.folder: Path | None = None

    def get(self) -> Path:
        if self.folder is None:
            python = server_python()
            if python is None:
                from agentspec.testing.real_model import build_real_model

                self.folder = build_real_model(self.cache)
            else:
                cmd = [python, "-m", "agentspec.testing.real_model", str(self.cache)]
                built = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if built.returncode != 0:
                    raise RuntimeError(
                        f"{ENV_SERVER_PYTHON}={python} could not build the real model: {built.stderr[-500:]}"
                    )
                self.folder = Path(built.stdout.strip().splitlines()[-1])
        return self.folder


class _LazyRedis:
    """The run's ``redis-server``, started by the first kind that needs it."""

    def __init__(self) -> None:
        self.server: RedisServer | None = None

    def get(self) -> RedisServer:
        if self.server is None:
            if redis_server_binary() is None:
                pytest.skip(NO_REDIS)
            self.server = RedisServer().start()
        return self.server

    def url(self) -> str:
        return self.get().url

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


_REDIS = pytest.StashKey[_LazyRedis]()


@pytest.fixture(scope="session")
def _agentspec_server_pool(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerPool]:
    if not _vllm_available():
        python = server_python()
        pytest.skip(f"{ENV_SERVER_PYTHON}={python} cannot import vllm" if python else NO_VLLM)
    from agentspec.testing.real_model import ENV_DIR as REAL_MODEL_ENV_DIR

    redis = _LazyRedis()
    real_model = _LazyRealModel(Path(os.environ.get(REAL_MODEL_ENV_DIR) or tmp_path_factory.mktemp("real-model")))
    context = KindContext(
        model_dir=tiny_model_dir,
        log_dir=tmp_path_factory.mktemp("vllm-logs"),
        exchange_dir=tmp_path_factory.mktemp("exchange"),
        redis_url=redis.url,
        real_model_dir=real_model.get,
    )
    session = request.session
    plan: list[tuple[ServerKind, ...]] = session.stash.get(_PLAN, [])
    pool = ServerPool(context, plan)
    session.stash[_POOL] = pool
    session.stash[_REDIS] = redis
    try:
        yield pool
    finally:
        pool.close()
        redis.close()


@pytest.fixture(scope="session")
def real_model_dir(_agentspec_server_pool: ServerPool) -> Path:
    """The real model's folder (built on first use), the one the real-model kinds serve."""
    return _agentspec_server_pool.context.real_model_dir()


@pytest.fixture(scope="session")
def redis_exchange(request: pytest.FixtureRequest, agentspec_fleet_servers: Any) -> RedisServer:
    """The ``redis-server`` of ``agentspec_fleet_servers`` (a test may stop and start it)."""
    return request.session.stash[_REDIS].get()


# -- the plan: which servers each test uses, tests grouped by them ---------------------------


def _fixture_kinds(item: pytest.Item, name: str) -> tuple[ServerKind, ...]:
    defs = item.session._fixturemanager.getfixturedefs(name, item)  # noqa: SLF001 - no public lookup
    return getattr(defs[-1].func, KINDS_ATTR, ()) if defs else ()


def item_kinds(item: pytest.Item) -> tuple[ServerKind, ...]:
    """The server kinds ``item`` uses: through its fixtures, or named by its ``server`` marks."""
    names = list(getattr(item, "fixturenames", ()))
    for mark in item.iter_markers("server"):
        names.extend(mark.args)
    kinds: dict[str, ServerKind] = {}
    for name in names:
        for kind in _fixture_kinds(item, name):
            kinds.setdefault(kind.name, kind)
    return tuple(kinds.values())


def _rank(kind: ServerKind) -> int:
    order = list(SERVER_KINDS)
    return order.index(kind.name) if kind.name in order else len(order)


def grouped(items: Sequence[pytest.Item], kinds_of: Callable[[pytest.Item], Sequence[ServerKind]]) -> list[pytest.Item]:
    """``items`` with each module kept whole and modules ordered by the servers they use:
    none first, then by the latest kind of :data:`SERVER_KINDS` they use, then the next
    latest, and so on (a stable sort), so that each kind's users run together."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def key(members: list[pytest.Item]) -> tuple[int, ...]:
        ranks = {_rank(kind) for item in members for kind in kinds_of(item)}
        return tuple(sorted(ranks, reverse=True))

    return [item for members in sorted(modules.values(), key=key) for item in members]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "server(*fixture_names): starts real vLLM servers (set from fixture use; name the server "
        "fixtures a test gets with request.getfixturevalue)",
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects, so that `-m "not server"` sees the marks
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    kinds = {item.nodeid: item_kinds(item) for item in items}
    for item in items:
        if kinds[item.nodeid] and item.get_closest_marker("server") is None:
            item.add_marker(pytest.mark.server)
    items[:] = grouped(items, lambda item: kinds[item.nodeid])


def pytest_collection_finish(session: pytest.Session) -> None:
    session.stash[_PLAN] = [item_kinds(item) for item in session.items]
    session.stash[_INDEX] = {item.nodeid: i for i, item in enumerate(session.items)}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        pool = item.session.stash.get(_POOL, None)
        index = item.session.stash.get(_INDEX, {}).get(item.nodeid)
        if pool is not None and index is not None:
            pool.finished(index)
