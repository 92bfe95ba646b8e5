"""The wire contract (agentspec.wire, docs/wire.md) without a server: id precedence and
validation, seed validation, the statistics shape. Pure Python: runs in the light install."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentspec import wire
from agentspec.wire import SeedKind, SeedScope, WireError, parse_seeds, resolve_ids


def _headers(**h: str):
    lowered = {k.replace("_", "-").lower(): v for k, v in h.items()}
    return lambda name: lowered.get(name.lower())


def test_precedence_follows_the_table() -> None:
    # Each request carries its form and every form of lower precedence; the first one wins.
    forms = {
        "xargs": ({"vllm_xargs": {"session_id": "a"}, "session_id": "b"}, _headers(x_session_id="e"), "c"),
        "body": ({"session_id": "b", "prompt_cache_key": "f"}, _headers(x_session_id="e"), "c"),
        "path": ({"prompt_cache_key": "f"}, _headers(x_litellm_session_id="d", x_session_id="e"), "c"),
        "litellm": ({"prompt_cache_key": "f"}, _headers(x_litellm_session_id="d", x_session_id="e"), None),
        "header": ({"prompt_cache_key": "f"}, _headers(x_session_id="e", x_smg_routing_key="g"), None),
        "cache_key": ({"prompt_cache_key": "f"}, _headers(x_smg_routing_key="g"), None),
        "smg": ({}, _headers(x_smg_routing_key="g"), None),
    }
    got = {name: resolve_ids(*args)[0] for name, args in forms.items()}
    assert got == {"xargs": "a", "body": "b", "path": "c", "litellm": "d", "header": "e", "cache_key": "f", "smg": "g"}


def test_a_routing_key_in_x_session_id_never_renames_a_litellm_session() -> None:
    # OpenHands behind vllm-router: litellm names the conversation, the routing header the task.
    body = {"prompt_cache_key": "conv-1"}
    headers = _headers(x_session_id="task-7", x_group_id="task-7", x_litellm_session_id="conv-1")
    assert resolve_ids(body, headers) == ("conv-1", "task-7")


def test_group_forms_and_absence() -> None:
    assert resolve_ids({"vllm_xargs": {"group_id": "g1"}}, _headers(x_group_id="g2")) == (None, "g1")
    assert resolve_ids({}, _headers(x_group_id="g2")) == (None, "g2")
    assert resolve_ids({}, _headers()) == (None, None)
    # A malformed vllm_xargs is vLLM's to refuse; the headers still count.
    assert resolve_ids({"vllm_xargs": "x"}, _headers(x_session_id="s")) == ("s", None)


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "é", "a\nb"])
def test_bad_ids_name_the_field(bad: str) -> None:
    with pytest.raises(WireError, match="X-Group-Id"):
        resolve_ids({}, _headers(x_group_id=bad))
    with pytest.raises(WireError, match="vllm_xargs.session_id"):
        resolve_ids({"vllm_xargs": {"session_id": bad}}, _headers())


@given(st.text(max_size=140))
def test_valid_ids_are_exactly_the_rule(text: str) -> None:
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:@/-")
    expected = 1 <= len(text) <= 128 and set(text) <= allowed
    assert wire.is_valid_id(text) is expected


def test_session_path_split() -> None:
    assert wire.split_session_path("/sessions/s1/v1/chat/completions") == ("s1", "/v1/chat/completions")
    assert wire.split_session_path("/v1/chat/completions") is None
    assert wire.split_session_path("/sessions/s1/health") is None


def test_seeds_parse_to_typed_specs() -> None:
    specs = parse_seeds(
        [{"text": "abc"}, {"token_ids": [1, 2], "scope": "group", "kind": "sibling_output"}],
        session_id="s",
        group_id=None,
    )
    assert specs[0] == wire.SeedSpec(SeedScope.SESSION, SeedKind.PRIOR_TURN, text="abc", where="agentspec_seeds[0]")
    assert specs[1].token_ids == (1, 2) and specs[1].scope is SeedScope.GROUP
    assert specs[1].kind is SeedKind.SIBLING_OUTPUT


@pytest.mark.parametrize(
    ("raw", "session", "message"),
    [
        ({"text": "a"}, "s", "must be a list"),
        (["a"], "s", r"agentspec_seeds\[0\] must be an object"),
        ([{"text": "a", "x": 1}], "s", "unknown field"),
        ([{"text": "a", "scope": "tenant"}], "s", "scope must be one of"),
        ([{"text": "a"}], None, "names no session"),
        ([{"text": "a", "scope": "group"}], None, "names no group or session"),
        ([{"text": "a", "kind": "secret"}], "s", "kind must be one of"),
        ([{"text": "a", "token_ids": [1]}], "s", "exactly one of"),
        ([{}], "s", "exactly one of"),
        ([{"text": 3}], "s", "text must be a string"),
        ([{"token_ids": [1, -1]}], "s", "non-negative"),
        ([{"token_ids": [True]}], "s", "non-negative"),
        ([{"token_ids": "12"}], "s", "non-negative"),
    ],
)
def test_bad_seeds_name_the_problem(raw: object, session: str | None, message: str) -> None:
    with pytest.raises(WireError, match=message):
        parse_seeds(raw, session_id=session, group_id=None)


def test_seed_limits_are_checked_before_tokenizing() -> None:
    with pytest.raises(WireError, match="max_seeds_per_request=2"):
        parse_seeds([{"text": "a"}] * 3, session_id="s", group_id=None, max_seeds=2)
    # Text so long that no tokenizer could fit it in the token limit is refused unread.
    too_long = "a" * (wire.CHARS_PER_TOKEN_BOUND * 10 + 1)
    with pytest.raises(WireError, match="max_seed_tokens_per_request=10"):
        parse_seeds([{"text": too_long}], session_id="s", group_id=None, max_tokens=10)
    with pytest.raises(WireError, match=r"at agentspec_seeds\[1\]"):
        parse_seeds([{"token_ids": [1] * 6}, {"token_ids": [1] * 5}], session_id="s", group_id=None, max_tokens=10)


def test_session_stats_body_has_exactly_the_contract_fields() -> None:
    body = wire.session_stats_body("s", "g", draft_tokens=4, accepted_tokens=3, held_tokens=9)
    assert tuple(body) == wire.SESSION_STATS_FIELDS
    assert body["acceptance_rate"] == 0.75 and body["held_tokens"] == 9
    assert wire.session_stats_body("s", None)["acceptance_rate"] == 0.0


def test_client_stats_model_carries_every_contract_field() -> None:
    from agentspec.client import SessionStats

    assert set(SessionStats.model_fields) - {"backend"} == set(wire.SESSION_STATS_FIELDS)
