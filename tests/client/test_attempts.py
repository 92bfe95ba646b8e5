"""The retry machine (agentspec.client.attempts) and the router, with no I/O at all: fake
backends that are never contacted, a fake clock, a seeded random generator."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.client import (
    Attempt,
    BackendRouter,
    BackendUnavailableError,
    CallAttempts,
    ClientConfig,
    NoHealthyBackendError,
    Probe,
    RetryPolicy,
    ServerRefusedError,
    SessionClosedError,
    StreamInterruptedError,
    Wait,
    classify_http_error,
    parse_retry_after,
    protocol,
)
from agentspec.client._core import ClientCore, SessionCore

A, B, C = "http://a:1", "http://b:2", "http://c:3"
NO_WAIT = RetryPolicy(max_attempts=3, backoff_initial_s=0.0, backoff_max_s=0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def attempt_of(machine: CallAttempts) -> Attempt:
    """The next action, which must be an attempt."""
    action = machine.next_action()
    assert isinstance(action, Attempt), action
    return action


def fail(machine: CallAttempts, attempt: Attempt, error: BaseException) -> BaseException | None:
    return machine.failed(attempt, error)


def unavailable(backend: str, status: int = 503, retry_after_s: float | None = None) -> BackendUnavailableError:
    return BackendUnavailableError(backend, f"{status}: boom", status_code=status, retry_after_s=retry_after_s)


def busy(backend: str, retry_after_s: float | None = None) -> ServerRefusedError:
    return ServerRefusedError(429, "slow down", backend=backend, retry_after_s=retry_after_s)


# -- transitions ---------------------------------------------------------------------------


def test_success_delivers_and_ends_the_call() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT)
    attempt = attempt_of(machine)
    assert attempt.number == 1 and attempt.previous_backend is None
    assert attempt.backend == router.pinned("g")
    with attempt:
        pass
    assert machine.done and machine.delivered is attempt
    with pytest.raises(RuntimeError, match="over"):
        machine.next_action()


def test_5xx_fails_over_marks_down_and_the_new_backend_gets_the_history() -> None:
    config = ClientConfig(backends=[A, B], retry=NO_WAIT, health_check_interval_s=None)
    core = ClientCore(config)
    session = SessionCore(core, "s-1", "g-1")
    # One recorded turn on the group's backend.
    machine = session.attempts()
    first = attempt_of(machine)
    _, body, n = session.prepare(first.backend, {"messages": [{"role": "user", "content": "turn one"}]}, None)
    assert "agentspec_seeds" not in body
    with first:
        session.delivered(first.backend, n)
    session.record_chat(
        body["messages"], {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}, first.backend, 1
    )

    machine = session.attempts()
    home = attempt_of(machine)
    assert home.backend == first.backend
    assert fail(machine, home, unavailable(home.backend)) is None
    state = core.router.states()[home.backend]
    assert state.up is False and state.last_error == "503: boom"
    moved = attempt_of(machine)
    assert moved.number == 2 and moved.backend != home.backend and moved.previous_backend == home.backend
    assert core.router.pinned("g-1") == moved.backend  # the whole group moved
    _, body, _ = session.prepare(moved.backend, {"messages": [{"role": "user", "content": "turn two"}]}, None)
    assert body["agentspec_seeds"] == [{"kind": "prior_turn", "scope": "session", "text": "turn one\nok"}]


def test_429_retries_the_same_backend_after_its_retry_after() -> None:
    router = BackendRouter([A, B])
    policy = RetryPolicy(max_attempts=3, backoff_initial_s=0.5, backoff_max_s=1.0)
    machine = router.attempts("g", policy, rng=random.Random(0))
    first = attempt_of(machine)
    assert fail(machine, first, busy(first.backend, retry_after_s=2.5)) is None
    assert machine.next_action() == Wait(2.5)  # the server's word, not the backoff
    second = attempt_of(machine)
    assert second.backend == first.backend
    assert router.healthy() == [A, B]  # busy is not down
    # Without Retry-After: the jittered backoff.
    assert fail(machine, second, busy(second.backend)) is None
    wait = machine.next_action()
    assert isinstance(wait, Wait) and 0 <= wait.seconds <= policy.delay(3)


def test_retry_after_is_capped() -> None:
    router = BackendRouter([A])
    policy = RetryPolicy(backoff_initial_s=0.0, backoff_max_s=0.0, retry_after_max_s=5.0)
    machine = router.attempts("g", policy)
    first = attempt_of(machine)
    assert fail(machine, first, busy(first.backend, retry_after_s=3600)) is None
    assert machine.next_action() == Wait(5.0)


def test_retry_after_of_a_503_counts_only_when_the_retry_goes_back_there() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT, probe=True)
    first = attempt_of(machine)
    assert fail(machine, first, unavailable(first.backend, retry_after_s=9.0)) is None
    assert attempt_of(machine).backend != first.backend  # elsewhere: no wait
    # With one backend the retry goes back to it, once a probe finds it up.
    solo = BackendRouter([A])
    machine = solo.attempts("g", NO_WAIT, probe=True)
    first = attempt_of(machine)
    assert fail(machine, first, unavailable(A, retry_after_s=9.0)) is None
    probe = machine.next_action()
    assert probe == Probe((A,))
    solo.mark_up(A)
    assert machine.next_action() == Wait(9.0)
    assert attempt_of(machine).backend == A


def test_429_not_retried_when_the_policy_says_so() -> None:
    router = BackendRouter([A])
    machine = router.attempts("g", RetryPolicy(retry_on_429=False))
    first = attempt_of(machine)
    error = busy(A)
    assert fail(machine, first, error) is error and machine.done


def test_refusal_is_raised_at_once_and_marks_nothing() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT)
    attempt = attempt_of(machine)
    refusal = ServerRefusedError(400, "bad seed", backend=attempt.backend)
    with pytest.raises(ServerRefusedError) as info, attempt:
        raise refusal
    assert info.value is refusal
    assert machine.done and len(machine.attempts) == 1
    assert router.healthy() == [A, B]


def test_attempts_run_out() -> None:
    router = BackendRouter([A, B, C])
    machine = router.attempts("g", RetryPolicy(max_attempts=2, backoff_initial_s=0.0, backoff_max_s=0.0))
    first = attempt_of(machine)
    assert fail(machine, first, unavailable(first.backend)) is None
    second = attempt_of(machine)
    last = unavailable(second.backend)
    assert fail(machine, second, last) is last
    assert machine.done and len(machine.attempts) == 2
    assert len(router.healthy()) == 1


def test_all_down_probes_once_then_no_healthy_backend() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT, probe=True)
    first = attempt_of(machine)
    assert fail(machine, first, unavailable(first.backend)) is None
    second = attempt_of(machine)
    assert fail(machine, second, unavailable(second.backend)) is None
    assert machine.next_action() == Probe((A, B))
    with pytest.raises(NoHealthyBackendError) as info:
        machine.next_action()
    assert isinstance(info.value.last_error, BackendUnavailableError)
    assert set(info.value.backends) == {A, B}
    # Without a prober: no probe asked for.
    with pytest.raises(NoHealthyBackendError):
        router.attempts("g", NO_WAIT).next_action()


def test_a_probe_that_finds_a_backend_lets_the_call_go_on() -> None:
    router = BackendRouter([A, B])
    for b in (A, B):
        router.mark_down(b, "down")
    machine = router.attempts("g", NO_WAIT, probe=True)
    assert machine.next_action() == Probe((A, B))
    router.mark_up(B)
    assert attempt_of(machine).backend == B


def test_closed_session_stops_before_any_attempt_and_between_attempts() -> None:
    router = BackendRouter([A, B])
    closed = {"now": False}

    def check_open() -> None:
        if closed["now"]:
            raise SessionClosedError("s")

    machine = router.attempts("g", NO_WAIT, check_open=check_open)
    first = attempt_of(machine)
    assert fail(machine, first, unavailable(first.backend)) is None
    closed["now"] = True
    with pytest.raises(SessionClosedError):
        machine.next_action()
    with pytest.raises(SessionClosedError):
        router.attempts("g", NO_WAIT, check_open=check_open).next_action()


def test_failure_after_output_is_an_interrupted_stream() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT, classify=classify_http_error)
    attempt = attempt_of(machine)
    attempt.output("echo:", 1)
    attempt.output(" one", 1)
    cause = httpx.RemoteProtocolError("peer closed connection")
    with pytest.raises(StreamInterruptedError) as info, attempt:
        raise cause
    assert info.value.received_text == "echo: one" and info.value.received_chunks == 2
    assert info.value.cause is cause and info.value.__cause__ is cause
    assert router.states()[attempt.backend].up is False


def test_transport_errors_become_backend_failures_with_one_reason_format() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT, classify=classify_http_error)
    attempt = attempt_of(machine)
    with attempt:
        raise httpx.ConnectError("connection refused")
    assert router.states()[attempt.backend].last_error == "ConnectError: connection refused"
    assert isinstance(machine.last_error, BackendUnavailableError)
    assert machine.last_error.reason == "ConnectError: connection refused"


def test_cancellation_is_not_a_failure() -> None:
    router = BackendRouter([A, B])
    machine = router.attempts("g", NO_WAIT)
    attempt = attempt_of(machine)
    with pytest.raises(KeyboardInterrupt), attempt:
        raise KeyboardInterrupt
    assert machine.done and router.healthy() == [A, B]


def test_outcome_must_be_reported_before_the_next_attempt() -> None:
    machine = BackendRouter([A]).attempts("g")
    attempt_of(machine)
    with pytest.raises(RuntimeError, match="has not reported"):
        machine.next_action()


def test_stats_prefer_the_sessions_backend_and_never_retry() -> None:
    router = BackendRouter([A, B])
    other = B if router.resolve("g") == A else A
    machine = router.attempts("g", RetryPolicy(max_attempts=1), prefer=other)
    attempt = attempt_of(machine)
    assert attempt.backend == other
    error = unavailable(other)
    assert fail(machine, attempt, error) is error


# -- backoff and Retry-After ----------------------------------------------------------------


def test_backoff_jitter_kinds() -> None:
    full = RetryPolicy(backoff_initial_s=0.1, backoff_max_s=1.0)
    assert full.backoff(1, lambda: 0.5) == 0.0
    assert full.backoff(2, lambda: 0.5) == pytest.approx(0.05)
    assert full.backoff(10, lambda: 0.999) <= 1.0
    none = RetryPolicy(backoff_initial_s=0.1, backoff_max_s=1.0, jitter="none")
    assert [none.backoff(n, lambda: 0.0) for n in (2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    deco = RetryPolicy(backoff_initial_s=0.1, backoff_max_s=1.0, jitter="decorrelated")
    assert deco.backoff(2, lambda: 0.0) == pytest.approx(0.1)
    assert deco.backoff(3, lambda: 1.0, previous=0.2) == pytest.approx(0.6)
    assert deco.backoff(4, lambda: 1.0, previous=0.6) == 1.0


def test_parse_retry_after() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    assert parse_retry_after({"Retry-After": "7"}, now) == 7.0
    assert parse_retry_after(httpx.Headers({"retry-after": "1.5"}), now) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "7"}, now) == 0.25
    date = format_datetime(datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now) == pytest.approx(30.0)
    assert parse_retry_after({"Retry-After": "not a date"}, now) is None
    assert parse_retry_after({}, now) is None
    assert parse_retry_after({"Retry-After": "nan"}, now) is None


def test_classify_reads_retry_after_from_the_response() -> None:
    request = httpx.Request("POST", A + "/v1/chat/completions")
    response = httpx.Response(429, headers={"Retry-After": "3"}, json={"error": {"message": "busy"}}, request=request)
    with pytest.raises(ServerRefusedError) as info:
        protocol.response_json(response, A)
    assert info.value.status_code == 429 and info.value.retry_after_s == 3.0
    response = httpx.Response(503, headers={"Retry-After": "4"}, text="overloaded", request=request)
    with pytest.raises(BackendUnavailableError) as unavailable_info:
        protocol.response_json(response, A)
    assert unavailable_info.value.retry_after_s == 4.0 and unavailable_info.value.reason == "503: overloaded"


# -- the router -----------------------------------------------------------------------------


def test_cooldown_makes_a_down_backend_a_candidate_again_and_success_marks_it_up() -> None:
    clock = Clock()
    router = BackendRouter([A, B], cooldown_s=30.0, clock=clock)
    router.mark_down(A, "ConnectError: refused")
    assert router.candidates() == [B]
    clock.now += 31
    assert router.candidates() == [A, B]
    assert router.states()[A].up is False
    router.record_success(A)
    assert router.states()[A].up is True
    # Every backend down and cooling: all are candidates rather than none.
    router.mark_down(A, "x")
    router.mark_down(B, "x")
    assert router.candidates() == [A, B]


def test_without_cooldown_only_mark_up_brings_a_backend_back() -> None:
    clock = Clock()
    router = BackendRouter([A, B], clock=clock)
    router.mark_down(A, "x")
    clock.now += 10_000
    router.record_success(A)
    assert router.candidates() == [B]
    router.record(A, True)
    assert router.candidates() == [A, B]


def test_router_normalises_and_checks_backends() -> None:
    router = BackendRouter(["http://a:1/v1/", "http://a:1", "http://b:2/"])
    assert router.backends == (A, B)
    assert router.canonical("http://a:1/v1") == A
    with pytest.raises(ValueError, match="unknown backend"):
        router.mark_down("http://z:9", "x")
    with pytest.raises(ValueError):
        BackendRouter([])


def test_keyless_calls_take_turns_and_groups_stick() -> None:
    router = BackendRouter([A, B, C])
    assert {router.resolve(None) for _ in range(3)} == {A, B, C}
    assert len({router.resolve("g") for _ in range(5)}) == 1


def test_sessions_count_towards_load_and_implicit_groups_are_bounded() -> None:
    router = BackendRouter([A, B], max_groups=2)
    router.open_session("g")
    home = router.resolve("g")
    assert router.loads() == {home: 1}
    router.close_session("g")
    assert router.loads() == {} and router.pinned("g") is None
    for key in ("k1", "k2", "k3"):
        router.resolve(key)
    assert router.pinned("k1") is None  # least recently used, forgotten
    assert router.pinned("k2") is not None and router.pinned("k3") is not None
    assert sum(router.loads().values()) == 2


def test_call_and_retry_helpers_drive_the_machine() -> None:
    router = BackendRouter([A, B])
    sent: list[str] = []
    slept: list[float] = []

    def send(backend: str) -> str:
        sent.append(backend)
        if len(sent) == 1:
            raise unavailable(backend)
        return f"ok from {backend}"

    policy = RetryPolicy(backoff_initial_s=0.2, backoff_max_s=0.2, jitter="none")
    assert router.call("g", send, policy, sleep=slept.append) == f"ok from {sent[1]}"
    assert sent[0] != sent[1] and slept == [0.2]
    # The tenacity-like loop: the block may run to its end instead of returning.
    for attempt in router.retry("g", policy, sleep=slept.append):
        with attempt:
            result = attempt.backend
    assert result == sent[1]


def test_the_router_understands_raise_for_status() -> None:
    router = BackendRouter([A, B])
    statuses = iter([503, 429, 404])

    def send(backend: str) -> None:
        request = httpx.Request("POST", backend + "/v1/completions")
        response = httpx.Response(next(statuses), headers={"Retry-After": "0"}, request=request)
        response.raise_for_status()

    policy = RetryPolicy(max_attempts=5, backoff_initial_s=0.0, backoff_max_s=0.0)
    with pytest.raises(httpx.HTTPStatusError) as info:
        router.call("g", send, policy)
    assert info.value.response.status_code == 404  # refused: raised at once, httpx's own error
    (down,) = router.down()
    assert router.states()[down].last_error == "503: Service Unavailable"


async def test_async_helpers_drive_the_same_machine() -> None:
    router = BackendRouter([A, B])
    slept: list[float] = []
    probed: list[tuple[str, ...]] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def probe(backends: tuple[str, ...]) -> None:
        probed.append(tuple(backends))
        router.mark_up(backends[0])

    async def send(backend: str) -> str:
        if not probed:
            raise unavailable(backend)
        return backend

    policy = RetryPolicy(max_attempts=5, backoff_initial_s=0.1, backoff_max_s=0.1, jitter="none")
    assert await router.acall("g", send, policy, sleep=sleep, probe=probe) == A
    assert probed == [(A, B)] and slept == [0.1, 0.1]


# -- properties -----------------------------------------------------------------------------

OUTCOMES = st.sampled_from(["ok", "5xx", "5xx-retry-after", "429", "429-retry-after", "400", "transport"])


@settings(max_examples=300, deadline=None)
@given(
    n_backends=st.integers(1, 4),
    max_attempts=st.integers(1, 6),
    initial=st.floats(0.0, 2.0),
    extra=st.floats(0.0, 5.0),
    jitter=st.sampled_from(["full", "decorrelated", "none"]),
    retry_after_max=st.floats(0.0, 30.0),
    retry_after=st.floats(-10.0, 1e6),
    outcomes=st.lists(OUTCOMES, max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
def test_machine_properties(
    n_backends: int,
    max_attempts: int,
    initial: float,
    extra: float,
    jitter: str,
    retry_after_max: float,
    retry_after: float,
    outcomes: list[str],
    seed: int,
) -> None:
    backends = [f"http://h{i}:8000" for i in range(n_backends)]
    router = BackendRouter(backends)
    policy = RetryPolicy(
        max_attempts=max_attempts,
        backoff_initial_s=initial,
        backoff_max_s=initial + extra,
        jitter=jitter,  # type: ignore[arg-type]
        retry_after_max_s=retry_after_max,
    )
    cap = max(policy.backoff_max_s, policy.retry_after_max_s)
    machine = router.attempts("group", policy, probe=True, classify=classify_http_error, rng=random.Random(seed))
    errors: dict[str, Callable[[str], BaseException]] = {
        "5xx": lambda b: unavailable(b),
        "5xx-retry-after": lambda b: unavailable(b, retry_after_s=retry_after),
        "429": lambda b: busy(b),
        "429-retry-after": lambda b: busy(b, retry_after_s=retry_after),
        "400": lambda b: ServerRefusedError(400, "bad", backend=b),
        "transport": lambda b: httpx.ReadTimeout("timed out"),
    }
    script = iter(outcomes)
    must_avoid: str | None = None
    while not machine.done:
        try:
            action = machine.next_action()
        except NoHealthyBackendError:
            assert not router.healthy()
            break
        if isinstance(action, Wait):
            assert 0 < action.seconds <= cap
            continue
        if isinstance(action, Probe):
            assert set(action.backends) == set(router.down())
            continue
        if must_avoid is not None:
            assert action.backend != must_avoid
        outcome = next(script, "ok")
        if outcome == "ok":
            with action:
                pass
            break
        error = errors[outcome](action.backend)
        before = router.healthy()
        stop = machine.failed(action, error)
        if outcome.startswith(("5xx", "transport")):
            assert action.backend not in router.healthy()
            others = [b for b in before if b != action.backend]
            must_avoid = action.backend if others else None
        else:
            assert router.healthy() == before
            must_avoid = None
        if outcome == "400":
            assert stop is error
        if stop is not None:
            break
    assert len(machine.attempts) <= max_attempts
    assert all(0 <= d <= cap for d in machine.delays)
