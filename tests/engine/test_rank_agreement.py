"""Ranks that must draft alike do: tensor parallelism, and MoE data parallelism refused.

vLLM builds a drafter on every tensor-parallel rank and uses rank 0's drafts. With the
hybrid every rank also runs the draft model's forward passes, which hold collectives: each
step, every rank must run as many of them, or the group hangs. Each rank decides alone,
so nothing rank-local, such as its clock, may steer that decision. Here two in-process
hybrids, bound as two ranks of one group, are fed the same steps on clocks far apart.

The draft model's forward (``SpecDecodeBaseProposer.propose``) is stubbed, because the
tensor-parallel drafter needs GPUs: the stub drafts the target's own continuation and
records the draft tokens each call asks for, the autoregressive passes it would run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest
from engine_helpers import vllm_config_stand_in

from agentspec.engine.settings import DrafterSettings, EngineSettings

hybrid_mod = pytest.importorskip("agentspec.engine.vllm.proposers", reason="needs vLLM")
import torch  # noqa: E402 - vLLM's dependency

from agentspec.draft_budget.cost_budget import CostBudget  # noqa: E402
from agentspec.draft_budget.speed_budget import SpeedBudget  # noqa: E402
from agentspec.draft_budget.step_cost import StepCostProfile  # noqa: E402
from agentspec.engine.vllm import plugin  # noqa: E402
from agentspec.engine.vllm import runner as runner_patch  # noqa: E402
from agentspec.engine.worker import drafting, hybrid_drafting  # noqa: E402

K = 8
SETTINGS = EngineSettings(speed_model="h100:8b", drafter=DrafterSettings(model="org/drafter", num_tokens=4))
#: Seconds each reading of a rank's clock adds: rank 0 fast, rank 1 a drafter far too slow to pay.
TICKS = (1e-7, 5.0)
STEPS = 24


class Request:
    """One request as the target runs it: its prompt and the output it will produce."""

    def __init__(self, req_id: str, prompt: list[int], truth: Callable[[int], int]) -> None:
        self.req_id, self.prompt, self.truth, self.output = req_id, prompt, truth, []

    def continuation(self, start: int, n: int) -> list[int]:
        return [self.truth(start + j) for j in range(n)]

    def verify(self, draft: list[int]) -> list[int]:
        """The step's sampled tokens: the draft's prefix the target agrees with, and one more."""
        accepted = 0
        while accepted < len(draft) and draft[accepted] == self.truth(len(self.output) + accepted):
            accepted += 1
        return self.continuation(len(self.output), accepted + 1)


def _requests() -> list[Request]:
    # Two that repeat their prompt (the index drafts them) and one that never repeats
    # itself (only the model drafts it); distinct tokens, so the global corpus cannot mix them.
    return [
        Request("a", list(range(10, 30)) * 3, lambda j: 10 + j % 20),
        Request("b", list(range(300, 320)), lambda j: 320 + j),
        Request("c", list(range(100, 113)) * 4, lambda j: 100 + j % 13),
    ]


def _batch(requests: list[Request]) -> SimpleNamespace:
    """vLLM's input batch before the runner's bookkeeping: the rows lack the step's tokens."""
    table = np.zeros((len(requests), 1024), dtype=np.int32)
    for i, r in enumerate(requests):
        tokens = r.prompt + r.output
        table[i, : len(tokens)] = tokens
    return SimpleNamespace(
        req_ids=[r.req_id for r in requests],
        num_tokens_no_spec=np.array([len(r.prompt) + len(r.output) for r in requests]),
        num_prompt_tokens=np.array([len(r.prompt) for r in requests]),
        token_ids_cpu=table,
    )


class RankClocks:
    """``perf_counter`` for the proposer and hybrid modules: the current rank's own clock,
    advanced by that rank's tick at each reading."""

    def __init__(self, ticks: tuple[float, ...]) -> None:
        self.ticks, self.now, self.rank = ticks, [0.0] * len(ticks), 0

    def __call__(self) -> float:
        self.now[self.rank] += self.ticks[self.rank]
        return self.now[self.rank]


def _hybrid(settings: EngineSettings) -> Any:
    p = hybrid_mod.HybridProposer.__new__(hybrid_mod.HybridProposer)
    p._init_hybrid(vllm_config_stand_in(K), settings)  # type: ignore[arg-type]
    p._last_draft_probs = None  # SpecDecodeBaseProposer's, greedy: no probabilities kept
    return p


def _params(req_id: str) -> SimpleNamespace:
    return SimpleNamespace(
        extra_args={"session_id": f"s-{req_id}"}, max_tokens=None, eos_token_id=None, stop_token_ids=None
    )


