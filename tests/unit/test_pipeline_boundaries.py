"""The pipeline knows operations only through their protocol (worker/operations/base.py):
none of its modules imports the operator's or the delegation's code, so what it must know of
one operation in particular cannot creep back in beside the protocol. Nor does it import
channel or escalation code: what a settle owes them is an output the wiring registers with
the outbox, so a new output never needs a change in the pipeline."""

from __future__ import annotations

import ast
from pathlib import Path

import worker

ROOT = Path(worker.__file__).parent
#: The pipeline and what it runs every execution with.
PIPELINE = [
    *sorted((ROOT / "pipeline").glob("*.py")),
    *sorted((ROOT / "execution").glob("*.py")),
]
FORBIDDEN = ("worker.operator", "worker.delegation", "worker.store.operator_store")
#: What the settle publishes besides the result reaches the pipeline through the outbox.
OUTPUTS = ("worker.channel", "worker.escalation")


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
    assert _crossing(FORBIDDEN) == set()


def _crossing(forbidden: tuple[str, ...]) -> set[str]:
    return {
        f"{path.relative_to(ROOT.parent)}: {name}"
        for path in PIPELINE
        for name in _imports(path)
        if name.startswith(forbidden)
    }


def test_no_pipeline_module_imports_channel_or_escalation_code() -> None:
    assert _crossing(OUTPUTS) == set()


def test_the_forbidden_names_are_real_modules() -> None:
    """A renamed package would make the checks above vacuous."""
    for name in (*FORBIDDEN, *OUTPUTS):
        assert (ROOT.parent / (name.replace(".", "/") + ".py")).exists() or (
            ROOT.parent / name.replace(".", "/")
        ).is_dir(), name
