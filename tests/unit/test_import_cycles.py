"""No import circle among the modules of `worker/` (docs/architecture.md §2): each layer
imports only the ones below it, and a circle is where that stops being true.

The module graph is built from the source with `ast`: every `import` and `from … import`
counts, also one inside a function (a lazy import that closes a circle is still a circle in
the design), except those under `if TYPE_CHECKING:` (annotations only, never run). `from
package import name` is an edge to the submodule when `name` is one, else to the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import worker

ROOT = Path(worker.__file__).parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, package: str) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(module, names imported from it) for every import that runs, TYPE_CHECKING aside."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for other in node.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]), package)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield module, tuple(alias.name for alias in node.names)
        yield from _imports(node, package)


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of the package under `root` and the modules of it that it imports."""
    paths = {_module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for module, names in _imports(ast.parse(path.read_text()), package):
            submodules = {f"{module}.{n}" for n in names if f"{module}.{n}" in paths}
            edges |= submodules
            if module in paths and (not names or len(submodules) < len(names)):
                edges.add(module)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import circle as `[a, b, …, a]`, or None (depth-first, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if start in state:
            continue
        path = [start]
        state[start] = 1
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_no_import_circle_among_worker_modules() -> None:
    cycle = find_cycle(module_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_graph_is_the_real_one() -> None:
    """A parser that missed imports would make the check above vacuous."""
    graph = module_graph()
    assert len(graph) > 200
    assert "worker.pipeline.pipeline" in graph["worker.app"]
    # A lazy import inside a function counts; an annotation-only one does not.
    assert "worker.trust.gate" in graph["worker.wiring"]
    assert "worker.execution.chunk_stream" not in graph["worker.execution.context"]
    # `from package import submodule` is an edge to the submodule.
    assert "worker.operator.provider" in graph["worker.operator.cancel"]


def test_a_circle_is_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_an_import_under_type_checking_is_not_an_edge(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
    )
    (package / "b.py").write_text("def f():\n    from pkg.a import x\n")
    graph = module_graph(package)
    assert graph["pkg.a"] == set()
    assert graph["pkg.b"] == {"pkg.a"}
