"""The integration's pieces against agentspec's stub server (real HTTP, no vLLM): the LLM's
fields, what is seeded and when, and that nothing is lost when a seed cannot be delivered."""

from __future__ import annotations

import json

import pytest
from openhands.sdk import LLM, Agent
from openhands.sdk.context.condenser import LLMSummarizingCondenser
from openhands.sdk.context.condenser.base import CondenserBase
from openhands.sdk.context.view import View
from openhands.sdk.event import (
    ActionEvent,
    AgentErrorEvent,
    MessageEvent,
    ObservationEvent,
)
from openhands.sdk.event.condenser import Condensation
from openhands.sdk.llm import Message, MessageToolCall, TextContent
from openhands.sdk.llm.call_context import LLMCallContext, llm_call_context_scope
from openhands.tools.terminal import TerminalAction, TerminalObservation

from agentspec import wire
from agentspec.client import Seed
from agentspec.testing.stub import StubServer
from openhands_agentspec import (
    RepairSeeder,
    SeedingCondenser,
    agentspec_llm,
    conversation_stats,
    failed,
    forgotten_text,
    group_of,
    routing_headers,
)
from openhands_agentspec._endpoint import MAX_PENDING_SEEDS, SeedPoster, split_seeds
from openhands_agentspec._text import tool_call_text


def message(text: str) -> MessageEvent:
    return MessageEvent(
        llm_message=Message(role="user", content=[TextContent(text=text)]),
        source="user",
    )


def action(call_id: str, command: str) -> ActionEvent:
    call = MessageToolCall(
        id=call_id,
        name="terminal",
        arguments=json.dumps({"command": command}),
        origin="completion",
    )
    return ActionEvent(
        thought=[],
        action=TerminalAction(command=command),
        tool_name="terminal",
        tool_call_id=call_id,
        tool_call=call,
        llm_response_id=f"resp-{call_id}",
    )


def result(act: ActionEvent, exit_code: int, *, is_error: bool = False) -> ObservationEvent:
    observation = TerminalObservation.from_text("output", exit_code=exit_code, is_error=is_error, command="c")
    return ObservationEvent(
        observation=observation,
        action_id=act.id,
        tool_name="terminal",
        tool_call_id=act.tool_call_id,
    )


# ---------------------------------------------------------------------------- the LLM


def test_llm_names_group_and_keeps_sampling_in_the_body() -> None:
    llm = agentspec_llm(
        "http://router:30000/", "qwen", group_id="django-11099", api_key="k", temperature=0.0,
        extra_body={"top_p": 0.9}, max_output_tokens=64,
    )  # fmt: skip
    assert llm.model == "openai/qwen" and llm.base_url == "http://router:30000/v1"
    assert llm.extra_headers == {
        wire.SESSION_HEADER: "django-11099",
        wire.GROUP_HEADER: "django-11099",
    }
    assert llm.litellm_extra_body == {"top_p": 0.9, "temperature": 0.0}
    assert llm.max_output_tokens == 64 and group_of(llm) == "django-11099"
    # A plain LLM: OpenHands' own validation keeps every field (a subclass would not survive it).
    again = LLM.model_validate(llm.model_dump())
    assert type(again) is LLM and again.extra_headers == llm.extra_headers
    assert again.litellm_extra_body == llm.litellm_extra_body


def test_llm_without_group_sends_no_routing_header() -> None:
    llm = agentspec_llm("http://server:8000/v1", "openai/served")
    assert llm.model == "openai/served" and llm.extra_headers is None and group_of(llm) is None


def test_a_bad_group_id_is_refused_naming_the_rule() -> None:
    with pytest.raises(ValueError, match="group_id 'a b' must be 1 to 128 characters"):
        routing_headers("a b")


# ---------------------------------------------------------------------------- what is seeded


def test_forgotten_text_is_the_forgotten_events_text_in_order() -> None:
    events = [
        message("task"),
        message("first look"),
        message("second look"),
        message("latest"),
    ]
    condensation = Condensation(forgotten_event_ids={events[2].id, events[1].id}, llm_response_id="r")
    assert forgotten_text(View.from_events(events), condensation) == [
        "first look",
        "second look",
    ]


def test_a_tool_call_is_seeded_as_the_model_writes_it() -> None:
    text = tool_call_text(action("c1", "pytest -x").tool_call)
    assert text == '<tool_call>\n{"name": "terminal", "arguments": {"command": "pytest -x"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("exit_code", "is_error", "expected"), [(0, False, False), (1, False, True), (-1, False, False), (0, True, True)]
)
def test_failed_reads_exit_codes_and_errors(exit_code: int, is_error: bool, expected: bool) -> None:
    assert failed(result(action("c", "x"), exit_code, is_error=is_error)) is expected


class ForgetMiddle(CondenserBase):
    """Forgets every event but the first and the last (a summarising condenser's shape)."""

    def condense(self, view: View, agent_llm: LLM | None = None) -> View | Condensation:
        middle = {e.id for e in view.events[1:-1]}
        return Condensation(forgotten_event_ids=middle, llm_response_id="summary") if middle else view


