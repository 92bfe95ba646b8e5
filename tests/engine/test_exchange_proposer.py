"""Two proposers in one process share outputs through an exchange folder.

As in test_publish.py: the proposers get a stand-in for vLLM's config and a clock the
test advances; the input batch is a stand-in holding what ``propose`` reads.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from engine_helpers import vllm_config_stand_in

from agentspec.engine.settings import EngineSettings

proposer_mod = pytest.importorskip("agentspec.engine.vllm.proposers", reason="needs vLLM")
from agentspec.engine.worker import drafting  # noqa: E402

K = 8  # num_speculative_tokens
OUTPUT = list(range(1000, 1024))  # what replica A generates


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(drafting, "time", clock)
    return clock


def _proposer(exchange_dir: Path, worker_name: str, *, alone_in_group: bool = True, share: bool = False):
    config = vllm_config_stand_in(K)
    settings = EngineSettings(exchange_dir=str(exchange_dir), exchange_interval_s=0.5, share_across_tenants=share)
    proposer = proposer_mod.AgentspecProposer(config, settings)  # type: ignore[arg-type]
    proposer.bind(publish=False, worker_name=worker_name, alone_in_group=alone_in_group)
    return proposer


def _params(session_id: str, max_tokens: int, tenant: str | None = None) -> SimpleNamespace:
    extra = {"session_id": session_id} | ({"agentspec_tenant": tenant} if tenant is not None else {})
    return SimpleNamespace(extra_args=extra, max_tokens=max_tokens, eos_token_id=None, stop_token_ids=None)


def _step(proposer, req_id: str, prompt: list[int], generated: list[int]) -> list[int]:
    """One draft step of a request first seen with ``generated`` already sampled."""
    row = np.zeros(4096, dtype=np.int32)
    tokens = prompt + generated
    row[: len(tokens)] = tokens
    batch = SimpleNamespace(
        req_ids=[req_id],
        num_tokens_no_spec=np.array([len(tokens)]),
        num_prompt_tokens=np.array([len(prompt)]),
        token_ids_cpu=row[None, :],
    )
    return proposer.propose(K, batch, [generated[-1:]])[0]


def _finish_a_call(a) -> None:
    a.on_request_added("a-1", _params("sa", max_tokens=len(OUTPUT)))
    _step(a, "a-1", list(range(1, 20)), OUTPUT)
    a.on_requests_finished(["a-1"])


def test_outputs_cross_to_the_other_replica(tmp_path: Path, clock: _Clock) -> None:
    a, b = _proposer(tmp_path, "proposer-dp0"), _proposer(tmp_path, "proposer-dp1")
    b.on_step_end(idle=True)  # polls at t=0: nothing yet
    assert b.driver.counters.get("exchange_received_total", 0) == 0

    _finish_a_call(a)
    assert a.driver.counters["exchange_published_total"] == 1
    before = b.index.stats().global_tokens
    clock.now = 0.3
    b.on_step_end(idle=True)  # within the interval: no poll
    assert b.index.stats().global_tokens == before
    clock.now = 0.6
    b.on_step_end(idle=True)
    assert b.index.stats().global_tokens == before + len(OUTPUT)
    assert b.driver.counters["exchange_received_total"] == 1
    assert b.driver.counters["exchange_received_tokens_total"] == len(OUTPUT)
    assert b.snapshot()["engine"]["exchange_received_tokens_total"] == len(OUTPUT)

    # A call on B whose context ends with the start of A's output drafts its continuation
    # from the global corpus, which only A's output can have put there.
    b.on_request_added("b-1", _params("sb", max_tokens=64))
    draft = _step(b, "b-1", list(range(500, 510)) + OUTPUT[:8], OUTPUT[8:9])
    assert draft and draft == OUTPUT[9 : 9 + len(draft)]
    assert b.index.stats().drafts_by_level["global"] == 1
    # Nothing comes back to A but B's own outputs, once B finishes.
    clock.now = 1.2
    a.on_step_end(idle=True)
    assert a.driver.counters.get("exchange_received_total", 0) == 0


class _TickingClock(_Clock):
    """A clock that moves on by ``tick`` each time it is read: indexing takes time."""

    def __init__(self, tick: float) -> None:
        super().__init__()
        self.tick = tick

    def monotonic(self) -> float:
        self.now += self.tick
        return self.now


def test_a_catch_up_is_spread_over_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs that arrive together are indexed a step budget at a time (one at least per
    step), not all in one step that would stall the batch."""
    clock = _TickingClock(tick=0.004)
    monkeypatch.setattr(drafting, "time", clock)
    a, b = _proposer(tmp_path, "proposer-dp0"), _proposer(tmp_path, "proposer-dp1")
    assert b.settings.exchange_step_budget_s == 0.01
    for k in range(6):
        a.on_request_added(f"a-{k}", _params(f"sa{k}", max_tokens=len(OUTPUT)))
        _step(a, f"a-{k}", list(range(1, 20)), [t + 100 * k for t in OUTPUT])
        a.on_requests_finished([f"a-{k}"])
    clock.now = 10.0
    taken = []
    for _ in range(6):
        before = b.driver.counters.get("exchange_received_total", 0)
        b.on_step_end(idle=False)
        taken.append(b.driver.counters.get("exchange_received_total", 0) - before)
        if sum(taken) == 6:
            break
    # 4 ms per output against a 10 ms budget: 3 per step (the third reaches it), none lost.
    assert taken == [3, 3], taken
    assert b.index.stats().global_tokens == 6 * len(OUTPUT)
    assert b.snapshot()["engine"]["exchange_received_total"] == 6


