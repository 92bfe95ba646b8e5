"""Seeds without generating: ``session.send_seeds()`` (``POST /agentspec/v1/seeds``) against
two stub servers over real HTTP. The real server's side is in test_stub_matches_server.py."""

from __future__ import annotations

import pytest

from agentspec import wire
from agentspec.client import AgentSpecClient, AsyncAgentSpecClient, ServerRefusedError
from agentspec.testing.stub import stub_tokenize

USER = [{"role": "user", "content": "hello there"}]


def _seed_requests(stub):
    return [r for r in stub.requests if r.path == wire.SEEDS_PATH]


def test_pending_seeds_go_now_and_once(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session("s-seed", group_id="g-seed") as s:
        s.chat(USER)
        home = stub_at(s.backend)
        s.seed("dropped by the condenser")
        s.seed([1, 2, 3], kind="sibling_output", scope="group")
        receipt = s.send_seeds()
        assert receipt.seeded_tokens == len(stub_tokenize("dropped by the condenser")) + 3
        assert (receipt.session_id, receipt.group_id, receipt.backend) == ("s-seed", "g-seed", home.url)
        assert s.pending_seeds == ()
        (sent,) = _seed_requests(home)
        assert sent.headers["x-session-id"] == "s-seed"
        assert sent.body[wire.SEEDS_FIELD] == [
            {"kind": "prior_turn", "scope": "session", "text": "dropped by the condenser"},
            {"kind": "sibling_output", "scope": "group", "token_ids": [1, 2, 3]},
        ]
        # A seed-only request is not a call, and its seeds do not travel again.
        assert s.stats().calls == 1
        s.chat(USER)
        assert wire.SEEDS_FIELD not in home.generation_requests()[-1].body
        assert len(s.turns) == 2


def test_nothing_pending_sends_nothing(config, stubs) -> None:
    with AgentSpecClient(config) as client, client.session() as s:
        receipt = s.send_seeds()
    assert receipt.seeded_tokens == 0
    assert not any(_seed_requests(stub) for stub in stubs)


def test_seed_only_fails_over_without_losing_seeds(config, stubs, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session("s-fo") as s:
        s.chat([{"role": "user", "content": "turn one"}])
        home = stub_at(s.backend)
        other = next(x for x in stubs if x is not home)
        home.fail_next(5, status=503)
        s.seed("keep me")
        receipt = s.send_seeds()
        assert receipt.backend == other.url
        (sent,) = _seed_requests(other)
        # The new backend first gets the session's history, then the seed.
        assert sent.body[wire.SEEDS_FIELD][-1]["text"] == "keep me"
        assert "turn one" in sent.body[wire.SEEDS_FIELD][0]["text"]


def test_refused_seeds_stay_pending(config, stub_at) -> None:
    with AgentSpecClient(config) as client, client.session("s-ref") as s:
        s.chat(USER)
        s.seed([5000])  # outside the stub's vocabulary: the server refuses it
        with pytest.raises(ServerRefusedError, match=r"token_ids must be a list of integers in \[0, 4096\)"):
            s.send_seeds()
        assert len(s.pending_seeds) == 1
        s.discard_seeds()
        assert s.send_seeds().seeded_tokens == 0


async def test_async_twin(config, stub_at) -> None:
    async with AsyncAgentSpecClient(config) as client, client.session("as-seed") as s:
        s.seed("abc")
        receipt = await s.send_seeds()
        assert receipt.seeded_tokens == 3 and s.pending_seeds == ()
        assert _seed_requests(stub_at(receipt.backend))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"agentspec_seeds": [{"text": "x"}], "messages": []}, "unknown field"),
        ({"agentspec_seeds": []}, "at least one seed"),
        (
            {"agentspec_seeds": [{"text": "x"}], "vllm_xargs": {"session_id": "s", "agentspec_seed_only": 1}},
            "may hold only",
        ),
    ],
)
def test_malformed_seed_requests_are_refused(stubs, body, message) -> None:
    import httpx

    r = httpx.post(stubs[0].url + wire.SEEDS_PATH, json=body, headers={wire.SESSION_HEADER: "s"})
    assert r.status_code == 400 and message in r.json()["error"]["message"]