def test_condenser_seeds_what_it_forgets_into_the_running_conversation(
    stub: StubServer,
) -> None:
    llm = agentspec_llm(stub.url, "tiny", group_id="task-1")
    condenser = SeedingCondenser(condenser=ForgetMiddle())
    events = [
        message("task"),
        message("ran the tests: 3 failures"),
        message("read models.py"),
        message("now"),
    ]
    with llm_call_context_scope(LLMCallContext().for_conversation("conv-1")):
        out = condenser.condense(View.from_events(events), agent_llm=llm)
    assert isinstance(out, Condensation)
    state = stub.sessions["conv-1"]
    assert [s["text"] for s in state.seeds] == [
        "ran the tests: 3 failures",
        "read models.py",
    ]
    assert {s["kind"] for s in state.seeds} == {"prior_turn"} and state.group_id == "task-1"
    assert condenser.seeded_tokens == state.seeded_tokens == state.seeded_tokens_by_kind["prior_turn"] > 0
    assert conversation_stats(llm, "conv-1").seeded_tokens_by_kind == {"prior_turn": state.seeded_tokens}


def test_condenser_without_a_conversation_seeds_nothing(stub: StubServer) -> None:
    llm = agentspec_llm(stub.url, "tiny")
    out = SeedingCondenser(condenser=ForgetMiddle()).condense(View.from_events([message(t) for t in "abc"]), llm)
    assert isinstance(out, Condensation) and stub.sessions == {}


def test_seeding_condenser_survives_openhands_serialisation() -> None:
    llm = agentspec_llm("http://server:8000", "tiny", group_id="t")
    inner = LLMSummarizingCondenser(llm=llm.model_copy(update={"usage_id": "condenser"}), max_size=10)
    agent = Agent(llm=llm, tools=[], condenser=SeedingCondenser(condenser=inner))
    again = Agent.model_validate(agent.model_dump())
    assert isinstance(again.condenser, SeedingCondenser)
    assert isinstance(again.condenser.condenser, LLMSummarizingCondenser)
    assert again.condenser.get_llm() is not None and again.condenser.get_llm().usage_id == "condenser"


def test_repair_hook_seeds_failed_calls_only(stub: StubServer) -> None:
    hook = RepairSeeder(agentspec_llm(stub.url, "tiny", group_id="task-2"), "conv-2")
    ok, bad, refused = (
        action("c1", "ls"),
        action("c2", "cat missing.txt"),
        action("c3", "sed -i x"),
    )
    for event in (ok, result(ok, 0), bad, result(bad, 1), refused):
        hook(event)
    hook(AgentErrorEvent(error="bad arguments", tool_name="terminal", tool_call_id="c3"))
    state = stub.sessions["conv-2"]
    assert [s["text"] for s in state.seeds] == [
        tool_call_text(bad.tool_call),
        tool_call_text(refused.tool_call),
    ]
    assert {s["kind"] for s in state.seeds} == {"repair_attempt"} and hook.failed_calls == 2
    assert hook.seeded_tokens == state.seeded_tokens_by_kind["repair_attempt"] > 0


def test_a_failed_result_before_its_call_is_still_seeded(stub: StubServer) -> None:
    # OpenHands may run tools in a pool: a result can reach the callbacks before its call.
    hook = RepairSeeder(agentspec_llm(stub.url, "tiny", group_id="task-4"), "conv-4")
    bad, ok = action("c1", "cat missing.txt"), action("c2", "ls")
    for event in (result(bad, 1), result(ok, 0), bad, ok):
        hook(event)
    assert hook.failed_calls == 1
    assert [s["text"] for s in stub.sessions["conv-4"].seeds] == [tool_call_text(bad.tool_call)]


# ---------------------------------------------------------------------------- delivery


def test_undelivered_seeds_wait_for_the_next_delivery(stub: StubServer) -> None:
    llm = agentspec_llm(stub.url, "tiny")
    poster = SeedPoster(timeout_s=5)
    stub.fail_next(1, 503)
    assert poster.send(llm, "conv-3", [Seed.of("first")]) == 0
    assert poster.pending("conv-3") == 1 and "conv-3" not in stub.sessions and poster.failures == 1
    assert poster.send(llm, "conv-3", [Seed.of("second")]) > 0
    assert [s["text"] for s in stub.sessions["conv-3"].seeds] == ["first", "second"]
    assert poster.pending("conv-3") == 0


def test_pending_seeds_are_bounded(stub: StubServer) -> None:
    llm = agentspec_llm(stub.url, "tiny")
    poster = SeedPoster(timeout_s=5)
    stub.fail_next(1, 503)
    poster.send(llm, "conv-4", [Seed.of(f"s{i}") for i in range(MAX_PENDING_SEEDS + 10)])
    assert poster.pending("conv-4") == MAX_PENDING_SEEDS


def test_a_refused_seed_is_not_retried(stub: StubServer) -> None:
    llm = agentspec_llm(stub.url, "tiny")
    poster = SeedPoster(timeout_s=5)
    assert poster.send(llm, "bad id!", [Seed.of("x")]) == 0  # 400 from the server: retrying cannot help
    assert poster.pending("bad id!") == 0 and poster.failures == 0


def test_seeds_are_split_into_requests_the_server_takes() -> None:
    batches = split_seeds([Seed.of(f"seed {i}") for i in range(20)])
    assert [len(b) for b in batches] == [wire.MAX_SEEDS_PER_REQUEST, 4]
    long = split_seeds([Seed.of("x" * 250, kind="repair_attempt")], max_chars=100)
    assert [[len(s.text or "") for s in b] for b in long] == [[100], [100], [50]]
    assert all(s.kind == "repair_attempt" for b in long for s in b)
