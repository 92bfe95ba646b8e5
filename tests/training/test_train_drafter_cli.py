"""``agentspec train-drafter``'s command line: bad inputs are one line naming the option or
the file, exit 2, before torch is imported; help is there with -h."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentspec.cli import app


def _invoke(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["train-drafter", *args], env={"COLUMNS": "300"})
    return result.exit_code, [line for line in result.output.splitlines() if line.strip()]


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    path = tmp_path / "calls.jsonl"
    turn = {"messages_in": [{"role": "user", "content": "hi"}], "output": "hello"}
    path.write_text(json.dumps({"id": "a", "source": "s", "kind": "agent", "turns": [turn]}) + "\n")
    return path


def test_help_with_dash_h_names_the_command_and_its_options() -> None:
    result = CliRunner().invoke(app, ["train-drafter", "-h"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "EAGLE-3 head" in result.output and "--draft-vocab" in result.output and "<bool>" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}", "--data", "{calls}", "--out", "{out}"], "TARGET: no such folder"),
        (["{empty}", "--data", "{calls}", "--out", "{out}"], "holds no config.json"),
        (["{model}", "--data", "{missing}", "--out", "{out}"], "--data: no such file"),
        (["{model}", "--data", "{calls}", "--out", "{calls}"], "--out: "),
        (["{model}", "--data", "{calls}", "--out", "{out}", "--steps", "0"], "--steps: Input should be greater"),
        (["{model}", "--data", "{calls}", "--out", "{out}", "--draft-vocab", "3"], "--draft-vocab: "),
        (["{model}", "--data", "{calls}", "--out", "{out}", "--context-tokens", "600"], "context_tokens (600)"),
        (["{model}", "--data", "{calls}", "--out", "{out}", "--aux-layers", "2,x"], "--aux-layers: "),
    ],
    ids=["no-target", "not-a-model", "no-data", "out-is-a-file", "steps", "vocab", "context", "layers"],
)
def test_bad_inputs_are_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, model_folder: Path, calls: Path
) -> None:
    (tmp_path / "empty").mkdir()
    names = {
        "missing": str(tmp_path / "nope"),
        "empty": str(tmp_path / "empty"),
        "model": str(model_folder),
        "calls": str(calls),
        "out": str(tmp_path / "out"),
    }
    code, lines = _invoke(*(a.format(**names) for a in args))
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("error: agentspec train-drafter: ") and message in lines[0], lines


def test_a_missing_target_is_reported_before_torch_is_imported(tmp_path: Path, calls: Path) -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from agentspec.cli import app\n"
        f"args = ['train-drafter', {str(tmp_path / 'nope')!r}, '--data', {str(calls)!r}, '--out', {str(tmp_path)!r}]\n"
        "result = CliRunner().invoke(app, args)\n"
        "print(result.exit_code)\n"
        "print(sorted(m for m in ('vllm', 'torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split("\n")[:2] == ["2", "[]"], out.stdout


def _tiny_text_run(target: Path, data: Path, out: Path, *extra: str) -> tuple[int, list[str]]:
    return _invoke(str(target), "--data", str(data), "--out", str(out), "--steps", "1", "-q", *extra)


def test_an_empty_corpus_and_mixed_tenants_are_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code, lines = _tiny_text_run(tiny_model_dir, empty, tmp_path / "o1")
    assert code == 2 and len(lines) == 1 and "nothing to train on" in lines[0], lines

    turn = {"messages_in": [{"role": "user", "content": "hi"}], "output": "hello"}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        "".join(
            json.dumps({"id": t, "source": "s", "kind": "agent", "tenant": t, "turns": [turn]}) + "\n"
            for t in ("acme", "globex")
        )
    )
    code, lines = _tiny_text_run(tiny_model_dir, mixed, tmp_path / "o2")
    assert code == 2 and len(lines) == 1, lines
    assert "2 tenants ('acme', 'globex')" in lines[0] and "--tenant" in lines[0], lines
    code, lines = _tiny_text_run(tiny_model_dir, mixed, tmp_path / "o3", "--tenant", "nobody")
    assert code == 2 and "of tenant 'nobody'" in lines[0], lines

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    code, lines = _tiny_text_run(tiny_model_dir, bad, tmp_path / "o4")
    assert code == 2 and len(lines) == 1 and "bad.jsonl:1" in lines[0], lines


def test_one_tenant_is_trained_and_named_in_the_head(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    turn = {"messages_in": [{"role": "user", "content": "def f(x):"}], "output": "    return x * 2\n" * 3}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        "".join(
            json.dumps({"id": f"{t}{i}", "source": "s", "kind": "agent", "tenant": t, "turns": [turn]}) + "\n"
            for t in ("acme", "globex")
            for i in range(3)
        )
    )
    out = tmp_path / "head"
    code, lines = _tiny_text_run(tiny_model_dir, mixed, out, "--tenant", "acme", "--eval-fraction", "0")
    assert code == 0, lines
    config = json.loads((out / "config.json").read_text())
    assert config["agentspec"]["tenants"] == ["acme"]
    assert json.loads("\n".join(lines))["tenants"] == ["acme"]


def test_a_tokenizer_that_is_not_the_models_is_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    data = tmp_path / "calls.jsonl"
    turn = {"messages_in": [{"role": "user", "content": "hi"}], "output": "hello"}
    data.write_text(json.dumps({"id": "a", "source": "s", "kind": "agent", "turns": [turn]}) + "\n")
    code, lines = _tiny_text_run(model, data, tmp_path / "out")
    assert code == 2 and len(lines) == 1, lines
    assert "tokenizer has 4096 tokens but the model's vocabulary 100" in lines[0], lines

    (model / "config.json").write_text(json.dumps({**config, "model_type": "no-such-architecture"}))
    code, lines = _tiny_text_run(model, data, tmp_path / "out")
    assert code == 2 and len(lines) == 1 and "not a model and tokenizer transformers can load" in lines[0], lines


def test_a_device_torch_cannot_use_is_one_line(tiny_model_dir: Path, calls: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has the device")
    code, lines = _tiny_text_run(tiny_model_dir, calls, tmp_path / "out", "--device", "cuda:0")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: agentspec train-drafter: --device cuda:0: "), (
        lines
    )
