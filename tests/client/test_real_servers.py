"""The client against two real ``agentspec serve`` processes on the tiny test model.

Slow (the spare server starts beside the suite's shared one); marked ``server``. The
test that kills a backend runs last in the module and kills only the spare server.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import anyio
import pytest

from agentspec.client import (
    AgentSpecClient,
    AsyncAgentSpecClient,
    ClientConfig,
    RetryPolicy,
    ServerRefusedError,
    SessionClosedError,
)
from agentspec.client.routing import rendezvous_order
from agentspec.testing.stats import session_stats

pytestmark = pytest.mark.server

testing_server = pytest.importorskip("agentspec.testing.server")

GEN: dict[str, Any] = {"max_tokens": 8, "temperature": 0.0}


@pytest.fixture(scope="module")
def servers(agentspec_server, agentspec_spare_server) -> list:
    """Two ``agentspec serve`` backends: the suite's shared server and the spare one, the
    only one ever killed (the shared one serves other tests)."""
    return [agentspec_server, agentspec_spare_server]


@pytest.fixture
def real_config(servers) -> ClientConfig:
    return ClientConfig(
        backends=[s.url for s in servers if s.proc.poll() is None],
        model=testing_server.SERVED_MODEL_NAME,
        health_check_interval_s=None,
        read_timeout_s=120,
        retry=RetryPolicy(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0),
    )


def server_stats(url: str, session_id: str) -> dict | None:
    """What the server at ``url`` holds for the session now (None: nothing)."""
    return session_stats(url, session_id, wait=False)


def test_group_lands_on_one_backend(real_config) -> None:
    with AgentSpecClient(real_config) as client:
        sessions = [client.session(f"real-g-{i}", group_id="real-group") for i in range(4)]
        for s in sessions:
            r = s.chat([{"role": "user", "content": "def main():"}], **GEN)
            assert r.finish_reason in {"length", "stop"}
        (home,) = {s.backend for s in sessions}
        for s in sessions:
            stats = s.stats()
            assert stats.backend == home and stats.group_id == "real-group" and stats.calls == 1
            others = [b for b in client.backends if b != home]
            assert all(server_stats(b, s.session_id) is None for b in others)


def test_stream_and_token_calls(real_config) -> None:
    with AgentSpecClient(real_config) as client, client.session() as s:
        plain = s.chat([{"role": "user", "content": "import os"}], **GEN)
        streamed = s.stream_chat([{"role": "user", "content": "import os"}], **GEN).until_done()
        assert streamed.content == plain.content  # greedy: same text either way
        out = s.complete_tokens([11, 12, 13, 14], max_tokens=6, temperature=0.0, logprobs=1)
        assert len(out.token_ids) == 6 and out.prompt_token_ids == (11, 12, 13, 14)
        assert out.logprobs is not None and len(out.logprobs) == 6
        assert [t.kind for t in s.turns] == ["chat", "chat", "tokens"]


def test_fifty_concurrent_async_sessions_and_a_cancellation(real_config) -> None:
    async def main() -> None:
        async with AsyncAgentSpecClient(real_config) as client:
            finished: list[str] = []

            async def agent(i: int) -> None:
                async with client.session(f"real-a-{i}", group_id=f"real-t-{i % 5}") as s:
                    await s.chat([{"role": "user", "content": f"x = {i}"}], max_tokens=4, temperature=0.0)
                    finished.append(s.session_id)

            victim = client.session("real-victim")
            scope = anyio.CancelScope()

            async def doomed() -> None:
                with scope:
                    await victim.chat([{"role": "user", "content": "long"}], max_tokens=200, temperature=0.0)

            async with anyio.create_task_group() as tg:
                tg.start_soon(doomed)
                for i in range(50):
                    tg.start_soon(agent, i)
                await anyio.sleep(0.2)
                scope.cancel()
            assert len(finished) == 50
            assert victim.turns == ()
            assert client.healthy_backends() == list(client.backends)
            r = await victim.chat([{"role": "user", "content": "again"}], **GEN)
            assert r.finish_reason in {"length", "stop"}

    anyio.run(main)


def test_server_refusals_and_closed_session(real_config) -> None:
    with AgentSpecClient(real_config) as client:
        s = client.session()
        s.seed([10**7], kind="document")  # beyond the vocabulary: the server names the field
        with pytest.raises(ServerRefusedError) as info:
            s.chat([{"role": "user", "content": "hi"}], **GEN)
        assert info.value.status_code == 400
        assert "token" in info.value.message.lower()
        s.discard_seeds()
        s.chat([{"role": "user", "content": "hi"}], **GEN)
        s.close()
        with pytest.raises(SessionClosedError):
            s.chat([{"role": "user", "content": "hi"}], **GEN)


class CuttingProxy:
    """A TCP proxy in front of a real server that cuts every streamed response right after
    its ``cut_after``-th server-sent event: a backend dying mid-stream, deterministically."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.cut_after = cut_after
        self.cuts = 0
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._upstream)
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, cutting: bool) -> None:
        seen = b""
        try:
            while data := src.recv(65536):
                if cutting:
                    seen += data
                    events = seen.count(b"data: ")
                    if events >= self.cut_after:
                        # Forward up to the end of the cut_after-th event, then drop both ends.
                        end = 0
                        for _ in range(self.cut_after):
                            end = seen.index(b"\n\n", seen.index(b"data: ", end)) + 2
                        keep = len(data) - (len(seen) - end)
                        dst.sendall(data[:keep])
                        self.cuts += 1
                        break
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._listener.close()


