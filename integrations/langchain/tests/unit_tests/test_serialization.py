"""Serialization round trip (the standard test_serdes with ChatAgentSpec allowed)."""

from __future__ import annotations

from langchain_core.load import dumpd, load

from langchain_agentspec import ChatAgentSpec


def test_round_trip_keeps_agentspec_fields() -> None:
    model = ChatAgentSpec(
        model="tiny",
        backends=["http://127.0.0.1:9", "http://127.0.0.1:10/v1"],
        session_id="s-1",
        group_id="g-1",
        api_key="k",
        extra_body={"top_k": 5},
    )
    data = dumpd(model)
    assert data["id"] == ["langchain_agentspec", "chat_models", "ChatAgentSpec"]
    # The key is a secret: never written out.
    assert "k" not in str(data["kwargs"].get("openai_api_key"))
    loaded = load(
        data,
        valid_namespaces=["langchain_agentspec"],
        allowed_objects=[ChatAgentSpec],
        secrets_map={"OPENAI_API_KEY": "k"},
    )
    assert isinstance(loaded, ChatAgentSpec)
    assert loaded.backends == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    assert (loaded.session_id, loaded.group_id) == ("s-1", "g-1")
    assert loaded.extra_body == {"top_k": 5}
    assert loaded.dict() == model.dict()
