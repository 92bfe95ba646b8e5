"""The vLLM internals agentspec's plugin and proposer rely on, pinned in one fast test.

:mod:`agentspec.engine.vllm` (the plugin, the runner's patch, the proposers) reads private parts of
vLLM's V1 model runner. A vLLM upgrade that moves or renames one of them should fail here,
in seconds and naming the part, rather than as a wrong result in a server test.

How each part is checked, cheapest reliable way first: a class attribute, method or
property by looking it up; a dataclass field with :func:`dataclasses.fields`; an attribute
set in ``__init__`` by the source of ``__init__`` (``self.<name> =``); how vLLM calls the
proposer by the source of the call site. Every check compares with explicit names.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed: the vLLM contract applies only where it is")

from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer  # noqa: E402
from vllm.v1.worker import gpu_model_runner  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402

from agentspec.engine.vllm import import_hook, plugin  # noqa: E402
from agentspec.engine.vllm import runner as runner_patch  # noqa: E402
from agentspec.engine.vllm.proposers import AgentspecProposer  # noqa: E402


def _params(func: Any) -> list[str]:
    # unwrap: the plugin's wrapper (functools.wraps) or vLLM's decorators stand in front.
    return list(inspect.signature(inspect.unwrap(func)).parameters)


def _set_in_init(cls: type, name: str) -> bool:
    """Whether ``cls.__init__`` assigns ``self.<name>`` (annotated or not)."""
    source = inspect.getsource(inspect.unwrap(cls.__init__))
    return re.search(rf"^\s*self\.{re.escape(name)}\s*(:[^=\n]*)?=[^=]", source, re.MULTILINE) is not None


def _dataclass_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# ---------------------------------------------------------------------- the runner (engine.vllm.runner)


def test_runner_module_path_is_the_one_the_plugin_hooks() -> None:
    assert gpu_model_runner.__name__ == runner_patch.RUNNER_MODULE


def test_runner_update_states_signature() -> None:
    # The plugin wraps it and reads scheduler_output before calling the original.
    assert _params(GPUModelRunner._update_states) == ["self", "scheduler_output"]


def test_runner_module_global_suffix_proposer() -> None:
    # The plugin swaps this module global; the runner must look it up there at run time.
    if getattr(gpu_model_runner, import_hook.PATCHED_ATTR, False):  # patched in this process
        assert gpu_model_runner.SuffixDecodingProposer is AgentspecProposer
    else:
        assert gpu_model_runner.SuffixDecodingProposer is SuffixDecodingProposer


def test_runner_attributes_set_in_init() -> None:
    # _update_states' wrapper reads self.drafter, self.requests and self.vllm_config.
    for name in ("drafter", "requests", "vllm_config"):
        assert _set_in_init(GPUModelRunner, name), f"GPUModelRunner.__init__ no longer sets self.{name}"


def test_override_accepts_the_runners_call() -> None:
    # How the runner calls it (three positional, slot_mappings by name) is read from its
    # source, installed and in the wheels of the surface-checked releases, in test_vllm_surface.
    inspect.signature(AgentspecProposer.propose).bind(None, 3, object(), [[1]], slot_mappings=None)


def test_cpu_runner_inherits_the_patched_method() -> None:
    cpu = pytest.importorskip(
        "vllm.v1.worker.cpu_model_runner", reason="this vLLM build has no CPU runner", exc_type=ImportError
    )
    assert issubclass(cpu.CPUModelRunner, GPUModelRunner)
    # An override of its own would bypass the wrapper the plugin puts on GPUModelRunner.
    between = cpu.CPUModelRunner.__mro__[: cpu.CPUModelRunner.__mro__.index(GPUModelRunner)]
    assert [c.__name__ for c in between if "_update_states" in vars(c)] == []


def test_scheduler_output_fields() -> None:
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    # Dataclasses: their fields are the contract.
    assert {"finished_req_ids", "scheduled_new_reqs"} <= _dataclass_fields(SchedulerOutput)
    assert {"req_id", "sampling_params"} <= _dataclass_fields(NewRequestData)


def test_parallel_config_and_distributed_helpers() -> None:
    from vllm.config import ParallelConfig, VllmConfig
    from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.distributed.parallel_state import GroupCoordinator

    assert {"parallel_config", "speculative_config", "model_config"} <= _dataclass_fields(VllmConfig)
    assert {"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_rank"} <= _dataclass_fields(ParallelConfig)
    for func in (get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size):
        assert _params(func) == [], func.__name__
    assert _set_in_init(GroupCoordinator, "world_size")


# ---------------------------------------------------------------------- the proposer (engine.vllm.proposers)


def test_suffix_proposer_signatures() -> None:
    assert _params(SuffixDecodingProposer.__init__) == ["self", "vllm_config"]
    assert _params(SuffixDecodingProposer.propose) == [
        "self",
        "num_speculative_tokens",
        "input_batch",
        "sampled_token_ids",
        "slot_mappings",
    ]


def test_override_matches_the_parent_signatures() -> None:
    parent = inspect.signature(SuffixDecodingProposer.propose).parameters
    child = inspect.signature(AgentspecProposer.propose).parameters
    assert [(p.name, p.kind, p.default) for p in child.values()] == [
        (p.name, p.kind, p.default) for p in parent.values()
    ]
    # The runner builds it as the parent: SuffixDecodingProposer(vllm_config); extra ones are optional.
    parent_init = list(inspect.signature(SuffixDecodingProposer.__init__).parameters.values())
    child_init = list(inspect.signature(AgentspecProposer.__init__).parameters.values())
    assert [p.name for p in child_init[: len(parent_init)]] == [p.name for p in parent_init]
    assert all(p.default is not inspect.Parameter.empty for p in child_init[len(parent_init) :])


def test_suffix_proposer_methods() -> None:
    # AgentspecProposer skips the parent's __init__ (no arctic-inference cache): a new parent
    # method the runner calls could read state that was never set. Review it, then add it.
    methods = {name for name, value in vars(SuffixDecodingProposer).items() if callable(value)}
    assert methods == {"__init__", "propose", "load_model"}


def test_speculative_and_model_config_fields() -> None:
    from vllm.config import ModelConfig, SpeculativeConfig

    assert {
        "method",
        "num_speculative_tokens",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
    } <= _dataclass_fields(SpeculativeConfig)
    assert "max_model_len" in _dataclass_fields(ModelConfig)


def test_input_batch_fields() -> None:
    from vllm.v1.worker.gpu_input_batch import InputBatch

    # req_ids is a property; the token arrays are set in __init__ (numpy views of CPU tensors).
    assert isinstance(inspect.getattr_static(InputBatch, "req_ids"), property)
    for name in ("num_tokens_no_spec", "num_prompt_tokens", "token_ids_cpu"):
        assert _set_in_init(InputBatch, name), f"InputBatch.__init__ no longer sets self.{name}"


def test_sampling_params_fields() -> None:
    from vllm import SamplingParams

    # A msgspec struct with a property (eos_token_id): build one and read what the proposer reads.
    params = SamplingParams(max_tokens=5, stop_token_ids=[7], extra_args={"session_id": "s"})
    assert params.extra_args == {"session_id": "s"}
    assert params.max_tokens == 5
    assert params.stop_token_ids == [7]
    assert params.eos_token_id is None


# ---------------------------------------------------------------------- runner selection (V1 vs V2)


def test_v2_runner_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import envs

    # plugin.check_model_runner reads this variable through vllm.envs.
    assert plugin.V2_RUNNER_ENV in envs.environment_variables
    monkeypatch.delenv(plugin.V2_RUNNER_ENV, raising=False)
    assert envs.VLLM_USE_V2_MODEL_RUNNER is None  # unset: the config decides
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "0")
    assert envs.VLLM_USE_V2_MODEL_RUNNER is False
    monkeypatch.setenv(plugin.V2_RUNNER_ENV, "1")
    assert envs.VLLM_USE_V2_MODEL_RUNNER is True


def test_runner_choice_follows_the_config_property() -> None:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_worker import Worker

    assert isinstance(inspect.getattr_static(VllmConfig, "use_v2_model_runner"), property)
    assert "envs.VLLM_USE_V2_MODEL_RUNNER" in inspect.getsource(VllmConfig.use_v2_model_runner.fget)
    # With the variable unset, V2 is not chosen for method "suffix": the env check suffices.
    assert '"suffix"' in inspect.getsource(VllmConfig._get_v2_model_runner_unsupported_features)
    # The worker takes the choice from that property and builds V1 from the module patched.
    assert "self.use_v2_model_runner = vllm_config.use_v2_model_runner" in inspect.getsource(Worker.__init__)
    make = inspect.getsource(Worker._make_model_runner)
    assert "if self.use_v2_model_runner:" in make
    assert f"from {runner_patch.RUNNER_MODULE} import GPUModelRunner" in make


def test_cpu_worker_runner_choice() -> None:
    cpu = pytest.importorskip(
        "vllm.v1.worker.cpu_worker", reason="this vLLM build has no CPU worker", exc_type=ImportError
    )
    from vllm.v1.worker.gpu_worker import Worker

    # Same flag (inherited from Worker.__init__); V1 is cpu_model_runner.CPUModelRunner.
    assert issubclass(cpu.CPUWorker, Worker)
    assert "__init__" not in vars(cpu.CPUWorker) or "super().__init__(" in inspect.getsource(cpu.CPUWorker.__init__)
    source = inspect.getsource(cpu.CPUWorker.init_device)
    assert "if self.use_v2_model_runner:" in source
    assert "CPUModelRunner(self.vllm_config" in source
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert cpu.CPUModelRunner is CPUModelRunner


# ---------------------------------------------------------------------- hybrid drafting (engine.vllm.proposers)


def test_runner_module_global_draft_model_proposer() -> None:
    # Swapped like the suffix proposer; the runner builds it as (vllm_config, device, runner).
    from vllm.v1.spec_decode.draft_model import DraftModelProposer
    from vllm.v1.spec_decode.eagle import EagleProposer

    from agentspec.engine.vllm.proposers import HybridEagleProposer, HybridProposer

    source = inspect.getsource(GPUModelRunner.__init__)
    for parent, child_cls in ((DraftModelProposer, HybridProposer), (EagleProposer, HybridEagleProposer)):
        assert f"self.drafter = {parent.__name__}(" in source
        assert issubclass(child_cls, parent)
        child = list(inspect.signature(child_cls.__init__).parameters.values())
        assert [p.name for p in child[:4]] == _params(parent.__init__) == ["self", "vllm_config", "device", "runner"]
        assert all(p.default is not inspect.Parameter.empty for p in child[4:])
        # Neither overrides the base's propose, which the hybrid calls for the model's passes.
        assert "propose" not in vars(parent)


def test_runner_calls_the_draft_model_proposer_as_the_hybrid_expects() -> None:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    # The plugin wraps propose_draft_token_ids and reads its second argument.
    assert _params(GPUModelRunner.propose_draft_token_ids)[:3] == ["self", "scheduler_output", "sampled_token_ids"]
    source = inspect.getsource(GPUModelRunner.propose_draft_token_ids)
    # Every argument by keyword (the hybrid's propose takes **kwargs after the first).
    assert "self.drafter.propose(\n                num_speculative_tokens=num_spec_tokens_to_schedule," in source
    # A draft length of 0 runs only the first pass (the draft KV cache of verified tokens).
    base = inspect.getsource(SpecDecodeBaseProposer.propose)
    assert "if self.num_speculative_tokens == 0:" in base
    assert _set_in_init(SpecDecodeBaseProposer, "_last_draft_probs")
    # Where the plugin reads the step's tokens as vLLM's bookkeeping does.
    assert _set_in_init(GPUModelRunner, "discard_request_mask")
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    assert _params(RejectionSampler.parse_output)[:3] == ["output_token_ids", "vocab_size", "discard_req_indices"]
    # A list of drafts per request is taken as it is (synchronous scheduling).
    assert "if isinstance(self._draft_token_ids, list):" in inspect.getsource(GPUModelRunner._get_draft_token_ids_cpu)


# ---------------------------------------------------------------------- what only CUDA runs


def _async_default_disabled_for(method: str) -> bool:
    """Evaluate vLLM's own condition for turning async scheduling off by default for a
    speculative method (``VllmConfig``'s ``async_scheduling is None`` branch), read from
    its source. On CPU the platform forces async off first, so this is how the CUDA
    default can be seen here."""
    import ast
    from types import SimpleNamespace

    from vllm.config import vllm as vllm_config_module

    tree = ast.parse(inspect.getsource(vllm_config_module))
    branch = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "self.scheduler_config.async_scheduling is None"
    )
    # The elif chain under it: the branch whose test reads the speculative method.
    node = branch.body[0]
    while isinstance(node, ast.If) and "speculative_config.method" not in ast.unparse(node.test):
        node = node.orelse[0]
    assert isinstance(node, ast.If), "vLLM's async default no longer depends on the speculative method"
    spec = SimpleNamespace(method=method, disable_padded_drafter_batch=False)
    this = SimpleNamespace(speculative_config=spec)
    return bool(
        eval(
            compile(ast.Expression(node.test), "<vllm async default>", "eval"), vars(vllm_config_module), {"self": this}
        )
    )


def test_async_scheduling_defaults_on_for_the_hybrids_methods() -> None:
    # vLLM turns async scheduling on by default for draft_model and EAGLE (on CUDA), where
    # the hybrid's list drafts would trip its tensor assertion: why the patched runner
    # refuses async under the hybrid (test_runner_pin) and serve passes --no-async-scheduling.
    assert _async_default_disabled_for("suffix") is True
    for method in ("draft_model", "eagle", "eagle3"):
        assert _async_default_disabled_for(method) is False, method


def test_data_parallel_engines_keep_their_index_after_the_rank_reset() -> None:
    # vLLM runs each data-parallel engine of a dense model as an independent DP=1 engine and
    # resets its rank to 0; agentspec names engines by data_parallel_index, which survives.
    from vllm.config import ParallelConfig

    from agentspec.engine.worker.drafting import data_parallel_index

    config = ParallelConfig(data_parallel_size=2, data_parallel_rank=1)
    config.reconfigure_for_independent_dp_rank()
    assert (config.data_parallel_rank, config.data_parallel_size) == (0, 1)
    assert data_parallel_index(config) == 1


def test_full_cudagraph_sizes_for_serves_draft_length() -> None:
    # Under FULL decode graphs the V1 runner rounds capture sizes to multiples of 1 + K. With
    # serve's K = 32 and vLLM's default 512-token ceiling, graphs cover at most 15 decoding
    # requests (docs/engine.md, "Running on GPUs", says how to raise the ceiling).
    from vllm.config.compilation import CompilationConfig

    from agentspec.engine.launcher.serve import default_speculative_config

    k = default_speculative_config()["num_speculative_tokens"]
    assert k == 32
    grid = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]  # vLLM's default grid to 512
    config = CompilationConfig(cudagraph_capture_sizes=grid, max_cudagraph_capture_size=512)
    config.adjust_cudagraph_sizes_for_spec_decode(k + 1)
    assert config.cudagraph_capture_sizes == [33 * n for n in range(1, 16)]
    # With the ceiling at 32 requests' worth (1056 tokens), they cover 32.
    config = CompilationConfig(
        cudagraph_capture_sizes=[*grid, *range(528, 1057, 16), 1056], max_cudagraph_capture_size=1056
    )
    config.adjust_cudagraph_sizes_for_spec_decode(k + 1)
    assert max(config.cudagraph_capture_sizes) == 33 * 32
