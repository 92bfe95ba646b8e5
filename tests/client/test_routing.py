"""Rendezvous hashing with bounded load: pure functions, property-tested."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentspec.client.routing import (
    PinTable,
    load_cap,
    pick_backend,
    rendezvous_order,
    rendezvous_score,
)

backend_names = st.lists(
    st.from_regex(r"http://h[0-9]{1,3}:[0-9]{4}", fullmatch=True), min_size=1, max_size=8, unique=True
)
keys = st.text(min_size=1, max_size=40)
factors = st.sampled_from([1.0, 1.1, 1.25, 1.5, 2.0])


def test_score_is_stable_across_processes() -> None:
    # Python's hash() is salted per process; blake2b is not. Another interpreter with a
    # different hash seed must agree, or two client processes would pin differently.
    code = "from agentspec.client.routing import rendezvous_score;print(rendezvous_score('group-1', 'http://a:8000'))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == rendezvous_score("group-1", "http://a:8000")
    # Pinned value: changing the hash silently re-pins every deployed group.
    assert rendezvous_score("group-1", "http://a:8000") == int.from_bytes(
        __import__("hashlib").blake2b(b"group-1\x00http://a:8000", digest_size=8).digest(), "big"
    )


@settings(deadline=None)  # a loaded machine must not fail a correctness test
@given(keys, backend_names, st.randoms())
def test_order_does_not_depend_on_input_order(key: str, backends: list[str], rnd) -> None:
    shuffled = list(backends)
    rnd.shuffle(shuffled)
    assert rendezvous_order(key, backends) == rendezvous_order(key, shuffled)
    assert sorted(rendezvous_order(key, backends)) == sorted(backends)


@settings(deadline=None)  # a loaded machine must not fail a correctness test
@given(keys, backend_names, factors)
def test_idle_group_takes_its_first_choice(key: str, backends: list[str], factor: float) -> None:
    assert pick_backend(key, backends, {}, factor) == rendezvous_order(key, backends)[0]


@settings(deadline=None)  # a loaded machine must not fail a correctness test
@given(keys, backend_names, st.data())
def test_removing_a_backend_moves_only_its_keys(key: str, backends: list[str], data) -> None:
    if len(backends) < 2:
        return
    gone = data.draw(st.sampled_from(backends))
    before = pick_backend(key, backends, {}, 1.0)
    after = pick_backend(key, [b for b in backends if b != gone], {}, 1.0)
    if before != gone:
        assert after == before


@given(
    backend_names,
    st.lists(keys, min_size=1, max_size=200),
    factors,
)
@settings(max_examples=60, deadline=None)
def test_bounded_load(backends: list[str], group_keys: list[str], factor: float) -> None:
    loads: dict[str, int] = {}
    for i, key in enumerate(group_keys):
        choice = pick_backend(key, backends, loads, factor)
        assert choice in backends
        cap = load_cap(i, len(backends), factor)
        assert loads.get(choice, 0) < cap
        loads[choice] = loads.get(choice, 0) + 1
        # No backend ever exceeds the cap of the moment.
        assert max(loads.values()) <= load_cap(i, len(backends), factor)


@settings(deadline=None)  # a loaded machine must not fail a correctness test
@given(
    backend_names,
    st.dictionaries(st.integers(0, 7), st.integers(0, 50)),
    keys,
    factors,
)
def test_pick_always_finds_a_backend_under_the_cap(backends, raw_loads, key, factor) -> None:
    loads = {backends[i % len(backends)]: n for i, n in raw_loads.items()}
    choice = pick_backend(key, backends, loads, factor)
    total = sum(loads.get(b, 0) for b in backends)
    assert loads.get(choice, 0) < load_cap(total, len(backends), factor)


def test_load_cap_is_exact() -> None:
    # 1.1 * 10 is 11.000000000000002 in floats; the cap must still be 11.
    assert load_cap(9, 1, 1.1) == 11
    assert load_cap(0, 4, 1.25) == 1
    assert load_cap(7, 2, 1.25) == 5
    with pytest.raises(ValueError):
        load_cap(1, 0, 1.25)
    with pytest.raises(ValueError):
        load_cap(1, 2, 0.5)


def test_pin_table_keeps_groups_and_moves_them_on_failure() -> None:
    table = PinTable(load_factor=1.25)
    backends = ["http://a", "http://b", "http://c"]
    table.register("g")
    table.register("g")
    first = table.resolve("g", backends)
    assert table.resolve("g", backends) == first
    assert table.loads() == {first: 2}
    survivors = [b for b in backends if b != first]
    moved = table.resolve("g", survivors)
    assert moved in survivors
    assert table.loads() == {moved: 2}  # the whole group moved
    # The old backend coming back does not pull the pinned group back.
    assert table.resolve("g", backends) == moved
    table.unregister("g")
    table.unregister("g")
    assert table.backend_of("g") is None
    assert table.loads() == {}


def test_pin_table_spreads_new_groups_with_bounded_load() -> None:
    table = PinTable(load_factor=1.0)
    backends = [f"http://b{i}" for i in range(4)]
    for i in range(400):
        table.register(f"g{i}")
        table.resolve(f"g{i}", backends)
    loads = table.loads()
    assert sum(loads.values()) == 400
    assert max(loads.values()) <= 100  # factor 1.0: perfectly even


@given(
    st.lists(
        st.tuples(st.sampled_from(["open", "close", "call", "down", "up"]), st.integers(0, 5)),
        max_size=120,
    )
)
@settings(max_examples=80, deadline=None)
def test_pin_table_loads_match_open_sessions(ops) -> None:
    # Whatever the sequence of opens, closes, calls and backend failures, the load table
    # counts exactly the open sessions of pinned groups, each on a healthy-at-pin backend.
    backends = ["http://a", "http://b", "http://c"]
    healthy = set(backends)
    table = PinTable(load_factor=1.25)
    open_sessions: dict[str, int] = {}
    for op, i in ops:
        group = f"g{i}"
        if op == "open":
            table.register(group)
            open_sessions[group] = open_sessions.get(group, 0) + 1
        elif op == "close" and open_sessions.get(group):
            table.unregister(group)
            open_sessions[group] -= 1
        elif op == "call" and open_sessions.get(group) and healthy:
            assert table.resolve(group, sorted(healthy)) in healthy
        elif op == "down" and len(healthy) > 1:
            healthy.discard(backends[i % 3])
        elif op == "up":
            healthy.add(backends[i % 3])
    expected: dict[str, int] = {}
    for group, n in open_sessions.items():
        backend = table.backend_of(group)
        if n and backend is not None:
            expected[backend] = expected.get(backend, 0) + n
        if not n:
            assert backend is None
    assert table.loads() == expected
