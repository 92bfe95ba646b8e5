"""The proposer's draft budget: by default the cost budget, which times the engine's own
decoding steps, prices draft tokens from them and keeps the profile in a file; under
``--agentspec-speed-model`` the speed model's, told every step's context and drafter time.

In-process, as test_publish.py: a stand-in for vLLM's config and input batch.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from engine_helpers import vllm_config_stand_in

from agentspec.draft_budget import cost_budget
from agentspec.draft_budget.batch_budget import BatchBudget
from agentspec.draft_budget.cost_budget import CostBudget
from agentspec.draft_budget.speed_budget import SpeedBudget
from agentspec.draft_budget.step_cost import StepCostProfile, read_cost_profile
from agentspec.engine.settings import EngineSettings
from agentspec.engine.worker.step_log import read_step_log

proposer_mod = pytest.importorskip("agentspec.engine.vllm.proposers", reason="needs vLLM")

K = 8


def _proposer(settings: EngineSettings):
    config = vllm_config_stand_in(K)
    return proposer_mod.AgentspecProposer(config, settings)  # type: ignore[arg-type]


def _batch(rows: list[tuple[str, list[int], list[int]]]) -> SimpleNamespace:
    table = np.zeros((len(rows), 2048), dtype=np.int32)
    for i, (_, prompt, generated) in enumerate(rows):
        table[i, : len(prompt) + len(generated)] = prompt + generated
    return SimpleNamespace(
        req_ids=[r for r, _, _ in rows],
        num_tokens_no_spec=np.array([len(p) + len(g) for _, p, g in rows]),
        num_prompt_tokens=np.array([len(p) for _, p, _ in rows]),
        token_ids_cpu=table,
    )


def test_the_speed_model_chooses_the_budget() -> None:
    proposer = _proposer(EngineSettings(speed_model="h100:8b"))
    budget = proposer.driver.budget
    assert isinstance(budget, SpeedBudget) and budget.max_tokens == K
    assert budget.model.gpu.name == "H100 SXM" and budget.model.model.name == "Llama-3-8B shape"
    assert isinstance(_proposer(EngineSettings()).driver.budget, CostBudget)
    assert isinstance(_proposer(EngineSettings(draft_budget="batch")).driver.budget, BatchBudget)


def test_each_step_reports_context_and_drafter_time() -> None:
    proposer = _proposer(EngineSettings(speed_model="h200:70b"))
    budget = proposer.driver.budget
    params = SimpleNamespace(extra_args={"session_id": "s"}, max_tokens=64, eos_token_id=None, stop_token_ids=None)
    rows = [("a", list(range(1, 41)), [7]), ("b", list(range(50, 70)), [8])]
    for req_id, _, _ in rows:
        proposer.on_request_added(req_id, params)
    proposer.propose(K, _batch(rows), [[7], [8]])
    assert budget.context_tokens == (41 + 21) / 2
    assert budget.drafter_s[True] > 0
    assert proposer.driver.counters["batch_size"] == 2


def test_a_bad_speed_model_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError, match="GPU:MODEL"):
        EngineSettings(speed_model="tpu:8b")


def test_the_speed_models_probability_cut_stops_the_steps_drafts_and_is_logged(tmp_path: Path) -> None:
    logs = tmp_path / "steps"
    settings = EngineSettings(speed_model="h100:8b", state_dir=str(tmp_path / "state"), step_log_dir=str(logs))
    proposer = _proposer(settings)
    proposer.bind(publish=True)
    budget = proposer.driver.budget
    # Past the warm-up: drafts whose tail below path probability 0.4 was never accepted.
    for i in range(400):
        head = 6 if i % 2 else 1
        budget.observe_draft(K, K, head, [0.9] * head + [0.35] * (K - head))
    params = SimpleNamespace(extra_args={"session_id": "s"}, max_tokens=64, eos_token_id=None, stop_token_ids=None)
    # After [1, 2, 3, 4, 5] the prompt went on with 6 once and 9 once: the draft that
    # continues it runs at path probability 1/3, under the cut.
    prompt = [1, 2, 3, 4, 5, 6, 60, 61, 1, 2, 3, 4, 5, 9, 90, 91, 1, 2, 3, 4]
    proposer.on_request_added("a", params)
    drafts = proposer.propose(K, _batch([("a", prompt, [5])]), [[5]])
    assert proposer.driver.min_prob == 0.4 and proposer.driver.counters["draft_min_prob"] == 0.4
    assert drafts == [[]]  # its tokens were all under the cut
    (path,) = logs.glob("steps-*.jsonl")
    steps = [e for e in read_step_log(path) if e["e"] == "step"]
    # The cap: 6, the longest head (under the cut no draft is longer, and ties go short).
    assert steps == [{"e": "step", "batch": 1, "rows": [["a", 1, 6, 0]], "min_prob": 0.4}]


class Clock:
    """``perf_counter`` for the proposer module: each reading advances by the time the
    target's step would take, so that the proposer times the steps of a known cost curve."""

    def __init__(self, truth: StepCostProfile) -> None:
        self.truth, self.now, self.pending = truth, 0.0, 0.0

    def __call__(self) -> float:
        self.now += self.pending + 1e-6
        self.pending = 0.0
        return self.now


