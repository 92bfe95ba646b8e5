"""Steps vLLM runs without calling the drafter still reach the session index.

When any request of a batch is within ``num_speculative_tokens`` of the context limit,
vLLM's runner skips the drafter for the whole step (``_input_fits_in_drafter``): the
proposer does not see that step's tokens. It catches up on them the next time it sees the
request, or when the request finishes, so that a session's index holds every token its
calls produced.

In-process first (a stand-in for vLLM's config, input batch and runner), then one real
server with a request that runs up to ``max_model_len``.
"""

from __future__ import annotations

import threading
import uuid
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from engine_helpers import completion_ok, server_stats, session_stats, vllm_config_stand_in, wait_for

from agentspec.engine.settings import DrafterSettings, EngineSettings
from agentspec.engine.tenancy import SHARED_TENANT

proposer_mod = pytest.importorskip("agentspec.engine.vllm.proposers", reason="needs vLLM")

K = 8
PROMPT = list(range(100, 120))
PARAMS = SimpleNamespace(extra_args={"session_id": "s"}, max_tokens=64, eos_token_id=None, stop_token_ids=None)


class Row:
    """One request's row of vLLM's input batch, as the runner fills it."""

    def __init__(self, req_id: str, prompt: list[int]) -> None:
        self.req_id, self.prompt, self.output = req_id, prompt, []

    def emit(self, *tokens: int) -> list[int]:
        self.output += tokens
        return list(tokens)

    def batch(self) -> SimpleNamespace:
        tokens = self.prompt + self.output
        table = np.zeros((1, 256), dtype=np.int32)
        table[0, : len(tokens)] = tokens
        return SimpleNamespace(
            req_ids=[self.req_id],
            num_tokens_no_spec=np.array([len(tokens)]),
            num_prompt_tokens=np.array([len(self.prompt)]),
            token_ids_cpu=table,
        )


def _step(proposer: Any, row: Row, *sampled: int) -> list[list[int]]:
    """A step the suffix proposer is called on: after the runner's bookkeeping, so the row
    holds the step's tokens."""
    tokens = row.emit(*sampled)
    return proposer.propose(K, row.batch(), [tokens])


def _suffix_proposer() -> Any:
    return proposer_mod.AgentspecProposer(vllm_config_stand_in(K), EngineSettings())  # type: ignore[arg-type]


def _indexed(proposer: Any) -> int:
    return proposer.index.session_stats("s", SHARED_TENANT).indexed_tokens


def test_the_suffix_proposer_catches_up_on_a_skipped_step() -> None:
    proposer = _suffix_proposer()
    row = Row("a", PROMPT)
    proposer.on_request_added("a", PARAMS)
    _step(proposer, row, 7)
    assert _indexed(proposer) == len(PROMPT) + 1
    row.emit(8, 9)  # a step the drafter was skipped on
    _step(proposer, row, 10)
    assert _indexed(proposer) == len(PROMPT) + 4
    assert proposer.driver.counters["drafter_missed_steps_total"] == 1
    # The index holds the whole text: after 7 it drafts 8, which only the skipped step
    # showed (without it, 10 followed 7).
    _step(proposer, row, 11)
    assert _step(proposer, row, 7)[0][:1] == [8]
    assert _indexed(proposer) == len(PROMPT) + 6
    assert proposer.driver.counters["drafter_missed_steps_total"] == 1


def test_a_draft_sent_before_a_skipped_step_is_not_credited() -> None:
    # The step that verified it was not seen: its outcome is unknown, so it is taken back.
    proposer = _suffix_proposer()
    row = Row("a", [5, 6, 7, 5, 6, 7, 5, 6])
    proposer.on_request_added("a", PARAMS)
    drafts = _step(proposer, row, 7)
    assert drafts[0], "the repeated prompt gives a draft"
    row.emit(5, 6, 7)  # the skipped step: the draft was verified there
    _step(proposer, row, 5)
    assert sum(proposer.driver.distributions["accepted_tokens_per_draft"].values()) == 0


def test_a_request_finishing_in_skipped_steps_is_indexed_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # Near max_model_len every step is skipped until the request ends: the runner's own
    # record of the request (still there when it learns of the finish) has the tokens.
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    from agentspec.engine.vllm import fixes as vllm_fixes
    from agentspec.engine.vllm import runner as runner_patch

    monkeypatch.setattr(vllm_fixes, "apply", lambda: None)
    module = ModuleType(runner_patch.RUNNER_MODULE)  # a stand-in under the runner's name

    class GPUModelRunner:
        def __init__(self, drafter: Any) -> None:
            self.vllm_config = vllm_config_stand_in(K)
            self.vllm_config.scheduler_config = SimpleNamespace(async_scheduling=False)
            self.drafter = drafter
            self.requests: dict[str, Any] = {}

        def _update_states(self, scheduler_output: Any) -> None:
            for req_id in scheduler_output.finished_req_ids:
                self.requests.pop(req_id, None)

        def propose_draft_token_ids(self, scheduler_output: Any, sampled_token_ids: Any) -> None: ...

    module.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    module.SuffixDecodingProposer = SuffixDecodingProposer  # type: ignore[attr-defined]
    module.DraftModelProposer = DraftModelProposer  # type: ignore[attr-defined]
    module.EagleProposer = EagleProposer  # type: ignore[attr-defined]
    runner_patch.patch_runner(module)

    proposer = _suffix_proposer()
    row = Row("a", PROMPT)
    runner = GPUModelRunner(proposer)
    runner.requests["a"] = SimpleNamespace(num_prompt_tokens=len(PROMPT), output_token_ids=row.output)
    new = SimpleNamespace(req_id="a", sampling_params=PARAMS)
    runner._update_states(SimpleNamespace(finished_req_ids=set(), scheduled_new_reqs=[new]))
    _step(proposer, row, 7)
    row.emit(8, 9)
    row.emit(10)  # two skipped steps, the last one the request's
    runner._update_states(SimpleNamespace(finished_req_ids={"a"}, scheduled_new_reqs=[]))
    assert _indexed(proposer) == len(PROMPT) + 4
    assert not proposer.index.has_call("a")


