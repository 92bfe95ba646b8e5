"""The table of vLLM's parts (agentspec.engine.vllm_surface) against real vLLM sources.

Three sources: the vLLM installed here (imported), the same files read statically, and
the wheels of releases that cannot be imported here (vLLM 0.33's CUDA build), read from
the zip that ``scripts/fetch_vllm_wheels.sh`` downloads. A fake source tree shows the
static check can fail, part kind by part kind.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentspec.engine.vllm import surface as vllm_surface
from agentspec.engine.vllm.surface import Part, check_sources, sources_of_directory, sources_of_wheel

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".cache" / "vllm-wheels"


def _wheel(release: str) -> Path:
    found = sorted(WHEELS.glob(f"vllm-{release}-*.whl"))
    if not found:
        pytest.skip(f"no vLLM {release} wheel in {WHEELS.relative_to(ROOT)}: run scripts/fetch_vllm_wheels.sh")
    return found[0]


# ---------------------------------------------------------------------- the table covers agentspec


def _vllm_imports() -> set[tuple[str, str]]:
    """``(module, name)`` for every ``from vllm... import name`` in agentspec's package."""
    found = set()
    for file in (ROOT / "agentspec").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
                found.update((node.module, alias.name) for alias in node.names)  # type: ignore[misc]
    return found


def _runtime_imports_of_vllm(file: Path) -> list[int]:
    """Lines of ``file`` that import vLLM when run (imports for type checkers excluded)."""
    tree = ast.parse(file.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    lines = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names):
            lines.append(node.lineno)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm":
            lines.append(node.lineno)
    return lines


#: The one module outside agentspec.engine.vllm allowed to import vLLM: the test servers'
#: probe of whether vLLM imports at all (it reads nothing of vLLM's).
_PROBES_ONLY = {"agentspec/testing/pytest_plugin.py"}


def test_only_the_vllm_package_imports_vllm() -> None:
    package = ROOT / "agentspec" / "engine" / "vllm"
    outside = {
        f"{file.relative_to(ROOT).as_posix()}:{line}"
        for file in (ROOT / "agentspec").rglob("*.py")
        if package not in file.parents
        for line in _runtime_imports_of_vllm(file)
    }
    assert {entry.partition(":")[0] for entry in outside} <= _PROBES_ONLY, sorted(outside)
    # The scan finds imports: the package itself has them.
    assert _runtime_imports_of_vllm(package / "proposers.py")


def test_every_vllm_import_of_agentspec_is_in_the_table() -> None:
    paths = {path for p in vllm_surface.SURFACE for path in p.paths}
    modules = {path.partition(":")[0] for path in paths}
    imports = _vllm_imports()
    assert imports, "found no vLLM imports at all: the scan is broken"
    # `from vllm.a import b` is covered by a part at vllm.a:b, or by parts in module vllm.a.b.
    uncovered = sorted(f"{m}:{n}" for m, n in imports if f"{m}:{n}" not in paths and f"{m}.{n}" not in modules)
    assert uncovered == []


def test_plugin_hooks_the_modules_the_table_names() -> None:
    from agentspec.engine.vllm import plugin, workers
    from agentspec.engine.vllm import runner as runner_patch

    assert runner_patch.RUNNER_MODULE == "vllm.v1.worker.gpu_model_runner" == vllm_surface.module_of("runner_module")
    assert workers.CPU_WORKER_MODULE == vllm_surface.module_of("cpu_worker_module")
    assert plugin.SUPPORTED_VLLM_SERIES == vllm_surface.SUPPORTED_VLLM_SERIES == ("0.32", "0.33", "0.34")
    assert {vllm_surface.runner_of(s) for s in ("0.32.0", "0.33.0")} == {"v1"}
    assert vllm_surface.runner_of("0.34.0+cpu") == "v2"


def test_keys_are_unique_and_paths_well_formed() -> None:
    keys = [p.key for p in vllm_surface.SURFACE]
    assert len(keys) == len(set(keys))
    for p in vllm_surface.SURFACE:
        for path in p.paths:
            module, _, qual = path.partition(":")
            assert module.startswith("vllm"), path
            assert (qual == "") == (p.kind == "module"), path
            assert len(qual.split(".")) == (2 if p.kind in ("member", "init_attr") else 1) or p.kind == "module", path


