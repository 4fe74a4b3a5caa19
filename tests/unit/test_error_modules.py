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
#: The docstring's root, drawn at the left margin of the tree; each program's root is under it.
ROOTS = frozenset({"Exception"})
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


#: Each program's root: the runtime, the client, the gateway and the qualification on the
#: worker's page, the wire layer on its own.
PROGRAM_ROOTS: dict[ModuleType, tuple[type[BaseException], ...]] = {
    worker.errors: (
        worker.errors.WorkerError,
        worker.errors.ClientError,
        worker.errors.GatewayError,
        worker.errors.QualifyError,
    ),
    schemas.errors: (schemas.errors.WireError,),
    worker.aip.errors: (worker.aip.errors.AipWireError,),
}


@pytest.mark.parametrize("module", list(PROGRAM_ROOTS), ids=[m.__name__ for m in PROGRAM_ROOTS])
def test_every_exception_is_under_exactly_one_program_root(module: ModuleType) -> None:
    roots = PROGRAM_ROOTS[module]
    assert all(root.__bases__ == (Exception,) for root in roots)
    stray = {
        name: [root.__name__ for root in roots if issubclass(cls, root)]
        for name, cls in _exceptions(module).items()
        if cls not in roots
    }
    assert {name: under for name, under in stray.items() if len(under) != 1} == {}


@pytest.mark.parametrize(
    ("package", "root"),
    [("worker.demo", "worker.demo.environment.DemoError"),
     ("worker.testing", "worker.testing._errors.HarnessError")],
)  # fmt: skip
def test_the_demo_and_the_harness_keep_their_exceptions_under_one_root(
    package: str, root: str
) -> None:
    module_name, _, class_name = root.rpartition(".")
    base = getattr(importlib.import_module(module_name), class_name)
    top = importlib.import_module(package)
    found = {
        f"{module.__name__}.{name}": cls
        for info in pkgutil.walk_packages(top.__path__, package + ".")
        for module in [importlib.import_module(info.name)]
        for name, cls in _exceptions(module).items()
    }
    assert len(found) > 1
    assert sorted(name for name, cls in found.items() if not issubclass(cls, base)) == []
