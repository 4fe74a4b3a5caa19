"""`tools/deploy up` refuses a busy or malformed host port before anything slow happens, naming
the variable that moves it, and leaves the development secrets owner-only.

No engine is needed: the checks come before `tools/containers up`, the image builds and
`compose up`, and the test proves it by their absence (no `containers:` line, a run of a
few seconds). The tool runs in a copy of `tools/` and `compose/` whose secrets have git's
0644, so this checkout's files are not touched. No default port (4222, 8080, 8642, 8643) is
used: every port is given, one held busy by the test.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from worker.testing._procs import free_ports

ROOT = Path(__file__).resolve().parents[2]
#: The unprivileged user the no-engine test runs as when the suite runs as root.
NOBODY = 65534


def _checkout(target: Path) -> Path:
    for name in ("tools", "compose"):
        shutil.copytree(ROOT / name, target / name)
    for secret in (target / "compose" / "secrets").iterdir():
        secret.chmod(0o644)  # what a git checkout gives
    (target / "compose" / "config" / "identities.json").chmod(0o644)
    return target


def test_a_busy_port_is_refused_before_any_build_naming_its_variable(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path / "checkout")
    gateway, hermes, fake_hermes = free_ports(3)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        nats_port = busy.getsockname()[1]
        env = {
            **os.environ,
            "AIP_NATS_PORT": str(nats_port),
            "AIP_GATEWAY_PORT": str(gateway),
            "AIP_HERMES_PORT": "80a",
            "AIP_FAKE_HERMES_PORT": str(fake_hermes),
            # A project no deployment uses, so "its own ports" are none.
            "AIP_COMPOSE_PROJECT": f"aip-hermes-port-check-{hermes}",
        }
        began = time.monotonic()
        done = subprocess.run(
            [str(checkout / "tools" / "deploy"), "up"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - began
    assert done.returncode == 1, done.stderr
    assert (
        f"deploy: host port {nats_port} (127.0.0.1) is in use: set AIP_NATS_PORT to a free port"
        " (the nats service publishes it)"
    ) in done.stderr
    assert "deploy: AIP_HERMES_PORT=80a is not a port number (1-65535)" in done.stderr
    assert "AIP_GATEWAY_PORT" not in done.stderr
    assert "AIP_FAKE_HERMES_PORT" not in done.stderr
    assert "nothing was built or started" in done.stderr
    assert "containers:" not in done.stderr, "tools/containers ran before the port check"
    assert took < 60, f"the refusal took {took:.0f}s"
    secrets = [p for p in (checkout / "compose" / "secrets").iterdir() if p.name != "README.md"]
    secrets.append(checkout / "compose" / "config" / "identities.json")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in secrets}
    assert modes == dict.fromkeys(modes, 0o600)
    assert stat.S_IMODE((checkout / "compose" / "secrets" / "README.md").stat().st_mode) == 0o644


def _as_unprivileged(command: list[str]) -> list[str]:
    """`command` run by a user who is not root: as is when we are not, else as `nobody`
    through `setpriv` (no Docker engine answers such a user, and it cannot start one)."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot run tools/deploy unprivileged")
    return [setpriv, "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups", *command]


def test_no_engine_and_not_root_is_one_reason_before_any_build() -> None:
    """No engine answers and the user cannot start one: `tools/containers up` says why and
    `tools/deploy up` stops on it (exit 1), naming the cause, before any image or compose."""
    # Outside pytest's tmp_path, whose parents only root may enter: the unprivileged user
    # must own the checkout (the secrets are chmod-ed) and have a HOME (the image cache).
    home = Path(tempfile.mkdtemp(prefix="aipd-no-engine-"))
    try:
        checkout = _checkout(home / "checkout")
        (home / "home").mkdir()
        if os.geteuid() == 0:
            home.chmod(0o755)
            for path in [home, *home.rglob("*")]:
                os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        ports = free_ports(4)
        env = {
            **os.environ,
            "HOME": str(home / "home"),
            "XDG_CACHE_HOME": str(home / "home" / ".cache"),
            # An engine nobody runs: neither this nor the private socket answers the user.
            "DOCKER_HOST": f"unix://{home}/no-engine.sock",
            "AIP_COMPOSE_PROJECT": f"aip-hermes-no-engine-{ports[0]}",
            **{
                name: str(port)
                for name, port in zip(
                    ("AIP_NATS_PORT", "AIP_GATEWAY_PORT", "AIP_HERMES_PORT",
                     "AIP_FAKE_HERMES_PORT"),
                    ports,
                    strict=True,
                )
            },
        }  # fmt: skip
        done = subprocess.run(
            _as_unprivileged([str(checkout / "tools" / "deploy"), "up"]),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 1, done.stderr
    assert "containers: no Docker engine: none answers, and starting one needs root" in done.stderr
    assert (
        "deploy: no Docker engine answers (none answers, and starting one needs root)"
        in done.stderr
    )
    assert "images" not in done.stderr, "an image was looked for without an engine"