def test_off_unless_alone_in_its_parallel_groups(
    tmp_path: Path, clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="vllm.agentspec.proposer"):
        a = _proposer(tmp_path, "proposer-dp0", alone_in_group=False)
    assert "corpus exchange is off" in caplog.text
    _finish_a_call(a)
    assert "exchange_published_total" not in a.driver.counters
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("share", [False, True], ids=["isolated", "shared"])
def test_outputs_cross_within_their_tenant_only(tmp_path: Path, clock: _Clock, share: bool) -> None:
    a, b = _proposer(tmp_path, "proposer-dp0", share=share), _proposer(tmp_path, "proposer-dp1", share=share)
    a.on_request_added("a-1", _params("sa", max_tokens=len(OUTPUT), tenant="k-tenant-a"))
    _step(a, "a-1", list(range(1, 20)), OUTPUT)
    a.on_requests_finished(["a-1"])
    # Isolated: one file per tenant; sharing: everything is the one shared tenant's.
    (written,) = [p.name for p in tmp_path.iterdir()]
    assert written.endswith(".tok") and ("~" not in written if share else written.endswith("~k-tenant-a.tok"))
    clock.now = 0.6
    b.on_step_end(idle=True)
    assert b.driver.counters["exchange_received_tokens_total"] == len(OUTPUT)

    def drafts_from_a(req: str, tenant: str) -> bool:
        b.on_request_added(req, _params(f"s-{req}", max_tokens=64, tenant=tenant))
        draft = _step(b, req, list(range(500, 510)) + OUTPUT[:8], OUTPUT[8:9])
        b.on_requests_finished([req])
        return bool(draft) and draft == OUTPUT[9 : 9 + len(draft)]

    assert drafts_from_a("b-a", "k-tenant-a")  # A's own text, on the other replica
    assert drafts_from_a("b-b", "k-tenant-b") is share  # B gets it only when the operator shares


@pytest.mark.parametrize("keep", [False, True], ids=["retired", "kept"])
def test_outputs_of_a_retired_policy_do_not_cross(tmp_path: Path, clock: _Clock, keep: bool) -> None:
    """A replica that has retired policy 1 drops what a peer generated under it (the peer
    had not heard of the update yet), unless the update kept old outputs."""
    a, b = _proposer(tmp_path, "proposer-dp0"), _proposer(tmp_path, "proposer-dp1")
    a.driver.set_policy_version(1)
    b.driver.set_policy_version(1)
    b.driver.set_policy_version(2, keep_old_outputs=keep)
    _finish_a_call(a)  # generated under version 1
    clock.now = 0.6
    b.on_step_end(idle=True)
    received = b.driver.counters.get("exchange_received_tokens_total", 0)
    assert received == (len(OUTPUT) if keep else 0)
    assert b.driver.counters.get("exchange_retired_total", 0) == (0 if keep else 1)
    # What the peer generates under the live version crosses as before.
    a.driver.set_policy_version(2)
    a.on_request_added("a-2", _params("sa2", max_tokens=len(OUTPUT)))
    _step(a, "a-2", list(range(1, 20)), OUTPUT)
    a.on_requests_finished(["a-2"])
    clock.now = 1.2
    b.on_step_end(idle=True)
    assert b.driver.counters["exchange_received_tokens_total"] == received + len(OUTPUT)


def test_redis_exchange_without_redis_py_runs_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain vLLM start may set exchange_url where redis-py is missing (agentspec serve
    # refuses that up front): the engine serves without the exchange and says why.
    monkeypatch.setitem(sys.modules, "redis", None)
    settings = EngineSettings(exchange_url="redis://127.0.0.1:1/0")
    proposer = proposer_mod.AgentspecProposer(vllm_config_stand_in(K), settings)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="vllm.agentspec.proposer"):
        proposer.bind(publish=False, worker_name="proposer-dp0", alone_in_group=True)
    assert "corpus exchange through redis://127.0.0.1:1/0 is off" in caplog.text and "redis" in caplog.text
    _finish_a_call(proposer)
    assert "exchange_published_total" not in proposer.driver.counters


