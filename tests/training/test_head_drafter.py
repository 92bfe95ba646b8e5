"""A trained head drafting step by step with its caches (the replay's ``drafter``): its
drafts are the head's chained greedy drafts over the whole context, whatever the caches
held before (a context that grows, a new call sharing part of it, one that ends inside it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from agentspec.head.drafter import HeadDrafter  # noqa: E402
from agentspec.head.files import DrafterLoadError, check_pair  # noqa: E402
from agentspec.testing.tiny_model import build_tiny_reduced_eagle3_head  # noqa: E402

TOKENS = 3


@pytest.fixture(scope="module")
def drafter(tiny_model_dir: Path) -> HeadDrafter:
    torch.set_num_threads(1)
    return HeadDrafter.load(build_tiny_reduced_eagle3_head(tiny_model_dir), tiny_model_dir)


def _unrolled_chain(drafter: HeadDrafter, context: list[int], chain: list[int]) -> list[int]:
    """The chain as the training forward computes it, all positions at once: pass ``j`` at
    position ``L - 2 + j`` over the context followed by the chain's own tokens."""
    head, target = drafter.head, drafter.target
    ids = torch.tensor([context + chain])
    seen = target.run(ids, head.shape.aux_layers, head.draft_ids)
    with torch.no_grad():
        logits = head.unrolled(seen.aux_states, seen.next_embeds, seen.cos, seen.sin, len(chain))
    n = len(context)
    return [int(head.draft_ids[logits[j][0, n - 2 + j].argmax()]) for j in range(len(chain))]


def _fresh(drafter: HeadDrafter, context: list[int]) -> list[int]:
    return HeadDrafter(drafter.head, drafter.target).draft("fresh", context, TOKENS)


def test_drafts_are_the_heads_chain_over_the_whole_context(drafter: HeadDrafter) -> None:
    text = [(7 * i + 3) % 900 + 5 for i in range(80)]
    for length in (2, 3, 17, 18, 21, 40, 41):
        chain = drafter.draft("s", text[:length], TOKENS)
        assert len(chain) == TOKENS
        assert all(0 <= t < 2 * 1024 and t % 2 == 0 for t in chain)  # the reduced vocabulary's ids
        assert chain == _unrolled_chain(drafter, text[:length], chain), length


def test_the_caches_give_what_a_fresh_drafter_gives(drafter: HeadDrafter) -> None:
    first = [(5 * i + 1) % 700 + 9 for i in range(60)]
    contexts = [
        first[:30],
        first[:34],  # grows by a step's tokens
        first[:50],
        first[:20] + [11, 12, 13, 14],  # a new call sharing the first 20 tokens
        first[:20] + [11, 12, 13, 14, 15],
        first[:12],  # ends inside what was read
        first[:12],  # the same context again
        [42, 43],  # shares nothing
    ]
    for context in contexts:
        assert drafter.draft("cached", context, TOKENS) == _fresh(drafter, context), context


def test_streams_are_apart_and_the_least_recent_is_dropped(tiny_model_dir: Path, drafter: HeadDrafter) -> None:
    small = HeadDrafter(drafter.head, drafter.target, max_streams=2)
    a, b = list(range(10, 40)), list(range(200, 230))
    assert small.draft("a", a, TOKENS) == _fresh(drafter, a)
    assert small.draft("b", b, TOKENS) == _fresh(drafter, b)
    small.draft("c", a[:5], TOKENS)
    assert set(small._streams) == {"b", "c"}
    assert small.draft("a", a + [1], TOKENS) == _fresh(drafter, a + [1])


def test_no_draft_past_the_targets_positions_or_without_a_step(drafter: HeadDrafter) -> None:
    limited = HeadDrafter(drafter.head, drafter.target)
    limited.max_positions = 20
    assert limited.draft("s", list(range(5, 25)), TOKENS) == []
    assert limited.draft("s", list(range(5, 21)), TOKENS) != []
    assert limited.draft("s", [5], TOKENS) == []
    assert limited.draft("s", list(range(5, 10)), 0) == []


def test_a_head_for_another_target_is_refused_from_its_files(tiny_model_dir: Path, tmp_path: Path) -> None:
    import json
    import shutil

    head = build_tiny_reduced_eagle3_head(tiny_model_dir)
    check_pair(head, tiny_model_dir)
    other = tmp_path / "other"
    shutil.copytree(head, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))
    with pytest.raises(DrafterLoadError, match="trained for another target: vocab_size"):
        check_pair(other, tiny_model_dir)
    with pytest.raises(DrafterLoadError, match="holds no EAGLE-3 head"):
        check_pair(tiny_model_dir / "nope", tiny_model_dir)
    with pytest.raises(DrafterLoadError, match="not a head written by agentspec train-drafter"):
        check_pair(tiny_model_dir, tiny_model_dir)


def _accepted(draft: list[int], output: list[int], pos: int) -> int:
    n = 0
    while n < len(draft) and pos + n < len(output) and draft[n] == output[pos + n]:
        n += 1
    return n


def test_a_whole_call_at_once_accepts_what_step_by_step_drafting_accepts(drafter: HeadDrafter) -> None:
    """Recorded text that follows the head's own chains in places (so later passes are
    accepted too), drafted step by step and as one call: same drafts up to and including
    their first wrong token, so the same accepted tokens at every step."""
    prompt = [(11 * i + 2) % 800 + 5 for i in range(25)]
    output: list[int] = []
    walker = HeadDrafter(drafter.head, drafter.target)
    while len(output) < 40:
        chain = walker.draft("w", prompt + output, TOKENS)
        output += chain[: 1 + len(output) % 3]  # follow the chain for 1 to 3 tokens
        output.append(3 + len(output))  # then leave it
    step = HeadDrafter(drafter.head, drafter.target)
    whole = HeadDrafter(drafter.head, drafter.target).call_chains("c", prompt, output, TOKENS)
    assert len(whole) == len(output) - 1
    deep = 0
    for i, row in enumerate(whole):
        pos = i + 1
        stepwise = step.draft("s", prompt + output[:pos], TOKENS)
        accepted = _accepted(stepwise, output, pos)
        assert _accepted(row, output, pos) == accepted, (pos, row, stepwise)
        upto = min(accepted + 1, TOKENS)
        assert row[:upto] == stepwise[:upto], (pos, row, stepwise)
        deep += accepted >= 2
    assert deep >= 5  # later passes were compared, not only first ones


def test_a_session_s_next_call_reuses_what_was_read(drafter: HeadDrafter) -> None:
    prompt = list(range(30, 60))
    first = list(range(100, 120))
    second_prompt = prompt + first + [7, 8]
    second = list(range(300, 315))
    cached = HeadDrafter(drafter.head, drafter.target)
    cached.call_chains("s", prompt, first, TOKENS)
    assert cached.call_chains("s", second_prompt, second, TOKENS) == HeadDrafter(
        drafter.head, drafter.target
    ).call_chains("fresh", second_prompt, second, TOKENS)
    assert cached._streams["s"].read == [*second_prompt, *second][:-1]