def test_the_cost_budget_times_decoding_steps_and_keeps_its_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentspec.engine.worker import drafting

    truth = StepCostProfile(fixed_s=0.004, per_request_s=0.001, per_token_s=0.004)
    clock = Clock(truth)
    monkeypatch.setattr(drafting, "perf_counter", clock)
    profile_path = tmp_path / "cost.json"
    proposer = _proposer(EngineSettings(cost_profile=str(profile_path)))
    budget = proposer.driver.budget
    assert isinstance(budget, CostBudget) and budget.learns
    params = SimpleNamespace(extra_args={"session_id": "s"}, max_tokens=None, eos_token_id=None, stop_token_ids=None)
    text = list(range(1, 17))
    rows = {"a": (text * 6, []), "b": ([t + 100 for t in text] * 6, [])}
    for req_id in rows:
        proposer.on_request_added(req_id, params)
    widths = {"a": 0, "b": 0}
    for step in range(60):
        sampled = []
        for req_id, (prompt, out) in rows.items():
            # The target continues the repeated text; it accepts every drafted token.
            n = 1 + widths[req_id]
            start = len(out)
            new = [prompt[(len(prompt) + start + j) % 16] for j in range(n)]
            out.extend(new)
            sampled.append(new)
        verified = sum(1 + w for w in widths.values())
        clock.pending = truth.step_seconds(2, verified) if step else 0.0
        # Drafts of every length, as varied traffic gives: the fit tells tokens from steps.
        drafts = proposer.propose(step % (K + 1), _batch([(r, p, o) for r, (p, o) in rows.items()]), sampled)
        widths = {r: len(d) for r, d in zip(rows, drafts, strict=True)}
    fit = budget.cost
    # The first step (the prefills: no row was drafted for before) is not a decoding step.
    assert fit.steps == 59
    assert fit.per_token_s == pytest.approx(truth.per_token_s, rel=0.1)
    assert proposer.driver.counters["cost_timed_steps"] == 59
    proposer.on_step_end(idle=True)  # idle: the profile is written at once
    assert read_cost_profile(profile_path) == fit
    # The next start takes it as its prior.
    again = _proposer(EngineSettings(cost_profile=str(profile_path))).driver.budget
    assert isinstance(again, CostBudget) and again.cost == fit


def test_a_broken_cost_profile_is_refused_by_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    path.write_text('{"fixed_s": "fast"}')
    with pytest.raises(ValueError, match="cost profile .*fixed_s"):
        EngineSettings(cost_profile=str(path))
    assert EngineSettings(cost_profile=str(tmp_path / "not-yet.json")).cost_profile  # written later
    assert cost_budget.CostBudget.calibrated_cut
