"""``agentspec serve`` command construction and pass-through of vLLM options."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel
from typer.testing import CliRunner

from agentspec.engine.launcher.serve import (
    MIDDLEWARE,
    SERVE_CONTEXT,
    build_command,
    build_env,
    serve,
)
from agentspec.engine.settings import ENV_CONFIG, DrafterSettings, EngineSettings


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("serve", context_settings=SERVE_CONTEXT)(serve)
    app.command("other")(lambda: None)  # a multi-command app, as in agentspec.cli
    return app


def test_defaults_and_passthrough() -> None:
    cmd = build_command("m", ["--port", "8001", "--max-model-len=4096", "--enforce-eager"])
    assert cmd[1:5] == ["-m", "agentspec.engine.vllm.launch", "--model", "m"]
    assert cmd[5:9] == ["--port", "8001", "--max-model-len=4096", "--enforce-eager"]
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["method"] == "suffix" and spec["num_speculative_tokens"] == 32
    assert "--enable-prefix-caching" in cmd
    assert cmd[-2:] == ["--middleware", MIDDLEWARE]


def test_user_options_win() -> None:
    own = json.dumps({"method": "suffix", "num_speculative_tokens": 8})
    cmd = build_command("m", ["--speculative-config", own, "--no-enable-prefix-caching"])
    assert cmd.count("--speculative-config") == 1 and own in cmd
    assert "--enable-prefix-caching" not in cmd


def test_other_methods_refused() -> None:
    with pytest.raises(ValueError, match="suffix"):
        build_command("m", ["--speculative-config", '{"method": "eagle"}'])


def test_cli_drafter_runs_vllms_draft_model_method_without_async_scheduling(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = CliRunner().invoke(
        _app(),
        ["serve", "m", "--agentspec-drafter", str(tmp_path), "--agentspec-drafter-tokens", "5", "--agentspec-dry-run"],
    )
    assert result.exit_code == 0, result.output
    env, *command = shlex.split(result.output)
    spec = json.loads(command[command.index("--speculative-config") + 1])
    # vLLM verifies drafts as long as the index's longest; the model drafts 5 of them.
    assert spec["method"] == "draft_model" and spec["model"] == str(tmp_path) and spec["num_speculative_tokens"] == 32
    assert "--no-async-scheduling" in command
    settings = json.loads(env.split("=", 1)[1])
    assert settings["drafter"] == {"model": str(tmp_path), "num_tokens": 5}


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_cli_drafter_method_runs_vllms_eagle_methods(method: str) -> None:
    result = CliRunner().invoke(
        _app(),
        ["serve", "m", "--agentspec-drafter", "org/head", "--agentspec-drafter-method", method, "--agentspec-dry-run"],
    )
    assert result.exit_code == 0, result.output
    env, *command = shlex.split(result.output)
    spec = json.loads(command[command.index("--speculative-config") + 1])
    assert spec["method"] == method and spec["model"] == "org/head"
    assert json.loads(env.split("=", 1)[1])["drafter"]["method"] == method


def test_cli_drafter_takes_keys_of_the_users_speculative_config() -> None:
    own = json.dumps({"draft_sample_method": "probabilistic", "num_speculative_tokens": 16})
    cmd = build_command("m", ["--speculative-config", own], drafter=DrafterSettings(model="org/drafter"))
    assert cmd.count("--speculative-config") == 1
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model" and spec["model"] == "org/drafter"
    assert spec["draft_sample_method"] == "probabilistic" and spec["num_speculative_tokens"] == 16


def test_cli_drafter_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    for folder, vocab in ((target, 4096), (drafter, 32000)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    result = CliRunner().invoke(
        _app(), ["serve", str(target), "--agentspec-drafter", str(drafter), "--agentspec-dry-run"]
    )
    assert result.exit_code == 2
    assert "the draft model's vocabulary (32000 tokens) is not the target's (4096)" in result.output
    same = CliRunner().invoke(_app(), ["serve", str(target), "--agentspec-drafter", str(target), "--agentspec-dry-run"])
    assert same.exit_code == 0, same.output


def test_cli_drafter_folder_must_hold_a_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["serve", "m", "--agentspec-drafter", str(tmp_path), "--agentspec-dry-run"])
    assert result.exit_code == 2 and "has no config.json: not a model folder" in result.output


def test_env_turns_plugin_on() -> None:
    env = build_env(EngineSettings(full_draft_batch=4), base={})
    settings = json.loads(env[ENV_CONFIG])
    token = settings.pop("admission_token")
    assert settings == {"full_draft_batch": 4}
    # A fresh secret per start (the middleware's stamp, docs/security.md); one given is kept.
    assert len(token) == 32 and token != json.loads(build_env(EngineSettings(), base={})[ENV_CONFIG])["admission_token"]
    kept = build_env(EngineSettings(admission_token="given"), base={})
    assert json.loads(kept[ENV_CONFIG]) == {"admission_token": "given"}


def test_cli_dry_run_passes_unknown_options() -> None:
    result = CliRunner().invoke(
        _app(),
        ["serve", "my-model", "--port", "9000", "--tensor-parallel-size", "2", "--agentspec-no-draft-batch", "32",
         "--agentspec-dry-run"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "--model my-model --port 9000 --tensor-parallel-size 2" in result.output
    assert '"no_draft_batch":32' in result.output


def test_cli_speed_model() -> None:
    result = CliRunner().invoke(
        _app(), ["serve", "my-model", "--agentspec-speed-model", "h200:70b", "--agentspec-dry-run"]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(shlex.split(result.output)[0].split("=", 1)[1])
    assert settings["speed_model"] == "h200:70b"


def test_cli_exchange_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        _app(), ["serve", "my-model", "--agentspec-exchange-dir", str(tmp_path), "--agentspec-dry-run"]
    )
    assert result.exit_code == 0, result.output
    assignment = shlex.split(result.output)[0]
    assert assignment.startswith(f"{ENV_CONFIG}=")
    assert json.loads(assignment.split("=", 1)[1])["exchange_dir"] == str(tmp_path)


def test_cli_step_log_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        _app(), ["serve", "my-model", "--agentspec-step-log-dir", str(tmp_path / "steps"), "--agentspec-dry-run"]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(shlex.split(result.output)[0].split("=", 1)[1])
    assert settings["step_log_dir"] == str(tmp_path / "steps")


def test_cli_exchange_over_redis_names_a_stable_replica() -> None:
    url = "redis://:secret@redis.internal:6379/2?stream=agents&max_entries=500"
    result = CliRunner().invoke(
        _app(), ["serve", "my-model", "--port", "8001", "--agentspec-exchange", url, "--agentspec-dry-run"]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(shlex.split(result.output)[0].split("=", 1)[1])
    # HOST:PORT by default: the same when the server restarts on its machine and port.
    # The password is not printed (the server gets it; the shown line hides it).
    assert settings["exchange_url"] == url.replace(":secret@", ":***@")
    assert settings["replica_id"] == f"{socket.gethostname()}:8001"
    assert "secret" not in result.output
    named = CliRunner().invoke(
        _app(), ["serve", "m", "--agentspec-exchange", url, "--agentspec-replica-id", "gpu7", "--agentspec-dry-run"]
    )
    assert json.loads(shlex.split(named.output)[0].split("=", 1)[1])["replica_id"] == "gpu7"
    # vLLM's default shutdown kills the engine before it sends its queued outputs.
    command = shlex.split(result.output)[1:]
    assert command[command.index("--shutdown-timeout") + 1] == "5"
    own = CliRunner().invoke(
        _app(), ["serve", "m", "--agentspec-exchange", url, "--shutdown-timeout", "0", "--agentspec-dry-run"]
    )
    assert shlex.split(own.output).count("--shutdown-timeout") == 1 and "--shutdown-timeout 0" in own.output
    plain = CliRunner().invoke(_app(), ["serve", "m", "--agentspec-dry-run"])
    assert "--shutdown-timeout" not in plain.output


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "my-model", "--port", "9000"],
        ["--port", "9000", "my-model"],
        ["--port", "9000", "--model=my-model"],
    ],
    ids=["--model first", "positional last", "--model= last"],
)
def test_the_model_comes_first_or_as_model_anywhere(args: list[str]) -> None:
    # vLLM's own parser reads the line, as `vllm serve` would.
    result = CliRunner().invoke(_app(), ["serve", *args, "--agentspec-dry-run"])
    assert result.exit_code == 0, result.output
    command = shlex.split(result.output)
    assert command.count("--model") == 1 and command[command.index("--model") + 1] == "my-model"
    assert command[command.index("--port") + 1] == "9000" and "my-model" not in command[command.index("--port") :]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["m", "--agentspec-bogus", "3"],
            "no such option: --agentspec-bogus (agentspec's options: --agentspec-cost-profile,"
            " --agentspec-draft-budget, --agentspec-drafter,",
        ),
        (["m", "--agentspec-bogus=3"], "no such option: --agentspec-bogus "),
        (["m", "--no-such-vllm-option", "1"], "vLLM's options: unrecognized arguments: --no-such-vllm-option 1"),
        (["m", "--max-model-len"], "vLLM's options: argument --max-model-len: expected one argument"),
        (["--port", "8000"], "no model: give it first (agentspec serve MODEL ...) or as --model MODEL"),
        (["a", "--model", "b"], "two models: 'a' and --model 'b'"),
        (["m", "--agentspec-speed-model", "tpu:8b"], "speed model 'tpu:8b': expected GPU:MODEL with GPU one of"),
        (
            ["m", "--agentspec-drafter", "./no/such/drafter"],
            "--agentspec-drafter: no such model folder: ./no/such/drafter",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--agentspec-drafter-tokens", "0"],
            "--agentspec-drafter-tokens: Input should be greater than or equal to 1, got 0",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--agentspec-drafter-tokens", "33"],
            "--agentspec-drafter-tokens 33 is more than the longest draft (32 tokens)",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--speculative-config", '{"method": "suffix"}'],
            "with --agentspec-drafter the speculative method is draft_model (--agentspec-drafter-method);"
            " --speculative-config has 'suffix'",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--speculative-config", '{"model": "other/drafter"}'],
            "the draft model is --agentspec-drafter's: drop model from --speculative-config",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--speculative-config", '{"num_speculative_tokens": 2}'],
            "num_speculative_tokens must be at least --agentspec-drafter-tokens (4)",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--async-scheduling"],
            "--agentspec-drafter runs without async scheduling: drop --async-scheduling",
        ),
        (
            ["m", "--agentspec-exchange", "http://redis:6379"],
            "--agentspec-exchange: the exchange URL must start with redis://, rediss://, unix://, got 'http://redis:6379'",
        ),
        (
            ["m", "--agentspec-exchange", "redis://:pw@h/0?max_age_s=-1"],
            "--agentspec-exchange: exchange URL parameter max_age_s: Input should be greater than 0",
        ),
        (
            ["m", "--agentspec-exchange", "redis:///0"],
            "--agentspec-exchange: the exchange URL names no host: 'redis:///0'",
        ),
        (
            ["m", "--agentspec-exchange", "redis://h", "--agentspec-exchange-dir", "exchange-folder"],
            "choose one exchange: --agentspec-exchange-dir (one machine) or --agentspec-exchange (Redis)",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--agentspec-step-log-dir", "steps"],
            "--agentspec-step-log-dir logs the index's drafts alone: not with --agentspec-drafter",
        ),
        (
            ["m", "--speculative-config", '{"method": "draft_model", "model": "d"}'],
            "--speculative-config has method 'draft_model'"
            " (for a model drafter beside the index, use --agentspec-drafter)",
        ),
        (
            ["m", "--agentspec-drafter", "org/drafter", "--agentspec-drafter-method", "medusa"],
            "--agentspec-drafter-method: Input should be 'draft_model', 'eagle' or 'eagle3', got medusa",
        ),
        (
            [
                "m",
                "--agentspec-drafter",
                "org/head",
                "--agentspec-drafter-method",
                "eagle3",
                "--speculative-config",
                '{"method": "eagle"}',
            ],
            "with --agentspec-drafter the speculative method is eagle3 (--agentspec-drafter-method);"
            " --speculative-config has 'eagle'",
        ),
        (
            ["m", "--agentspec-drafter-method", "eagle"],
            "--agentspec-drafter-method sets up a model drafter: give --agentspec-drafter MODEL with it",
        ),
        (
            ["m", "--agentspec-drafter-tokens=3"],
            "--agentspec-drafter-tokens sets up a model drafter: give --agentspec-drafter MODEL with it",
        ),
        # Values the settings refuse, each named by its option (never by its field).
        (
            ["m", "--agentspec-full-draft-batch", "-3"],
            "--agentspec-full-draft-batch: Input should be greater than or equal to 1, got -3",
        ),
        (
            ["m", "--agentspec-full-draft-batch", "many"],
            "--agentspec-full-draft-batch: Input should be a valid integer",
        ),
        (
            ["m", "--agentspec-no-draft-batch", "4"],
            "--agentspec-no-draft-batch must be >= --agentspec-full-draft-batch",
        ),
        (
            ["m", "--agentspec-publish-interval", "0"],
            "--agentspec-publish-interval: Input should be greater than 0, got 0",
        ),
        (
            ["m", "--agentspec-index-config", '{"nope": 1}'],
            "--agentspec-index-config: nope: Extra inputs are not permitted",
        ),
        (["m", "--agentspec-index-config", "{nope"], "--agentspec-index-config: not valid JSON"),
        (["m", "--agentspec-replica-id", ""], "--agentspec-replica-id: String should have at least 1 character"),
    ],
)
def test_bad_invocations_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), ["serve", *args, "--agentspec-dry-run"])
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if line.strip()]  # one line, no usage dump
    assert line.startswith("error: agentspec serve: ") and message in line


def test_version_answers_without_vllm() -> None:
    code = "import sys; sys.modules['vllm'] = None\nfrom agentspec.cli import app\napp(['--version'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"agentspec {importlib.metadata.version('vllm-agentspec')}"


def test_dry_run_prints_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentspec.engine.launcher.serve as serve_module

    token = "tok-0123456789abcdef"
    monkeypatch.setattr(serve_module.secrets, "token_hex", lambda n: token)  # the generated admission token
    result = CliRunner().invoke(
        _app(),
        ["serve", "m", "--api-key", "key-one", "key-two", "--port", "8001", "--agentspec-dry-run"],
    )
    assert result.exit_code == 0, result.output
    for secret in (token, "key-one", "key-two"):
        assert secret not in result.output
    command = shlex.split(result.output)
    settings = json.loads(command[0].split("=", 1)[1])
    assert settings["admission_token"] == "***"
    assert command[command.index("--api-key") + 1 : command.index("--api-key") + 3] == ["***", "***"]
    assert command[command.index("--port") + 1] == "8001"  # what follows the keys is kept
    # The server itself gets the real values.
    env = build_env(EngineSettings(admission_token=token), {})
    assert json.loads(env[ENV_CONFIG])["admission_token"] == token


def test_dry_run_masks_a_generated_admission_token() -> None:
    result = CliRunner().invoke(_app(), ["serve", "m", "--api-key=key-one", "--agentspec-dry-run"])
    assert result.exit_code == 0, result.output
    command = shlex.split(result.output)
    assert json.loads(command[0].split("=", 1)[1])["admission_token"] == "***"
    assert "--api-key=***" in command and "key-one" not in result.output


@pytest.mark.parametrize("args", [["-h"], ["bench", "-h"], ["serve", "-h"]], ids=["agentspec", "bench", "serve"])
def test_h_is_help_everywhere(args: list[str]) -> None:
    from agentspec.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output and "No such option" not in result.output
    if args[0] == "serve":
        # agentspec's options, and where vLLM's are listed.
        assert "--agentspec-drafter" in result.output
        assert "agentspec.engine.vllm.launch --help" in result.output


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field of ``model`` by dotted path, a nested model's fields in its place."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        inner = [a for a in getattr(field.annotation, "__args__", (field.annotation,)) if a is not type(None)]
        if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], BaseModel) and name != "index":
            out |= _leaf_fields(inner[0], f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


def test_serve_help_lists_one_option_per_setting() -> None:
    """What ``serve -h`` shows is the settings: every field an option, the admission token
    (a secret drawn per launch) the only exception, and only the dry run besides."""
    from agentspec.cli import app
    from agentspec.engine.launcher.options import setting_options

    result = CliRunner().invoke(app, ["serve", "-h"], env={"COLUMNS": "240"}, terminal_width=240)
    assert result.exit_code == 0, result.output
    shown = set(re.findall(r"(--agentspec-[a-z-]+)", result.output))
    by_flag = {o.flag: ".".join(o.path) for o in setting_options()}
    assert shown == {*by_flag, "--agentspec-dry-run"}
    assert set(by_flag.values()) == _leaf_fields(EngineSettings) - {"admission_token"}
    # Help and defaults are the fields' own.
    assert "Full-length drafts up to this many running requests." in result.output
    assert "[default: 8]" in result.output and "[default: 32768]" in result.output
    # A flag takes no value, so no type follows it.
    (line,) = [line for line in result.output.splitlines() if "--agentspec-share-across-tenants" in line]
    assert "<bool>" not in line and "TEXT" not in line


def test_every_setting_reaches_the_server_from_its_option(tmp_path: Path) -> None:
    args = [
        "serve",
        "m",
        "--agentspec-dry-run",
        "--agentspec-publish-interval",
        "0.5",
        "--agentspec-exchange-interval",
        "2",
        "--agentspec-exchange-step-budget",
        "0.02",
        "--agentspec-index-config",
        '{"max_sessions": 1000}',
        "--agentspec-max-seeds",
        "3",
        "--agentspec-share-across-tenants",
    ]
    result = CliRunner().invoke(_app(), args)
    assert result.exit_code == 0, result.output
    settings = EngineSettings.model_validate_json(
        shlex.split(result.output)[0].split("=", 1)[1].replace('"***"', "null")
    )
    assert settings.publish_interval_s == 0.5 and settings.exchange_interval_s == 2.0
    assert settings.exchange_step_budget_s == 0.02 and settings.max_seeds_per_request == 3
    assert settings.index.max_sessions == 1000 and settings.share_across_tenants
    # Options not given keep the fields' defaults (and are not written out).
    assert '"full_draft_batch"' not in result.output and settings.full_draft_batch == 8


@pytest.mark.parametrize(
    "option",
    [[], ["--agentspec-drafter"]],
    ids=["model", "drafter"],
)
def test_a_missing_model_folder_is_reported_before_vllm_is_imported(tmp_path: Path, option: list[str]) -> None:
    """One line, exit 2, no traceback, and neither vLLM nor torch imported by then: at
    once, not after the minutes vLLM takes to fail on it."""
    missing = str(tmp_path / "no-such-model")
    args = ["serve", "org/model", *option, missing] if option else ["serve", missing, "--port", "8001"]
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print(sorted(m for m in ('vllm', 'torch') if m in sys.modules)))\n"
        "from agentspec.cli import app\n"
        f"app({args!r})\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    prefix = "error: agentspec serve: " + ("--agentspec-drafter: " if option else "")
    assert out.stderr.splitlines() == [f"{prefix}no such model folder: {missing}"]
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("model", "refused"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", False),  # a hub id is never taken for a path
        ("gpt2", False),
        ("models/qwen", False),  # may be a hub id: left to vLLM
        ("/no/such/qwen", True),
        ("./qwen", True),
        ("../qwen", True),
        ("~/qwen", True),
        ("models/qwen/7b", True),  # more than one /: no hub id
        (".", False),  # there
        ("./here", False),
    ],
)
def test_which_models_are_taken_for_paths(
    model: str, refused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentspec.engine.launcher.serve import missing_local_model

    (tmp_path / "cwd" / "here").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert (missing_local_model(model) is not None) is refused