def test_unknown_key_is_named() -> None:
    with pytest.raises(KeyError, match="no vLLM part 'nope'"):
        vllm_surface.part("nope")


# ---------------------------------------------------------------------- the static check, on a fake tree

_FAKE = {
    "vllm/__init__.py": "",
    "vllm/envs.py": 'environment_variables = {"VLLM_THING": lambda: 1}\n',
    "vllm/pkg/__init__.py": "from .inner import *\nfrom vllm.other import imported_name\n",
    "vllm/pkg/inner.py": (
        "def starred():\n    pass\n"
        "class Runner:\n"
        "    field: int\n"
        "    def __init__(self):\n        self.drafter = None\n        self.typed: int = 0\n"
        "    def load(self):\n        self.late = 1\n"
        "    @property\n    def prop(self):\n        return 1\n"
        "    def method(self):\n        local = 2\n"
    ),
    "vllm/other.py": "imported_name = 1\n",
}


@pytest.fixture
def fake_tree(tmp_path: Path) -> vllm_surface.Sources:
    for name, text in _FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return sources_of_directory(tmp_path)


@pytest.mark.parametrize(
    ("kind", "path", "present"),
    [
        ("module", "vllm.pkg.inner", True),
        ("module", "vllm.pkg.gone", False),
        ("name", "vllm.pkg.inner:Runner", True),
        ("name", "vllm.pkg:starred", True),  # through `from .inner import *`
        ("name", "vllm.pkg:imported_name", True),
        ("name", "vllm.pkg:gone", False),
        ("member", "vllm.pkg.inner:Runner.method", True),
        ("member", "vllm.pkg.inner:Runner.prop", True),
        ("member", "vllm.pkg.inner:Runner.field", True),
        ("member", "vllm.pkg.inner:Runner.drafter", False),  # set in __init__, not a member
        ("member", "vllm.pkg.inner:Gone.method", False),
        ("init_attr", "vllm.pkg.inner:Runner.drafter", True),
        ("init_attr", "vllm.pkg.inner:Runner.typed", True),
        ("init_attr", "vllm.pkg.inner:Runner.late", True),
        ("init_attr", "vllm.pkg.inner:Runner.local", False),  # a local variable, not on self
        ("env", "vllm.envs:VLLM_THING", True),
        ("env", "vllm.envs:VLLM_GONE", False),
    ],
)
def test_static_check_by_kind(
    fake_tree: vllm_surface.Sources, kind: vllm_surface.Kind, path: str, present: bool
) -> None:
    missing = check_sources(fake_tree, [Part("k", (path,), kind, "tests")])
    assert missing == ({} if present else {"k": f"none of {path} ({kind})"})


def test_a_moved_part_is_present_on_either_path(fake_tree: vllm_surface.Sources) -> None:
    moved = Part("k", ("vllm.new_home:Runner", "vllm.pkg.inner:Runner"), "name", "tests")
    assert check_sources(fake_tree, [moved]) == {}
    gone = Part("k", ("vllm.new_home:Runner", "vllm.old_home:Runner"), "name", "tests")
    assert check_sources(fake_tree, [gone]) == {"k": "none of vllm.new_home:Runner, vllm.old_home:Runner (name)"}


# ---------------------------------------------------------------------- the installed vLLM


def test_installed_vllm_has_every_part() -> None:
    pytest.importorskip("vllm")
    assert vllm_surface.check_installed() == {}


def test_installed_vllm_files_have_every_part() -> None:
    # The static check on files whose live check passes: it agrees.
    pytest.importorskip("vllm")
    assert check_sources(vllm_surface._installed_sources(), vllm_surface.installed_parts()) == {}


