"""The pipeline knows operations only through their protocol (worker/operations/base.py):
none of its modules imports the operator's or the delegation's code, so what it must know of
one operation in particular cannot creep back in beside the protocol."""

from __future__ import annotations

import ast
from pathlib import Path

import worker

ROOT = Path(worker.__file__).parent
#: The pipeline and what it runs every execution with.
PIPELINE = [
    *sorted((ROOT / "pipeline").glob("*.py")),
    ROOT / "execution" / "context.py",
    ROOT / "execution" / "chunk_stream.py",
    ROOT / "execution" / "leases.py",
]
#: Operation-specific code, and the outputs the wiring registers with the Outbox.
FORBIDDEN = (
    "worker.operator",
    "worker.delegation",
    "worker.store.operator_store",
    "worker.channel",
    "worker.escalation",
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_no_pipeline_module_imports_operation_specific_code() -> None:
    assert len(PIPELINE) > 8
    crossing = {
        f"{path.relative_to(ROOT.parent)}: {name}"
        for path in PIPELINE
        for name in _imports(path)
        if name.startswith(FORBIDDEN)
    }
    assert crossing == set()


def test_the_forbidden_names_are_real_modules() -> None:
    """A renamed package would make the check above vacuous."""
    for name in FORBIDDEN:
        assert (ROOT.parent / (name.replace(".", "/") + ".py")).exists() or (
            ROOT.parent / name.replace(".", "/")
        ).is_dir(), name