def test_replicas_of_another_tokenizer_do_not_exchange(
    tmp_path: Path, clock: _Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same served name and vocabulary size; the tokenizers' digests differ.
    fingerprints = iter(["m:512:aaaaaaaaaaaaaaaa", "m:512:bbbbbbbbbbbbbbbb"])
    monkeypatch.setattr(drafting, "model_fingerprint", lambda _config: next(fingerprints))
    a, b = _proposer(tmp_path, "proposer-dp0"), _proposer(tmp_path, "proposer-dp1")
    assert a.model_fingerprint != b.model_fingerprint
    _finish_a_call(a)
    clock.now = 0.6
    b.on_step_end(idle=True)
    assert b.driver.counters.get("exchange_received_total", 0) == 0
    assert b.snapshot()["engine"]["exchange_skipped_foreign_total"] == 1


def test_the_fingerprint_digests_the_tokenizer_as_loaded(tmp_path: Path, tiny_model_dir: Path) -> None:
    def config(folder: Path) -> SimpleNamespace:
        return SimpleNamespace(
            served_model_name="m", get_vocab_size=lambda: 4096, skip_tokenizer_init=False, hf_config=None,
            tokenizer=str(folder), runner_type="generate", tokenizer_mode="auto", tokenizer_revision=None,
            trust_remote_code=False,
        )  # fmt: skip

    def copy(name: str, edit=None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        for file in ("tokenizer.json", "tokenizer_config.json"):
            data = json.loads((tiny_model_dir / file).read_text())
            (folder / file).write_text(json.dumps(edit(file, data) if edit else data, indent=1))
        return folder

    def other_template(file: str, data: dict) -> dict:
        return {**data, "chat_template": "{{ messages }}"} if file == "tokenizer_config.json" else data

    def one_more_token(file: str, data: dict) -> dict:
        if file == "tokenizer.json":
            extra = {**data["added_tokens"][-1], "id": 4096, "content": "<|extra|>"}
            data = {**data, "added_tokens": [*data["added_tokens"], extra]}
        return data

    ours = drafting.model_fingerprint(config(tiny_model_dir))
    assert ours.startswith("m:4096:") and len(ours.rsplit(":", 1)[1]) == 16
    # Another copy, written differently and with another chat template: the same ids.
    assert drafting.model_fingerprint(config(copy("same", other_template))) == ours
    assert drafting.model_fingerprint(config(copy("other", one_more_token))) != ours


def test_closing_the_exchange_stops_it(tmp_path: Path, clock: _Clock) -> None:
    a = _proposer(tmp_path, "proposer-dp0")
    exchange = a._exchange
    a.close_exchange()
    a.close_exchange()  # again: nothing left to close
    assert a._exchange is None and exchange is not None
    _finish_a_call(a)  # drafts on, publishes nothing
    assert "exchange_published_total" not in a.driver.counters


def _dense_dp_engine(exchange_dir: Path, index: int):
    """An engine of a dense model served with data parallelism, as vLLM configures it: its
    ``data_parallel_rank`` reset to 0, the deployment's rank in ``data_parallel_index``."""
    from agentspec.engine.vllm.runner import worker_name as _worker_name

    config = vllm_config_stand_in(K)
    config.parallel_config = SimpleNamespace(data_parallel_rank=0, data_parallel_index=index)
    # One replica id for the whole server, as `agentspec serve` gives its engines.
    settings = EngineSettings(exchange_dir=str(exchange_dir), exchange_interval_s=0.5, replica_id="host-8000")
    proposer = proposer_mod.AgentspecProposer(config, settings)  # type: ignore[arg-type]
    proposer.bind(publish=False, worker_name=_worker_name(SimpleNamespace(vllm_config=config)), alone_in_group=True)
    return proposer


def test_data_parallel_engines_of_a_dense_model_stay_apart(tmp_path: Path, clock: _Clock) -> None:
    a, b = _dense_dp_engine(tmp_path, 0), _dense_dp_engine(tmp_path, 1)
    assert (a.engine_index, b.engine_index) == ("0", "1")
    _finish_a_call(a)
    b_output = list(range(2000, 2024))
    b.on_request_added("b-1", _params("sb", max_tokens=len(b_output)))
    _step(b, "b-1", list(range(1, 20)), b_output)
    b.on_requests_finished(["b-1"])
    # One exchange file per engine: sharing one, each would skip the other's outputs as its own.
    assert sorted(p.name.split(".")[0] for p in tmp_path.iterdir()) == ["host-8000-dp0", "host-8000-dp1"]
    clock.now = 0.6
    a.on_step_end(idle=True)
    b.on_step_end(idle=True)
    assert a.driver.counters["exchange_received_total"] == 1
    assert b.driver.counters["exchange_received_total"] == 1
