"""Benchmarks: the worker next to arq, FastStream and a raw nats-py loop, on this machine.

Run them with ``.venv/bin/python -m tests.bench`` (prints the tables) or
``.venv/bin/python -m pytest tests/bench -m bench -s``. Every figure is printed beside the raw
baseline measured in the same run, as a ratio; nothing here asserts a timing, because a
2-core machine shared by servers and clients makes absolute numbers a property of the box.

The bench needs more than the test suite does: psutil (CPU accounting, imported here), and
FastStream and arq for the peers it starts as processes. `require` names what is missing and
the command that installs it, before anything starts (BENCHMARKS.md, "Reproduce").
"""

from __future__ import annotations

import importlib.util

_EXTRA = "pip install -e '.[bench]'"
#: Each module the bench needs beyond the `test` extra, and what installs it.
OPTIONAL = {
    "psutil": _EXTRA,
    "faststream": _EXTRA,
    "click": _EXTRA,
    # arq declares redis<6, so it comes without its dependencies (BENCHMARKS.md says why).
    "arq": "pip install --no-deps 'arq==0.28.0'",
}


class BenchExtraMissing(ModuleNotFoundError):
    """A module the bench needs is not installed; the message says how to install it."""


def require(*modules: str) -> None:
    """Raise BenchExtraMissing naming every module of `modules` that is not installed."""
    missing = [name for name in modules if not _installed(name)]
    if missing:
        commands = sorted({OPTIONAL[name] for name in missing})
        raise BenchExtraMissing(
            f"the benchmarks need {', '.join(missing)}, which the test suite does not "
            f"install: {' and '.join(commands)} (see BENCHMARKS.md)",
            name=missing[0],
        )


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or blocked installation is no installation
        return False
