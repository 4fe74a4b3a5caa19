"""Every exception lives in an errors module, and each module's page shows its real tree.

`worker/errors.py` holds every exception of the worker and `schemas/errors.py` the wire
layer's two (`schemas/` and `subjects/` import nothing from `worker/`); the self-contained
AIP 1.0 signing package keeps its own small tree in `worker/aip/errors.py`. Each module's
docstring draws the hierarchy with what every class decides (retryable, uncertain); these
tests keep that page and the code from drifting apart, and keep new exceptions from
scattering again.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import pytest

import schemas
import schemas.errors
import subjects
import worker
import worker.aip.errors
import worker.errors

ERROR_MODULES = ("worker.errors", "schemas.errors", "worker.aip.errors")
#: Packages whose exceptions are their own business: the test harness and the demo.
OUTSIDE = ("worker.testing", "worker.demo", "worker.__main__")
#: The docstring's roots: Python's own classes, drawn at the left margin of the tree.
ROOTS = frozenset({"Exception", "ValueError", "RuntimeError"})
#: One line of the tree: four spaces, two per level, then the class name.
_TREE_LINE = re.compile(r"^    (?P<indent>(?:  ){0,3})(?P<name>[A-Z][A-Za-z]+)\b")


def _modules() -> list[ModuleType]:
    found = []
    for package in (worker, schemas, subjects):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.startswith(OUTSIDE):
                found.append(importlib.import_module(info.name))
    return found


def _exceptions(module: ModuleType) -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, BaseException)
        and obj.__module__ == module.__name__
    }


def _tree(doc: str) -> dict[str, str]:
    """The docstring's tree as class name -> the name it is drawn under."""
    parents: dict[str, str] = {}
    path: list[str] = []
    for line in doc.splitlines():
        match = _TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match["indent"]) // 2
        del path[depth:]
        if depth == 0:
            assert match["name"] in ROOTS, line
        else:
            parents[match["name"]] = path[-1]
        path.append(match["name"])
    return parents


def test_every_exception_is_defined_in_an_errors_module() -> None:
    elsewhere = sorted(
        f"{module.__name__}.{name}"
        for module in _modules()
        if module.__name__ not in ERROR_MODULES
        for name in _exceptions(module)
    )
    assert elsewhere == []


@pytest.mark.parametrize(
    "module", [worker.errors, schemas.errors, worker.aip.errors], ids=ERROR_MODULES
)
def test_the_page_draws_every_exception_under_its_real_parent(module: ModuleType) -> None:
    drawn = _tree(module.__doc__ or "")
    defined = {name: cls.__bases__[0].__name__ for name, cls in _exceptions(module).items()}
    assert drawn == defined