def _run_ranks(
    monkeypatch: pytest.MonkeyPatch, settings: EngineSettings, prepare: Callable[[Any], None]
) -> tuple[list[Any], list[list[int]], RankClocks]:
    """Two ranks of one group on clocks far apart, fed the same steps: asserts at every step
    that they ran the same drafter passes and drafted alike; returns the ranks, rank 0's
    passes per step and the clocks."""
    clocks = RankClocks(TICKS)
    monkeypatch.setattr(drafting, "perf_counter", clocks)
    monkeypatch.setattr(hybrid_drafting, "perf_counter", clocks)
    ranks = [_hybrid(settings) for _ in TICKS]
    requests = _requests()
    passes: list[list[int]] = [[] for _ in ranks]
    step_sampled: list[list[int]] = []

    def forward(self: Any, num_speculative_tokens: int, **kwargs: Any) -> torch.Tensor:
        passes[ranks.index(self)].append(num_speculative_tokens)
        rows = [
            r.continuation(len(r.output) + len(s), num_speculative_tokens)
            for r, s in zip(requests, step_sampled, strict=True)
        ]
        return torch.tensor(rows, dtype=torch.long).reshape(len(rows), num_speculative_tokens)

    monkeypatch.setattr(hybrid_mod.SpecDecodeBaseProposer, "propose", forward)
    for rank, p in enumerate(ranks):
        p.bind(publish=rank == 0, alone_in_group=False)
        prepare(p.driver.budget)
        for r in requests:
            p.on_request_added(r.req_id, _params(r.req_id))

    sent: list[list[int]] = [[] for _ in requests]  # rank 0's drafts: what vLLM verifies, on every rank
    for step in range(STEPS):
        step_sampled[:] = [r.verify(d) for r, d in zip(requests, sent, strict=True)]
        batch = _batch(requests)
        drafts: list[list[list[int]]] = []
        for rank, p in enumerate(ranks):
            clocks.rank = rank
            p.take_step(batch, [list(s) for s in step_sampled])
            drafts.append(p.propose(K))
        for r, s in zip(requests, step_sampled, strict=True):
            r.output += s
        assert passes[1] == passes[0], f"step {step}: the ranks ran different drafter passes"
        assert drafts[1] == drafts[0], f"step {step}: the ranks' drafts differ"
        sent = drafts[0]
    assert clocks.now[1] > 1e6 * clocks.now[0]
    return ranks, passes[0], clocks


def test_ranks_on_different_clocks_draft_alike_and_run_the_same_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    def prepare(budget: Any) -> None:
        assert isinstance(budget, SpeedBudget)
        budget.warmup, budget.explore_every = 12, 1000  # leave the warm-up within the test

    ranks, passes, _ = _run_ranks(monkeypatch, SETTINGS, prepare)
    # What the test is for happened: the budget left its warm-up, the draft model's passes
    # ran on some steps, and the index drafted.
    assert all(p.driver.budget.proposals >= p.driver.budget.warmup for p in ranks)
    assert sum(n > 0 for n in passes) > 0 and any(passes[-5:])
    assert ranks[0].driver.counters.get("suffix_draft_tokens_total", 0) > 0


def test_ranks_under_the_cost_budget_price_alike_whatever_their_clocks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A steep step cost from the operator's profile, so that prices cut drafts and passes.
    profile = tmp_path / "cost.json"
    StepCostProfile(fixed_s=0.004, per_request_s=0.001, per_token_s=0.003, drafter_pass_s=0.002).write(profile)
    settings = EngineSettings(cost_profile=str(profile), drafter=DrafterSettings(model="org/drafter", num_tokens=4))

    def prepare(budget: Any) -> None:
        assert isinstance(budget, CostBudget) and not budget.learns
        budget.explore_every = 6  # steps that try the model drafter, within the test

    ranks, passes, _ = _run_ranks(monkeypatch, settings, prepare)
    # The prices were real: both ranks priced tokens above nothing and cut some drafts.
    assert all(p.driver.budget.last_price > 0.1 for p in ranks)
    assert ranks[0].driver.counters.get("suffix_draft_tokens_total", 0) > 0
    assert len(set(passes)) > 1 or ranks[0].driver.counters.get("drafter_runs_unpaid_total", 0) > 0


def _bound_after_one_step(alone_in_group: bool, make: Callable[[], Any] = lambda: _hybrid(SETTINGS)) -> Any:
    p = make()
    p.bind(publish=False, alone_in_group=alone_in_group)
    p.on_request_added("a", _params("a"))
    r = Request("a", list(range(10, 30)), lambda j: 10 + j % 20)
    if isinstance(p, hybrid_mod.HybridDrafting):
        p.take_step(_batch([r]), [[10]])
        p.propose(K)
    else:  # the suffix proposer: called after the runner's bookkeeping
        r.output.append(10)
        p.propose(K, _batch([r]), [[10]])
    return p


