"""The target verifies what agentspec drafted, and no more, on a real server.

On vLLM 0.34's Model Runner V2 the runner gives every request the same draft width and the
scheduler has the target verify that many slots; the plugin narrows each request's width to
its real draft (agentspec.engine.vllm.runner_v2.narrow_draft_widths). On the V1 runner
(0.32) widths were per request already. Either way vLLM's own count of draft tokens sent
for verification equals agentspec's count of draft tokens verified, and is far below
``k`` slots on every step.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from engine_helpers import chat_ok, wait_session

from agentspec.index.policy import DraftPolicy
from agentspec.testing.stats import metric_value

pytestmark = pytest.mark.server

VLLM_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"


def _vllm_counts(base: str) -> tuple[float, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    try:
        return metric_value(text, VLLM_DRAFTED), metric_value(text, VLLM_DRAFTS)
    except KeyError:
        return 0.0, 0.0  # no step has been verified yet on this server


def test_vllm_verifies_the_real_drafts_only(agentspec_server) -> None:
    base = agentspec_server.url
    k = DraftPolicy().max_spec_tokens  # the server runs the default policy
    sid = f"widths-{uuid.uuid4().hex[:10]}"
    # The second turn's prompt holds the first answer: the session's index drafts from it.
    messages = [{"role": "user", "content": "List the numbers one to twelve in words, then say done."}]
    first = chat_ok(base, messages, max_tokens=48, headers={"X-Session-Id": sid})
    answer = first["choices"][0]["message"]["content"]
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Again, exactly the same."}]
    drafted0, drafts0 = _vllm_counts(base)
    before = wait_session(base, sid, calls=1)
    second = chat_ok(base, messages, max_tokens=48, headers={"X-Session-Id": sid})
    after = wait_session(base, sid, calls=2)
    ours = after["draft_tokens"] - before["draft_tokens"]
    # vLLM's counters follow the step's output a moment later.
    deadline = time.monotonic() + 10
    while True:
        drafted, drafts = _vllm_counts(base)
        if drafted - drafted0 >= ours or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    theirs, steps = drafted - drafted0, drafts - drafts0
    out = second["usage"]["completion_tokens"]
    assert ours > 0, after  # the repeated answer drafted
    assert theirs == ours, (theirs, ours, after)
    # Fixed widths would have sent k slots on every drafted step.
    assert theirs < k * steps, (theirs, k, steps, out)
