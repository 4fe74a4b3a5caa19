"""Servers live in their own process group and never outlive the test run that made them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import worker
from worker.testing.pytest_plugin import pytester_args
from worker.testing.services import NatsServer, RedisServer

pytest_plugins = ["pytester"]

_SOURCE_ROOT = str(Path(worker.__file__).resolve().parents[1])


def test_each_server_has_its_own_process_group() -> None:
    with NatsServer() as nats_server, RedisServer() as redis_server:
        for server in (nats_server, redis_server):
            assert server.pid is not None
            assert os.getpgid(server.pid) == server.pid
            assert os.getpgid(server.pid) != os.getpgid(0)


_OWN_SERVERS = """
import json
import pytest

@pytest.mark.chaos
def test_fails(nats_server, redis_server):
    with open({record!r}, "w") as out:
        json.dump([[s.pid, str(s.root)] for s in (nats_server, redis_server)], out)
    assert False, "boom"
"""

_SHARED_SERVERS = """
import json

def test_fails(nats_server, redis_server, shared_servers):
    servers = [shared.server for shared in shared_servers.values()]
    with open({record!r}, "w") as out:
        json.dump([[s.pid, str(s.root)] for s in servers], out)
    assert False, "boom"
"""


@pytest.mark.parametrize("inner", [_OWN_SERVERS, _SHARED_SERVERS], ids=["own", "shared"])
def test_servers_of_a_failing_test_are_killed_and_their_dirs_removed(
    pytester: pytest.Pytester, tmp_path: Path, inner: str
) -> None:
    record = tmp_path / "servers.json"
    pytester.makepyfile(inner.format(record=str(record)))

    result = pytester.runpytest(*pytester_args())

    result.assert_outcomes(failed=1)
    for pid, root in json.loads(record.read_text()):
        assert not _alive(pid)
        assert not Path(root).exists()


def test_servers_left_open_are_killed_when_the_interpreter_exits() -> None:
    code = (
        "import json\n"
        "from worker.testing.services import NatsServer, RedisServer\n"
        "servers = [NatsServer(), RedisServer()]\n"
        "for s in servers: s.start()\n"
        "print(json.dumps([[s.pid, str(s.root)] for s in servers]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    left = json.loads(done.stdout)
    try:
        for pid, root in left:
            assert not _alive(pid)
            assert not Path(root).exists()
    finally:
        for pid, _ in left:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_servers_are_killed_when_the_test_process_gets_sigterm() -> None:
    code = (
        "import json, time\n"
        "from worker.testing.services import NatsServer, RedisServer, close_all_on_sigterm\n"
        "close_all_on_sigterm()\n"
        "servers = [NatsServer(), RedisServer()]\n"
        "for s in servers: s.start()\n"
        "print(json.dumps([[s.pid, str(s.root)] for s in servers]), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    left = json.loads(child.stdout.readline())
    try:
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
        for pid, root in left:
            assert not _alive(pid)
            assert not Path(root).exists()
    finally:
        child.stdout.close()
        for pid, _ in left:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [_SOURCE_ROOT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