def test_the_hybrid_still_catches_up() -> None:
    # The hybrid's catch-up is the same code; its step's tokens are not in the row yet.
    from agentspec.engine.vllm.proposers import HybridProposer

    settings = EngineSettings(drafter=DrafterSettings(model="org/drafter", num_tokens=2))
    proposer = HybridProposer.__new__(HybridProposer)
    proposer._init_hybrid(vllm_config_stand_in(K), settings)  # type: ignore[arg-type]
    row = Row("a", PROMPT)
    proposer.on_request_added("a", PARAMS)

    def step(*sampled: int) -> None:
        batch = row.batch()
        num_tokens = int(batch.num_tokens_no_spec[0]) + len(sampled)
        proposer._index_draft(batch, 0, "a", list(sampled), num_tokens, K)
        row.emit(*sampled)

    step(7)
    row.emit(8, 9)
    step(10)
    assert _indexed(proposer) == len(PROMPT) + 4
    assert proposer.driver.counters["drafter_missed_steps_total"] == 1


def test_the_vllm_surface_the_catch_up_reads() -> None:
    # Which steps vLLM skips, and the runner's record the finish catch-up reads.
    import dataclasses
    import inspect

    from vllm.v1.worker.gpu_input_batch import CachedRequestState
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    sample = inspect.getsource(inspect.unwrap(GPUModelRunner.sample_tokens))
    assert "input_fits_in_drafter = self._input_fits_in_drafter(" in sample
    assert "if input_fits_in_drafter:\n                propose_draft_token_ids(valid_sampled_token_ids)" in sample
    assert "output_token_ids" in {f.name for f in dataclasses.fields(CachedRequestState)}
    assert "self.num_prompt_tokens = " in inspect.getsource(CachedRequestState.__post_init__)
    # The finished requests' records are dropped by _update_states itself (after the hook).
    update = inspect.getsource(inspect.unwrap(GPUModelRunner._update_states))
    assert (
        "for req_id in scheduler_output.finished_req_ids:\n            req_state = self.requests.pop(req_id, None)"
        in update
    )


# ---------------------------------------------------------------------- a real server


MAX_MODEL_LEN = 2048  # agentspec.testing.server.TEST_SERVER_ARGS


@pytest.mark.server
def test_a_request_near_max_model_len_leaves_the_index_complete(agentspec_server) -> None:
    """A request that runs to ``max_model_len`` (its last steps all skipped by vLLM) beside
    a short one (skipped on the same steps, then drafted again): both sessions' indexes
    hold every prompt and output token."""
    base = agentspec_server.url
    missed_before = server_stats(base)["engine"].get("drafter_missed_steps_total", 0)
    long_sid, short_sid = f"near-limit-{uuid.uuid4().hex[:8]}", f"beside-{uuid.uuid4().hex[:8]}"
    long_prompt = [3 + (i * 7919) % 4000 for i in range(MAX_MODEL_LEN - 64)]
    short_prompt = [3 + (i * 104729) % 4000 for i in range(40)]
    results: dict[str, dict[str, Any]] = {}

    def run(sid: str, prompt: list[int], max_tokens: int) -> None:
        results[sid] = completion_ok(
            base, prompt, max_tokens=max_tokens, ignore_eos=True, vllm_xargs={"session_id": sid}
        )

    short = threading.Thread(target=run, args=(short_sid, short_prompt, 600))
    short.start()
    run(long_sid, long_prompt, 64)
    short.join(timeout=300)
    assert not short.is_alive()
    assert (
        results[long_sid]["usage"]["prompt_tokens"] + results[long_sid]["usage"]["completion_tokens"] == MAX_MODEL_LEN
    )
    for sid, prompt in ((long_sid, long_prompt), (short_sid, short_prompt)):
        expected = len(prompt) + results[sid]["usage"]["completion_tokens"]
        stats = wait_for(
            lambda sid=sid: session_stats(base, sid),
            lambda s, expected=expected: s is not None and s["indexed_tokens"] == expected,
            timeout=30,
        )
        assert stats["calls"] == 1
    missed = server_stats(base)["engine"].get("drafter_missed_steps_total", 0)
    assert missed > missed_before, "vLLM skipped no drafting step: the test did not reach the limit"
    assert httpx.get(base + "/health").status_code == 200
