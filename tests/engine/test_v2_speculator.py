"""``agentspec serve`` on vLLM 0.34's Model Runner V2: the command selects the registered
``agentspec`` method, runs without async scheduling (the speculator waits for each step's
tokens on the host) and without the V1 runner's variable (0.34 refuses it), and refuses
what V2 cannot serve yet, naming it. The last test runs where vLLM 0.34 is installed
(scripts/test_vllm034.sh) and reads the dry run's report of the real command."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agentspec.engine.launcher.serve import build_command, build_env, installed_vllm_version, model_runner_for
from agentspec.engine.settings import DrafterSettings, EngineSettings
from agentspec.engine.vllm.surface import V2_METHOD, V2_RUNNER_ENV


def _spec(cmd: list[str]) -> dict[str, object]:
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


def test_v2_command_selects_the_registered_method_without_async_scheduling() -> None:
    cmd = build_command("m", ["--port", "8001"], runner="v2")
    assert _spec(cmd)["method"] == V2_METHOD == "agentspec"
    assert "--no-async-scheduling" in cmd
    assert _spec(build_command("m", [], runner="v1"))["method"] == "suffix"
    assert "--no-async-scheduling" not in build_command("m", [], runner="v1")


def test_v2_command_keeps_a_users_own_agentspec_config() -> None:
    own = json.dumps({"method": "agentspec", "num_speculative_tokens": 6})
    cmd = build_command("m", ["--speculative-config", own], runner="v2")
    assert _spec(cmd) == {"method": "agentspec", "num_speculative_tokens": 6}


@pytest.mark.parametrize(
    ("args", "drafter", "message"),
    [
        (["--speculative-config", '{"method": "suffix"}'], None, "method 'agentspec' on this vLLM"),
        (["--async-scheduling"], None, "drop --async-scheduling"),
        ([], DrafterSettings(model="org/drafter"), "drop --agentspec-drafter"),
    ],
    ids=["vllm-suffix", "async", "hybrid"],
)
def test_v2_command_refuses_what_v2_cannot_serve(
    args: list[str], drafter: DrafterSettings | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_command("m", args, drafter=drafter, runner="v2")


def test_v1_variable_only_for_the_v1_runner() -> None:
    assert build_env(EngineSettings(), {}, runner="v1")[V2_RUNNER_ENV] == "0"
    assert V2_RUNNER_ENV not in build_env(EngineSettings(), {}, runner="v2")


@pytest.mark.parametrize(
    ("version", "runner"),
    [("0.32.0+cpu", "v1"), ("0.33.0", "v1"), ("0.34.0+cpu", "v2"), ("0.30.1", "v1"), (None, "v1")],
)
def test_the_runner_follows_the_installed_release(version: str | None, runner: str) -> None:
    assert model_runner_for(version) == runner


def test_dry_run_on_vllm_034_reports_the_v2_command(tmp_path) -> None:
    version = installed_vllm_version()
    if version is None or not version.startswith("0.34"):
        pytest.skip(f"needs vLLM 0.34 installed (scripts/test_vllm034.sh); this is {version}")
    from agentspec.cli import app

    result = CliRunner().invoke(app, ["serve", str(tmp_path), "--agentspec-dry-run"])
    assert result.exit_code == 0, result.output
    assert '"method": "agentspec"' in result.output
    assert "--no-async-scheduling" in result.output
    assert V2_RUNNER_ENV not in result.output