def test_the_drafters_time_steers_the_budget_only_for_a_worker_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def forward(self: Any, num_speculative_tokens: int, **kwargs: Any) -> torch.Tensor:
        return torch.zeros((1, num_speculative_tokens), dtype=torch.long)

    clock = RankClocks((1e-3,))
    monkeypatch.setattr(drafting, "perf_counter", clock)
    monkeypatch.setattr(hybrid_drafting, "perf_counter", clock)
    monkeypatch.setattr(hybrid_mod.SpecDecodeBaseProposer, "propose", forward)
    assert _bound_after_one_step(alone_in_group=True).driver.budget.drafter_s[True] > 0
    with caplog.at_level(logging.INFO, logger="vllm.agentspec.proposer"):
        shared = _bound_after_one_step(alone_in_group=False)
    assert shared.driver.budget.drafter_s[True] == 0.0
    assert sum("measured time does not steer" in r.getMessage() for r in caplog.records) == 1

    # The suffix method runs no forward passes, and vLLM keeps rank 0's drafts only: its
    # ranks need not agree, so its clock steers in a group too.
    def suffix_proposer() -> Any:
        return hybrid_mod.AgentspecProposer(vllm_config_stand_in(K), SETTINGS)  # type: ignore[arg-type]

    suffix = _bound_after_one_step(alone_in_group=False, make=suffix_proposer)
    assert suffix.driver.budget.drafter_s[True] > 0


# ---------------------------------------------------------------------- MoE, data parallel


def _config(*, moe: bool, dp: int) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(is_moe=moe),
        parallel_config=SimpleNamespace(data_parallel_size=dp),
        scheduler_config=SimpleNamespace(async_scheduling=False),
    )


def test_the_hybrid_is_refused_on_a_moe_model_with_data_parallelism() -> None:
    hybrid = hybrid_mod.HybridProposer.__new__(hybrid_mod.HybridProposer)
    with pytest.raises(plugin.UnsupportedVLLMError, match="data_parallel_size=2") as err:
        runner_patch.check_data_parallel_moe(_config(moe=True, dp=2), hybrid)
    message = str(err.value)
    assert "\n" not in message
    assert "without --agentspec-drafter" in message and "without data parallelism" in message
    # A dense model's engines run independently; one MoE engine agrees with itself.
    runner_patch.check_data_parallel_moe(_config(moe=False, dp=2), hybrid)
    runner_patch.check_data_parallel_moe(_config(moe=True, dp=1), hybrid)
    # The index alone runs no drafter passes; a rank without a drafter (pipeline parallel).
    suffix = hybrid_mod.AgentspecProposer.__new__(hybrid_mod.AgentspecProposer)
    runner_patch.check_data_parallel_moe(_config(moe=True, dp=2), suffix)
    runner_patch.check_data_parallel_moe(_config(moe=True, dp=2), None)


def test_the_patched_runner_checks_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.eagle import EagleProposer
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    from agentspec.engine.vllm import fixes as vllm_fixes

    monkeypatch.setattr(vllm_fixes, "apply", lambda: None)  # the CPU sampler fix: not here
    module = ModuleType(runner_patch.RUNNER_MODULE)  # a stand-in under the runner's name

    class GPUModelRunner:
        def __init__(self, vllm_config: Any) -> None:
            self.vllm_config = vllm_config
            self.drafter = module.DraftModelProposer.__new__(module.DraftModelProposer)

        def _update_states(self, scheduler_output: Any) -> None: ...

        def propose_draft_token_ids(self, scheduler_output: Any, sampled_token_ids: Any) -> None: ...

    module.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    module.SuffixDecodingProposer = SuffixDecodingProposer  # type: ignore[attr-defined]
    module.DraftModelProposer = DraftModelProposer  # type: ignore[attr-defined]
    module.EagleProposer = EagleProposer  # type: ignore[attr-defined]
    runner_patch.patch_runner(module)
    with pytest.raises(plugin.UnsupportedVLLMError, match="mixture-of-experts"):
        GPUModelRunner(_config(moe=True, dp=4))
    assert isinstance(GPUModelRunner(_config(moe=False, dp=4)).drafter, hybrid_mod.HybridProposer)


def test_the_vllm_surface_the_moe_check_reads() -> None:
    import dataclasses

    from vllm.config import ModelConfig, ParallelConfig

    assert isinstance(ModelConfig.__dict__["is_moe"], property)
    assert "data_parallel_size" in {f.name for f in dataclasses.fields(ParallelConfig)}
