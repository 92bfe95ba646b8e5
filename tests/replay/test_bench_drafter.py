"""``agentspec bench --drafter HEAD --target MODEL`` end to end on the tiny model: the head
alone and the hybrid replayed in the target's tokens, with the hybrid's counters; bad
inputs refused in one line before torch is imported."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentspec.replay.cli import DRAFTER_PROPOSERS  # noqa: E402
from agentspec.replay.model_drafting import HYBRID_COUNTERS  # noqa: E402
from agentspec.testing.tiny_model import build_tiny_reduced_eagle3_head  # noqa: E402

ANSWER = "def parse(text):\n    tokens = text.split()\n    return [t.strip() for t in tokens if t]\n"


@pytest.fixture(scope="module")
def head(tiny_model_dir: Path) -> Path:
    return build_tiny_reduced_eagle3_head(tiny_model_dir)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """Two sessions of two calls: a repair turn repeats the first answer."""
    path = tmp_path / "calls.jsonl"
    with path.open("w") as f:
        for i in range(2):
            first = [{"role": "user", "content": f"Write parse number {i}."}]
            second = [*first, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "It fails."}]
            turns = [{"messages_in": first, "output": ANSWER}, {"messages_in": second, "output": ANSWER + "# fixed\n"}]
            f.write(json.dumps({"id": f"s{i}", "source": "tiny", "kind": "agent", "turns": turns}) + "\n")
    return path


def _invoke(app: typer.Typer, tmp_path: Path, *args: str):
    return CliRunner().invoke(
        app, ["bench", "--cache-dir", str(tmp_path / "cache"), "-q", *args], env={"COLUMNS": "300"}
    )


def test_the_head_alone_and_the_hybrid_replay_in_the_targets_tokens(
    app: typer.Typer, tmp_path: Path, tiny_model_dir: Path, head: Path, data: Path
) -> None:
    from agentspec.replay.tokenized import TokenCache

    out = tmp_path / "r.json"
    args = ["--data", str(data), "--drafter", str(head), "--target", str(tiny_model_dir), "--json", str(out)]
    result = _invoke(app, tmp_path, *args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "agentspec-hybrid: model drafts on" in " ".join(result.output.split())
    records = {r["proposer"]: r for r in json.loads(out.read_text())["records"] if r["source"] == "all"}
    assert list(records) == list(DRAFTER_PROPOSERS)
    # Every proposer replayed the same calls, tokenized by the target's tokenizer.
    cache = TokenCache.with_tokenizer(data, tmp_path / "cache", tiny_model_dir)
    calls = [c for trajectory in cache.load("tiny").workload() for c in trajectory]
    prompt_tokens = sum(len(c.prompt()) for c in calls)
    assert {r["prompt_tokens"] for r in records.values()} == {prompt_tokens}
    assert {r["calls"] for r in records.values()} == {4}
    # The head alone drafts 3 tokens at every decoding step (all steps but each prefill).
    alone = records["drafter"]
    assert alone["drafted_tokens"] == 3 * (alone["steps"] - alone["calls"])
    hybrid = records["agentspec-hybrid"]["counters"]
    assert set(hybrid) == set(HYBRID_COUNTERS)
    assert hybrid["drafter_runs"] + hybrid["drafter_runs_skipped"] == records["agentspec-hybrid"]["steps"] - 4
    assert hybrid["model_drafts"] > 0  # first steps of fresh text: the index has nothing yet
    # The repair turn repeats the answer: the index drafts it, beside the head.
    assert hybrid["suffix_accepted_tokens"] > 0
    assert records["agentspec-hybrid"]["al"] >= records["agentspec"]["al"] * 0.9


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--drafter", "{head}"], "--drafter needs --target DIR"),
        (["--target", "{target}"], "--target is the model a --drafter drafts for"),
        (["--drafter", "{tmp}/nope", "--target", "{target}"], "--drafter: no such folder"),
        (["--drafter", "{target}", "--target", "{target}"], "not a head written by agentspec train-drafter"),
        (["--drafter", "{other}", "--target", "{target}"], "trained for another target: vocab_size"),
        (["--drafter", "{head}", "--target", "{target}", "--drafter-tokens", "0"], "--drafter-tokens"),
        (["--tokenizer", "{tmp}/nope"], "--tokenizer: no such folder"),
    ],
)
def test_bad_drafter_options_get_one_line(
    tmp_path: Path, tiny_model_dir: Path, head: Path, args: list[str], message: str
) -> None:
    from agentspec.cli import app  # the command line as users run it (its one-line usage errors)

    other = tmp_path / "other"
    shutil.copytree(head, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 1}))
    values = {"head": head, "target": tiny_model_dir, "tmp": tmp_path, "other": other}
    result = _invoke(app, tmp_path, *(a.format(**values) for a in args))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: agentspec bench: ") and message in lines[0], result.output


def test_a_head_for_another_target_is_refused_before_torch_is_imported(
    tmp_path: Path, tiny_model_dir: Path, head: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(head, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 3}))
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from agentspec.cli import app\n"
        f"args = ['bench', '--drafter', {str(other)!r}, '--target', {str(tiny_model_dir)!r}]\n"
        "result = CliRunner().invoke(app, args)\n"
        "print(result.exit_code)\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["2", "[]"], out.stdout + out.stderr


def test_the_targets_tokenizer_keeps_special_token_text_as_text(tiny_model_dir: Path) -> None:
    """As with Qwen2.5's: a message that spells ``<|im_start|>`` does not open a turn."""
    from agentspec.replay.tokenized import HFTokenizer, tokenizer_digest

    tok = HFTokenizer(tiny_model_dir)
    start = tok.special("<|im_start|>")
    assert start not in tok.encode("<|im_start|>user")
    assert tok.name == tokenizer_digest(tiny_model_dir) and tok.name.startswith("hf-")
    with pytest.raises(ValueError, match=re.escape("has no <|nope|> token; the replay renders calls in ChatML")):
        tok.special("<|nope|>")
