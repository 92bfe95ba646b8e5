"""What agentspec's V2 speculator relies on in Model Runner V2's code, read in vLLM 0.34's
CUDA wheel (``scripts/fetch_vllm_wheels.sh``): how the runner calls a speculator, and that
it hands the speculator its request states. The speculator's signature is read from our
own source, so neither side needs vLLM 0.34 installed."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from agentspec.engine.vllm import surface

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".cache" / "vllm-wheels"


def _tree(module: str) -> ast.Module:
    found = sorted(WHEELS.glob("vllm-0.34.0-*.whl"))
    if not found:
        pytest.skip(f"no vLLM 0.34.0 wheel in {WHEELS.relative_to(ROOT)}: run scripts/fetch_vllm_wheels.sh")
    tree = surface.sources_of_wheel(found[0]).tree(module)
    assert tree is not None, module
    return tree


def _our_method(name: str) -> ast.FunctionDef:
    tree = ast.parse((ROOT / "agentspec/engine/vllm/speculator.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AgentspecSpeculator")
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _our_propose() -> inspect.Signature:
    fn = _our_method("propose")
    args = fn.args.args
    first_default = len(args) - len(fn.args.defaults)
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [
        inspect.Parameter(a.arg, kind, default=None if i >= first_default else inspect.Parameter.empty)
        for i, a in enumerate(args)
    ]
    return inspect.Signature(params)


def test_the_runner_calls_propose_as_the_speculator_takes_it() -> None:
    tree = _tree(surface.module_of("v2_runner_module"))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "self.speculator.propose" and len(n.args) > 3
    ]
    assert calls, "the runner's step no longer calls self.speculator.propose"
    ours = _our_propose()
    for call in calls:
        # Binding fails when vLLM passes more positional arguments, or a keyword we lack.
        ours.bind(None, *call.args, **{k.arg: k.value for k in call.keywords if k.arg})


def test_the_runner_tells_the_speculator_of_finished_requests_before_freeing_them() -> None:
    tree = _tree(surface.module_of("v2_runner_module"))
    finish = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "finish_requests")
    text = ast.unparse(finish)
    assert text.index("self.speculator.on_requests_finished") < text.index("self._remove_request")


def test_init_speculator_passes_req_states_to_a_constructor_that_takes_them() -> None:
    text = ast.unparse(_tree("vllm.v1.worker.gpu.spec_decode"))
    assert "'req_states' in inspect.signature(factory).parameters" in text
    assert "factory(vllm_config, device, req_states=req_states)" in text
    assert [a.arg for a in _our_method("__init__").args.args][:4] == ["self", "vllm_config", "device", "req_states"]
