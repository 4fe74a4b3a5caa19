"""The service switch: tests share their process's servers, each starting on empty ones.

Every case runs an inner pytest session (pytester) with the plugin, so what is checked is what
a suite sees: the fixtures, their teardown, and the run's summary.
"""

from __future__ import annotations

import pytest

from worker.testing.pytest_plugin import NATS_URL_ENV, REDIS_URL_ENV, pytester_args

pytest_plugins = ["pytester"]

_HELPERS = """
import asyncio
import socket

import nats
import pytest
import redis

SEEN = {}


def streams(url):
    async def names():
        nc = await nats.connect(url)
        try:
            return [info.config.name for info in await nc.jetstream().streams_info()]
        finally:
            await nc.close()
    return asyncio.run(names())


def add_stream(url, name):
    async def add():
        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(name=name, subjects=[name.lower() + ".>"])
        finally:
            await nc.close()
    asyncio.run(add())
"""


@pytest.fixture(autouse=True)
def _no_external_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (NATS_URL_ENV, REDIS_URL_ENV):
        monkeypatch.delenv(name, raising=False)


def test_the_next_test_meets_the_same_servers_empty(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        _HELPERS
        + """
def test_first_leaves_a_stream_and_a_key(nats_server, redis_server):
    SEEN["first"] = (nats_server.url, redis_server.url)
    add_stream(nats_server.url, "LEFT")
    with redis.Redis.from_url(redis_server.url) as client:
        client.set("left", "1")
    assert streams(nats_server.url) == ["LEFT"]


def test_second_finds_nothing(nats_server, redis_server):
    nats_url, redis_url = SEEN["first"]
    assert nats_server.url == nats_url
    # The same Redis, another database: a key written under a stale URL misses this test.
    assert redis_server.url.rsplit("/", 1)[0] == redis_url.rsplit("/", 1)[0]
    assert redis_server.url != redis_url
    assert streams(nats_server.url) == []
    with redis.Redis.from_url(redis_url) as client:
        assert client.dbsize() == 0
"""
    )
    result = pytester.runpytest(*pytester_args(), "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*tests on shared servers: nats 2, redis 2; servers retired: 0*"])


@pytest.mark.parametrize("ci", ["true", "false"])
def test_killing_a_shared_server_fails_the_test_and_names_the_marker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str
) -> None:
    monkeypatch.setenv("CI", ci)
    pytester.makepyfile(
        """
def test_forgot_its_marker(nats_server):
    nats_server.kill()
"""
    )
    result = pytester.runpytest(*pytester_args())
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*cannot kill the nats server*@pytest.mark.chaos*"])


def test_a_refusal_the_code_under_test_swallows_still_fails_the_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
def test_swallows_it(redis_server):
    try:
        redis_server.restart()
    except Exception:
        pass
"""
    )
    result = pytester.runpytest(*pytester_args())
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown*", "*cannot restart the redis server*"])


def test_a_chaos_test_gets_servers_of_its_own_it_may_kill(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        _HELPERS
        + """
def test_shared(nats_server, redis_server):
    SEEN["shared"] = (nats_server.url, redis_server.url)


@pytest.mark.chaos
def test_chaos(nats_server, redis_server):
    assert nats_server.controllable and redis_server.controllable
    assert nats_server.url != SEEN["shared"][0]
    assert not redis_server.url.startswith(SEEN["shared"][1].rsplit("/", 1)[0])
    redis_server.kill()
    redis_server.restart()
"""
    )
    result = pytester.runpytest(*pytester_args(), "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*tests on shared servers: nats 1, redis 1; servers retired: 0*"])


@pytest.mark.parametrize("kind", ["nats", "redis"])
def test_a_client_left_connected_retires_the_server(
    pytester: pytest.Pytester, kind: str
) -> None:
    pytester.makepyfile(
        _HELPERS
        + f"""
LEAKED = []


def test_leaks_a_connection({kind}_server):
    SEEN["url"] = {kind}_server.url
    port = int({kind}_server.url.rsplit(":", 1)[1].split("/")[0])
    LEAKED.append(socket.create_connection(("127.0.0.1", port)))
    # Let the server register the connection before the test ends.
    LEAKED[0].settimeout(2.0)
    if "{kind}" == "nats":
        # The server sends INFO before it registers the client (a teardown right after INFO
        # once counted no client); the PONG to a PING comes after.
        LEAKED[0].sendall(b"CONNECT {{}}\\r\\nPING\\r\\n")
        seen = b""
        while b"PONG" not in seen:
            chunk = LEAKED[0].recv(65536)
            assert chunk, seen
            seen += chunk
    else:
        LEAKED[0].sendall(b"PING\\r\\n")
        assert LEAKED[0].recv(7) == b"+PONG\\r\\n"


def test_next_gets_a_new_server({kind}_server):
    assert {kind}_server.url.split("/")[2] != SEEN["url"].split("/")[2]
    # The retired server is gone: the leaked connection reads to its end (a timeout here
    # would mean the server still runs).
    with LEAKED.pop() as leaked:
        while True:
            try:
                if not leaked.recv(65536):
                    break
            except ConnectionResetError:
                break
"""
    )
    result = pytester.runpytest(*pytester_args(), "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            f"*tests on shared servers: {kind} 2; servers retired: 1*",
            f"*retired after *test_leaks_a_connection: {kind}: 1 client(s) still connected*",
        ]
    )
