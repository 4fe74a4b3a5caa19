"""The plugin's `asyncio_mode` default (worker/testing/pytest_plugin.py, `_default_asyncio_mode`):
a project that names no mode gets `auto`, so the README's unmarked `async def` tests run on the
plugin's fixtures; a project that names one keeps it.

Each case is a pytest run in a subprocess of its own, in an empty directory with only the
configuration under test (none, a pyproject.toml naming other settings, or `strict`): the mode
is decided when a run is configured, so it cannot be observed from inside this suite's run,
whose pyproject.toml sets `auto` itself. The inner test uses the servers for real.
"""

from __future__ import annotations

import pytest

from worker.testing.pytest_plugin import pytester_args

pytest_plugins = ["pytester"]

_INNER_TEST = """
import asyncio

import nats
import redis.asyncio as redis


async def test_an_unmarked_async_test_uses_the_plugins_servers(nats_server, redis_server):
    nc = await nats.connect(nats_server.url)
    try:
        assert (await nc.request("$JS.API.INFO", b"", timeout=5)).data
    finally:
        await nc.close()
    client = redis.from_url(redis_server.url)
    try:
        assert await client.ping()
    finally:
        await client.aclose()
    await asyncio.sleep(0)
"""

#: A pyproject.toml that configures pytest, but not `asyncio_mode`.
_OTHER_SETTINGS = """[tool.pytest.ini_options]
asyncio_default_fixture_loop_scope = "function"
"""

_STRICT = _OTHER_SETTINGS + 'asyncio_mode = "strict"\n'


@pytest.mark.parametrize(
    ("pyproject", "outcomes"),
    [
        pytest.param(None, {"passed": 1}, id="no-configuration"),
        pytest.param(_OTHER_SETTINGS, {"passed": 1}, id="configured-without-a-mode"),
        # The project's own mode wins: in strict mode an unmarked async test is not run
        # (pytest fails it), which is also what the default above is there to prevent.
        pytest.param(_STRICT, {"failed": 1}, id="strict-kept"),
    ],
)
def test_a_project_without_an_asyncio_mode_runs_unmarked_async_tests(
    pytester: pytest.Pytester, pyproject: str | None, outcomes: dict[str, int]
) -> None:
    if pyproject is not None:
        pytester.makepyprojecttoml(pyproject)
    pytester.makepyfile(test_inner=_INNER_TEST)
    result = pytester.runpytest_subprocess(*pytester_args(asyncio=True), "-rfE", timeout=180)
    result.assert_outcomes(**outcomes)
    if "failed" in outcomes:
        result.stdout.fnmatch_lines(["*async def functions are not natively supported*"])
