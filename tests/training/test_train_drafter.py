"""``agentspec train-drafter`` on the tiny model: a head trained on the target's own outputs
drafts held-out calls better than the untrained one, a stopped run resumes to the same
weights, the index decides which tokens weigh most, and vLLM loads the head beside the
index with greedy outputs equal to plain vLLM's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hybrid_probe import run_hybrid_probe  # noqa: E402

from agentspec.testing.pytest_plugin import server_python  # noqa: E402
from agentspec.training.config import DrafterTrainingConfig  # noqa: E402
from agentspec.training.trainer import TrainingResult, train_drafter  # noqa: E402

#: User messages for the tiny model (its tokenizer learned Python's standard library).
TASKS = [
    "def parse(text):\n    tokens = text.split()\n",
    "import os\nimport sys\n\nclass Config:\n",
    "for i in range(10):\n    print(i * i)\n",
    "SELECT name, value FROM settings WHERE key = ?",
    'Traceback (most recent call last):\n  File "main.py", line 3',
    "git commit -m 'fix: handle empty input'",
    "async def fetch(session, url):\n    async with session.get(url) as r:",
    'raise ValueError(f"bad value: {value!r}")',
    "with open(path, 'rb') as f:\n    data = f.read()",
    "def __init__(self, name, *, timeout=None):",
    "assert result == expected, (result, expected)",
    "return sorted(items, key=lambda item: item.priority)",
    "logging.basicConfig(level=logging.INFO)",
    "class Node:\n    def __init__(self, value):\n",
    "try:\n    run()\nexcept OSError as error:\n",
    "while queue:\n    item = queue.pop()\n",
]


def _greedy(model: Any, tokenizer: Any, messages: list[dict[str, str]], tokens: int = 40) -> str:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


@pytest.fixture(scope="module")
def own_outputs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two-turn sessions of the tiny model's own greedy answers (a repair turn after the
    first): the target's outputs, as the client's transcripts record them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    path = tmp_path_factory.mktemp("corpus") / "calls.jsonl"
    with path.open("w") as f:
        for i, task in enumerate(TASKS):
            first = [{"role": "user", "content": task}]
            answer = _greedy(model, tokenizer, first)
            second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "It fails."}]
            turns = [
                {"messages_in": first, "output": answer},
                {"messages_in": second, "output": _greedy(model, tokenizer, second)},
            ]
            record = {"id": f"task-{i}", "source": "tiny", "kind": "agent", "model": "tiny", "turns": turns}
            f.write(json.dumps(record) + "\n")
    return path


def _config(target: Path, data: Path, out: Path, **overrides: Any) -> DrafterTrainingConfig:
    settings: dict[str, Any] = {
        "target": target,
        "data": (data,),
        "out": out,
        "steps": 40,
        "batch_tokens": 512,
        "max_tokens": 128,
        "context_tokens": 32,
        "draft_vocab": 1024,
        "aux_layers": (1, 2, 3),
        "learning_rate": 3e-3,
        "eval_fraction": 0.25,
        "checkpoint_every": 10,
        **overrides,
    }
    return DrafterTrainingConfig(**settings)


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, own_outputs: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainingResult:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("head")
    return train_drafter(_config(tiny_model_dir, own_outputs, out))


def test_the_trained_head_drafts_held_out_calls_better_than_untrained(trained: TrainingResult) -> None:
    assert trained.held_out_examples > 0 and trained.train_examples > 0
    assert trained.untrained is not None and trained.trained is not None
    assert trained.trained.tokens > 100
    before, after = trained.untrained, trained.trained
    # The target's own greedy text: its first drafts match the target more once trained.
    assert after.acceptance[0] > before.acceptance[0] + 0.05, (before, after)
    assert after.chain_accepted > before.chain_accepted, (before, after)
    assert 0 < trained.hard_tokens < trained.output_tokens


def test_a_stopped_run_resumes_to_the_same_weights(tiny_model_dir: Path, own_outputs: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    whole = _config(tiny_model_dir, own_outputs, tmp_path / "whole", steps=6, checkpoint_every=2)
    train_drafter(whole)

    class Stop(Exception):
        pass

    def stop_after_three(step: int, total: int, loss: float) -> None:
        if step == 3:
            raise Stop

    stopped = _config(tiny_model_dir, own_outputs, tmp_path / "stopped", steps=6, checkpoint_every=2)
    with pytest.raises(Stop):
        train_drafter(stopped, progress=stop_after_three)
    resumed = train_drafter(stopped)
    assert resumed.resumed_from == 2 and resumed.steps == 6
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "stopped" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=1e-6), name


def test_a_checkpoint_of_other_settings_is_refused(tiny_model_dir: Path, own_outputs: Path, tmp_path: Path) -> None:
    from agentspec.training.trainer import TrainingError

    train_drafter(_config(tiny_model_dir, own_outputs, tmp_path, steps=2, checkpoint_every=1))
    with pytest.raises(TrainingError, match=r"other settings \(learning_rate\)"):
        train_drafter(_config(tiny_model_dir, own_outputs, tmp_path, steps=2, learning_rate=1e-4))


def test_tokens_the_index_drafts_weigh_less(tiny_model_dir: Path) -> None:
    """A second call that repeats the first's output: the index drafts the repeat, so its
    tokens are not the drafter's (hard) while the first call's are."""
    from transformers import AutoTokenizer

    from agentspec.replay.trajectories import parse_trajectory
    from agentspec.training.examples import index_hard_steps, tokenize_calls

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = "def area(radius):\n    return 3.14159 * radius * radius\n" * 2
    first = [{"role": "user", "content": "write area"}]
    second = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    trajectory = parse_trajectory(
        {
            "id": "t",
            "source": "s",
            "kind": "agent",
            "turns": [{"messages_in": first, "output": text}, {"messages_in": second, "output": text}],
        }
    )
    calls = tokenize_calls(tokenizer, trajectory)
    hard = index_hard_steps([(trajectory, calls)], hard_below=2.0)
    first_share = sum(hard[("t", 0)]) / len(hard[("t", 0)])
    second_share = sum(hard[("t", 1)]) / len(hard[("t", 1)])
    assert len(hard[("t", 1)]) == len(calls[1][1])
    assert second_share < 0.3 < first_share, (first_share, second_share)


def test_vllm_loads_the_trained_head_beside_the_index_with_plain_greedy_outputs(
    plain_server: Any, tiny_model_dir: Path, trained: TrainingResult, tmp_path: Path
) -> None:
    prompts = [
        httpx.post(plain_server.url + "/tokenize", json={"model": "tiny", "prompt": p * 2}, timeout=30).json()["tokens"]
        for p in TASKS[:4]
    ]
    request = {"prompts": prompts, "max_tokens": 32, "num_tokens": 3, "method": "eagle3"}
    result = run_hybrid_probe(tiny_model_dir, trained.out, request, tmp_path, server_python())
    assert (result["proposer"], result["drafter_model"]) == ("HybridEagleProposer", "Eagle3LlamaForCausalLM")
    reference = []
    for p in prompts:
        body = {"model": "tiny", "prompt": p, "max_tokens": 32, "temperature": 0, "return_token_ids": True}
        r = httpx.post(plain_server.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        reference.append(r.json()["choices"][0]["token_ids"])
    assert result["outputs"] == reference
    assert result["engine"].get("model_drafts_total", 0) > 0, result["engine"]
