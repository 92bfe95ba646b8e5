"""The hybrid's drafter rule is a setting (``--agentspec-drafter-rule``): the default
compares expected accepted tokens, ``score`` is Arctic Inference's rule. The draft model's
passes are not run here (they need a drafter model); only the choice is."""

from __future__ import annotations

import pytest
from engine_helpers import vllm_config_stand_in

from agentspec.draft_budget.drafter_choice import DraftPath
from agentspec.engine.settings import DrafterSettings, EngineSettings
from agentspec.index import Draft, Level

proposers = pytest.importorskip("agentspec.engine.vllm.proposers", reason="needs vLLM")


def _hybrid(rule: str) -> proposers.HybridProposer:
    settings = EngineSettings(drafter=DrafterSettings(model="org/drafter", num_tokens=4, rule=rule))
    p = proposers.HybridProposer.__new__(proposers.HybridProposer)
    p._init_hybrid(vllm_config_stand_in(8), settings)  # type: ignore[arg-type]
    return p


@pytest.mark.parametrize(("rule", "path"), [("expected", DraftPath.SUFFIX), ("score", DraftPath.MODEL)])
def test_the_rule_setting_decides_where_the_two_rules_part(rule: str, path: DraftPath) -> None:
    # A short draft of two likely tokens against a 4-token drafter expected to deliver 1.
    draft = Draft([5, 6], [0.9, 0.9], 1.8, 3, Level.CALL)
    assert _hybrid(rule)._choose(2, draft, 1.8, 4, 1.0) is path


def test_both_rules_take_the_index_when_the_model_may_not_draft() -> None:
    draft = Draft([5], [0.2], 0.2, 1, Level.CALL)
    for rule in ("expected", "score"):
        assert _hybrid(rule)._choose(1, draft, 0.2, 0, 0.0) is DraftPath.SUFFIX
        assert _hybrid(rule)._choose(0, None, 0.0, 0, 0.0) is DraftPath.NONE
