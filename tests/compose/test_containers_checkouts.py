"""Two checkouts on one machine run `tools/containers up` at the same time: both get a
working engine, and `down` of one leaves the other's engine and containers running.

The checkouts are two directories holding this tree's `tools/` and `worker/` (what the tool
runs: its own script, and the wheels' binaries it builds the local images from), so the
tool under test is the one in this tree, committed or not. Their `up`s race; the one private
dockerd (tools/containers says why one per machine) is started at most once and each
checkout holds a lease on it. The engine that answered before the test (the suite's own,
under `./dev test --containers`) still answers after it; one the test's `up` started is
stopped by the last `down`.

It needs an engine to run, like every container test (without one it skips or, under CI
with `AIPD_TEST_CONTAINERS=required`, fails). `AIPD_TEST_COLD_ENGINE=1` (as root) runs it
with no engine answering, so the two `up`s race to start the daemon.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from worker.testing.containers import docker_available
from worker.testing.pytest_plugin import require_engine

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_SOCKET = "unix:///run/aip-hermes-docker.sock"

pytestmark = [pytest.mark.timeout(900), pytest.mark.containers]


def _checkout(target: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("tools", "worker"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    if (ROOT / ".venv").exists():
        # The local image builds read the nats-server and valkey binaries of the wheels in
        # .venv; a fresh clone's first `./dev test` makes one the same way.
        (target / ".venv").symlink_to(ROOT / ".venv")
    return target


def _exports(stdout: str) -> dict[str, str]:
    """The `export NAME=value ...` lines `up` prints, as a mapping."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            for word in words[1:]:
                name, _, value = word.partition("=")
                found[name] = value
    return found


def _docker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _answers(docker_host: str | None) -> bool:
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    if docker_host is not None:
        env["DOCKER_HOST"] = docker_host
    return _docker(env, "info").returncode == 0


def test_two_checkouts_share_the_engine_and_one_down_leaves_the_other_running(
    tmp_path: Path,
) -> None:
    if os.environ.get("AIPD_TEST_COLD_ENGINE") != "1" or os.geteuid() != 0:
        require_engine()
    engine_before = docker_available()
    checkouts = [_checkout(tmp_path / name) for name in ("a", "b")]

    ups = [
        subprocess.Popen(
            [str(c / "tools" / "containers"), "up"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for c in checkouts
    ]
    held: str | None = None
    downs: dict[int, subprocess.CompletedProcess[str]] = {}
    try:
        outputs = [up.communicate(timeout=840) for up in ups]
        for up, (_, err) in zip(ups, outputs, strict=True):
            assert up.returncode == 0, f"up exited {up.returncode}:\n{err}"
        envs = [{**os.environ, **_exports(out)} for out, _ in outputs]
        for env, (_, err) in zip(envs, outputs, strict=True):
            assert env.get("AIPD_TEST_CONTAINERS") == "required", err
            assert _docker(env, "info").returncode == 0, err
        starts = sum(err.count("started dockerd") for _, err in outputs)
        assert starts <= 1, [err for _, err in outputs]
        a_env, b_env = envs
        # B runs a container; then A leaves.
        run = _docker(b_env, "run", "-d", "--rm", b_env["AIPD_TEST_NATS_IMAGE"], "-p", "4222")
        assert run.returncode == 0, run.stderr
        held = run.stdout.strip()
        downs[0] = _down(checkouts[0], a_env)
        assert downs[0].returncode == 0, downs[0].stderr
        assert _docker(b_env, "info").returncode == 0, (
            f"A's down stopped B's engine:\n{downs[0].stderr}"
        )
        state = _docker(b_env, "inspect", "-f", "{{.State.Running}}", held)
        assert state.stdout.strip() == "true", f"A's down removed B's container:\n{downs[0].stderr}"
        _docker(b_env, "rm", "-f", held)
        held = None
        downs[1] = _down(checkouts[1], b_env)
        assert downs[1].returncode == 0, downs[1].stderr
        if engine_before:
            assert docker_available(), (
                f"an engine that answered before was stopped:\n{downs[1].stderr}"
            )
        else:
            assert not _answers(PRIVATE_SOCKET), (
                f"the last down left the daemon:\n{downs[1].stderr}"
            )
    finally:
        # Whatever failed, leave the machine as it was: every lease of ours returned.
        for up in ups:
            if up.poll() is None:
                up.kill()
                up.wait()
        for index, checkout in enumerate(checkouts):
            if index not in downs:
                _down(checkout, {**os.environ, "DOCKER_HOST": PRIVATE_SOCKET})


def _down(checkout: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(checkout / "tools" / "containers"), "down"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
