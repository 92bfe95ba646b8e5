"""The base install (``pip install vllm-agentspec``) is light: the client, the wire
contract, the package and the command line import without numpy, the suffix tree, torch
or vLLM, and what needs an extra says which one. Fast; no server."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

HEAVY = ("numpy", "arctic_inference", "torch", "vllm")


def run_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_light_modules_import_nothing_heavy() -> None:
    loaded = run_python(
        "import agentspec.client, agentspec.wire, agentspec, agentspec.cli; import sys; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert loaded == "[]"


def test_the_index_configuration_and_budgets_import_nothing_heavy() -> None:
    """agentspec.index loads its names on first use, so its configuration and value types,
    the draft budgets and serve's options come without the index's native code."""
    loaded = run_python(
        "import agentspec.index, agentspec.index.policy, agentspec.index.types, agentspec.draft_budget.speed_budget,"
        " agentspec.engine.launcher.options; import sys; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert loaded == "[]"


def test_the_index_package_lists_what_it_loads() -> None:
    import agentspec.index

    assert sorted(agentspec.index.__all__) == sorted(agentspec.index._LAZY)
    assert agentspec.index.Level.__module__ == "agentspec.index.types"  # loaded on first use, without numpy
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        agentspec.index.Nope  # noqa: B018


def test_testing_plugin_imports_nothing_heavy() -> None:
    loaded = run_python(
        f"import agentspec.testing.pytest_plugin; import sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert loaded == "[]"


def test_index_names_without_the_index_extra_name_it() -> None:
    message = run_python(
        "import sys; sys.modules['numpy'] = None\n"
        "import agentspec\n"
        "assert 'DraftIndex' in agentspec.__all__ and 'DraftIndex' in dir(agentspec)\n"
        "agentspec.DraftPolicy, agentspec.IndexConfig, agentspec.DraftIndexError  # no extra needed\n"
        "try:\n"
        "    agentspec.DraftIndex\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert 'pip install --find-links dist "vllm-agentspec[index]"' in message and "numpy" in message
    assert "scripts/build_dists.sh" in message


def test_version_and_unknown_names() -> None:
    import agentspec

    assert isinstance(agentspec.__version__, str) and agentspec.__version__
    with pytest.raises(AttributeError):
        agentspec.NoSuchName  # noqa: B018


def test_cli_help_lists_both_commands() -> None:
    from agentspec.cli import app

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "bench" in result.output and "serve" in result.output
    for command in ("bench", "serve"):
        result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "160"})
        assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("blocked", "args", "extras"),
    [
        ("numpy", ["bench"], ['"vllm-agentspec[bench]"']),
        ("vllm", ["serve", "./model", "--port", "1"], ['"vllm-agentspec[serve]"', '"vllm-agentspec[cpu]"']),
    ],
)
def test_commands_without_their_extra_say_which_to_install(
    monkeypatch: pytest.MonkeyPatch, blocked: str, args: list[str], extras: list[str]
) -> None:
    from agentspec.cli import app

    monkeypatch.setitem(sys.modules, blocked, None)  # find_spec and import see it missing
    result = CliRunner().invoke(app, args, env={"COLUMNS": "500"})
    assert result.exit_code == 1, result.output
    assert all(extra in result.output for extra in extras), result.output
    assert "pip install --find-links dist" in result.output and "scripts/build_dists.sh" in result.output
    assert blocked in result.output