def test_installed_check_reports_a_missing_part() -> None:
    pytest.importorskip("vllm")
    bogus = [
        Part("a", ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.no_such_method",), "member", "tests"),
        Part("b", ("vllm.no_such_module",), "module", "tests"),
        Part("c", ("vllm.v1.worker.gpu_model_runner:GPUModelRunner.no_such_attr",), "init_attr", "tests"),
    ]
    assert set(vllm_surface.check_installed(bogus)) == {"a", "b", "c"}


def test_load_takes_the_path_this_vllm_has() -> None:
    pytest.importorskip("vllm")
    import vllm

    make_arg_parser = vllm_surface.load("make_arg_parser")
    # 0.33 moved it; the table lists both homes, and this vLLM's is found.
    expected = {
        "0.32": "vllm.entrypoints.launchers.cli_args",
        "0.33": "vllm.entrypoints.common.cli_args",
        "0.34": "vllm.entrypoints.common.cli_args",
    }
    assert make_arg_parser.__module__ == expected[vllm_surface.series_of(vllm.__version__)]


def test_load_error_names_every_path(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = Part("gone", ("vllm_gone_a:f", "vllm_gone_b:f"), "name", "tests")
    monkeypatch.setitem(vllm_surface._BY_KEY, "gone", gone)
    with pytest.raises(ImportError, match=r"none of vllm_gone_a:f, vllm_gone_b:f; agentspec supports vLLM 0\.32\.x"):
        vllm_surface.load("gone")


# ---------------------------------------------------------------------- releases read from their wheels


@pytest.mark.parametrize("release", vllm_surface.SURFACE_CHECKED_RELEASES)
def test_surface_checked_release_has_every_part(release: str) -> None:
    assert check_sources(sources_of_wheel(_wheel(release)), vllm_surface.parts_of(release)) == {}


def test_each_part_belongs_to_a_runner_and_v2_lacks_the_v1_runner() -> None:
    v1, v2 = vllm_surface.parts_of("0.32.0"), vllm_surface.parts_of("0.34.0")
    assert {p.key for p in v1} | {p.key for p in v2} == {p.key for p in vllm_surface.SURFACE}
    assert "runner._update_states" in {p.key for p in v1} - {p.key for p in v2}
    assert {"register_speculative_method", "v2_runner.add_requests"} <= {p.key for p in v2} - {p.key for p in v1}


@pytest.mark.parametrize("hidden", ["register_speculative_method", "v2_runner.add_requests", "BaseSpeculator"])
def test_a_v2_release_without_a_name_agentspec_needs_fails_the_check(hidden: str) -> None:
    # vLLM 0.34's CUDA wheel, with the module holding one V2 part agentspec needs taken away.
    sources = sources_of_wheel(_wheel("0.34.0"))
    module = vllm_surface.part(hidden).paths[0].partition(":")[0]
    assert check_sources(sources, vllm_surface.parts_of("0.34.0")) == {}
    real_tree = sources.tree
    sources.tree = lambda name: None if name == module else real_tree(name)  # type: ignore[method-assign]
    assert hidden in check_sources(sources, vllm_surface.parts_of("0.34.0"))


def _installed_runner() -> str:
    import vllm

    return vllm_surface.runner_of(str(vllm.__version__))


def _runner_sources() -> list[object]:
    cases: list[object] = [pytest.param("installed", id="installed")]
    cases += [pytest.param(r, id=r) for r in vllm_surface.SURFACE_CHECKED_RELEASES if vllm_surface.runner_of(r) == "v1"]
    return cases


def _runner_text(which: str) -> str:
    module = vllm_surface.module_of("runner_module")
    if which == "installed":
        pytest.importorskip("vllm")
        if _installed_runner() != "v1":
            pytest.skip("the installed vLLM has no V1 runner (vLLM 0.34 removed it)")
        sources = vllm_surface._installed_sources()
    else:
        sources = sources_of_wheel(_wheel(which))
    tree = sources.tree(module)
    assert tree is not None
    return ast.unparse(tree)


@pytest.mark.parametrize("which", _runner_sources())
def test_runner_builds_the_suffix_drafter_from_the_module_global(which: str) -> None:
    # The plugin swaps the module global; the runner must construct it by that name.
    source = _runner_text(which)
    assert "method == 'suffix'" in source
    assert "self.drafter = SuffixDecodingProposer(self.vllm_config)" in source


@pytest.mark.parametrize("which", _runner_sources())
def test_runner_calls_propose_as_the_override_accepts(which: str) -> None:
    source = _runner_text(which)
    # The call in the suffix branch: no other branch (elif/else) between the test and the call.
    call = re.search(
        r"method == 'suffix':(?:(?!\belif\b|\belse\b).)*?self\.drafter\.propose\((.*?)\)", source, re.DOTALL
    )
    assert call is not None, "the runner's suffix branch no longer calls self.drafter.propose"
    args = [a.strip() for a in call.group(1).split(",") if a.strip()]
    assert args == [
        "num_spec_tokens_to_schedule",
        "self.input_batch",
        "sampled_token_ids",
        "slot_mappings=slot_mappings",
    ]