def test_greedy_stream_cut_midway_resumes_on_another_backend_exactly(servers, real_config) -> None:
    shared, own = servers
    proxy = CuttingProxy(own.port, cut_after=2)  # the role chunk, then the first output
    try:
        backends = [proxy.url, shared.url]
        group = next(
            f"real-resume-{i}" for i in range(1000) if rendezvous_order(f"real-resume-{i}", backends)[0] == proxy.url
        )
        config = real_config.model_copy(update={"backends": tuple(backends)})
        ask = [{"role": "user", "content": "def fibonacci(n):"}]
        params: dict[str, Any] = {"max_tokens": 48, "temperature": 0.0, "extra_body": {"ignore_eos": True}}
        reference = real_config.model_copy(update={"backends": (shared.url,)})
        with AgentSpecClient(reference) as plain, plain.session() as ref:
            uncut = ref.stream_chat(ask, **params).until_done()
        with AgentSpecClient(config) as client, client.session(group_id=group) as s:
            stream = s.stream_chat(ask, **params)
            chunks = list(stream)
            result = stream.result
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        assert result is not None
        assert (proxy.cuts, result.backend, result.turn.attempts) == (1, shared.url, 2)
        assert text == result.content == uncut.content
        assert result.finish_reason == uncut.finish_reason == "length"
    finally:
        proxy.close()


def test_zz_kill_a_backend_mid_session(servers, real_config) -> None:
    # Runs last in the module: it kills our own server. The group id is chosen so that its
    # first rendezvous choice is that server (the shared one must live on).
    _shared, own = servers
    group = next(
        f"real-failover-{i}"
        for i in range(1000)
        if rendezvous_order(f"real-failover-{i}", real_config.backends)[0] == own.url
    )
    by_url = {s.url: s for s in servers}
    with AgentSpecClient(real_config) as client, client.session(group_id=group) as s:
        s.seed("class Repair:\n    pass\n", kind="repair_attempt")
        turn1 = s.chat([{"role": "user", "content": "def add(a, b):"}], **GEN)
        turn2 = s.chat(
            [
                {"role": "user", "content": "def add(a, b):"},
                turn1.message,
                {"role": "user", "content": "now subtract"},
            ],
            **GEN,
        )
        home = s.backend
        assert turn1.backend == turn2.backend == home == own.url
        by_url[home].stop()
        turn3 = s.chat([{"role": "user", "content": "and multiply"}], **GEN)
        other = turn3.backend
        assert other != home
        stats = server_stats(other, s.session_id)
        assert stats is not None and stats["seeded_tokens"] > 0
        assert s.stats().seeded_tokens == stats["seeded_tokens"]
        assert [t.backend for t in s.turns] == [home, home, other]
        assert [t.message for t in s.turns] == [turn1.message, turn2.message, turn3.message]
