"""Precedence and validation of session/group id forms (docs/wire.md), without a server."""

from __future__ import annotations

import pytest

from agentspec.engine.middleware import WireError, _Headers, _resolve_ids


def _headers(**h: str) -> _Headers:
    return _Headers({"headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in h.items()]})


def test_precedence_follows_the_table() -> None:
    forms = {
        "xargs": ({}, {"session_id": "a"}, _headers(), None),
        "body": ({"session_id": "b"}, {}, _headers(x_session_id="c"), None),
        "header": ({"prompt_cache_key": "f"}, {}, _headers(x_session_id="c"), "d"),
        "path": ({"prompt_cache_key": "f"}, {}, _headers(x_litellm_session_id="e"), "d"),
        "litellm": ({"prompt_cache_key": "f"}, {}, _headers(x_litellm_session_id="e"), None),
        "cache_key": ({"prompt_cache_key": "f"}, {}, _headers(x_smg_routing_key="g"), None),
        "smg": ({}, {}, _headers(x_smg_routing_key="g"), None),
    }
    got = {name: _resolve_ids(*args)[0] for name, args in forms.items()}
    assert got == {"xargs": "a", "body": "b", "header": "c", "path": "d", "litellm": "e", "cache_key": "f", "smg": "g"}


def test_group_forms_and_absence() -> None:
    assert _resolve_ids({}, {"group_id": "g1"}, _headers(x_group_id="g2"), None) == (None, "g1")
    assert _resolve_ids({}, {}, _headers(x_group_id="g2"), None) == (None, "g2")
    assert _resolve_ids({}, {}, _headers(), None) == (None, None)


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "é", "a\nb"])
def test_bad_ids_name_the_field(bad: str) -> None:
    with pytest.raises(WireError, match="X-Group-Id"):
        _resolve_ids({}, {}, _headers(x_group_id=bad), None)
    with pytest.raises(WireError, match="vllm_xargs.session_id"):
        _resolve_ids({}, {"session_id": bad}, _headers(), None)
