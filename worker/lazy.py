"""Package re-exports that import their module on first use (PEP 562).

A package `__init__` that imports every submodule makes importing any one submodule import
them all: `worker.gateway.settings` (which the CLI reads to print the gateway's help) pulled
in the whole gateway, the MCP SDK, Starlette and uvicorn included, for every command and
every worker process. A package keeps its short names (`from worker.gateway import Gateway`)
through `lazy_exports`, and mypy still sees them through the package's `TYPE_CHECKING`
imports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """The package's module `__getattr__`: name -> the submodule that defines it, imported
    when the name is first read, then kept on the package so the lookup happens once."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
