"""No runtime import cycle anywhere in agentspec: between its modules, the imports that run
(lazy ones inside functions included, those under ``TYPE_CHECKING`` left out, as the import
contracts in pyproject.toml read them) form no loop. Type-only circles, such as the
client's ``attempts`` and ``router``, are fine: they never run."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (or a node importing
    itself), each sorted: Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["a"]}) == [["a"]]
    assert cycles({"a": ["b"], "b": []}) == []


def test_no_runtime_import_cycle_between_agentspecs_modules() -> None:
    graph = grimp.build_graph("agentspec", exclude_type_checking_imports=True)
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules if m.startswith("agentspec")}
    # A package's __init__ importing its own modules, which import names back from the
    # package, is how Python packages re-export: not a loop between modules.
    edges = {
        m: {t for t in targets if t.startswith("agentspec") and not _is_reexport(m, t)}
        for m, targets in imports.items()
    }
    assert cycles(edges) == []


def _is_reexport(module: str, target: str) -> bool:
    """``module`` is a package's module importing that package (its ``__init__``)."""
    return module.startswith(target + ".")
