"""pytest fixtures that own real NATS and Redis servers, with the project's CI policy.

Fixtures are sync because starting a process is; they work with any async test.

One switch decides which server a test gets (`_serve`):

* `AIPD_TEST_NATS_URL` / `AIPD_TEST_REDIS_URL` set: that server, for every test.
* a backend given as an indirect parameter, "process" or "container"
  (`on_processes_and_containers` runs a test on both): a fresh server of that kind.
* the test is marked `chaos` (it kills, pauses, restarts or reconfigures its servers): a fresh
  local process, else a container.
* otherwise: a view of this process's shared server, empty when the test starts, whose
  control calls refuse (worker/testing/shared.py says how tests are kept apart).

Cluster shapes come from markers: `@pytest.mark.nats_cluster(size=3)`,
`@pytest.mark.redis_cluster(masters=3, replicas_per_master=1)`. Clusters are always started
locally and fresh: the external URLs name single servers, which cannot stand in for a cluster.

Policy (docs/architecture.md §9), in one helper, `service_unavailable`: a test whose service
(a server, the real Hermes, a tool) cannot be had fails when `CI=true` (a CI image missing a
server is a broken pipeline, not a reason to go green) and skips with the reason otherwise. A
test that tries to kill, pause or restart an external server (`AIPD_TEST_*_URL`) falls under
the same policy.

Containers need a Docker engine; without one a container test skips with the reason, and under
`CI=true` it fails only when `AIPD_TEST_CONTAINERS=required`, which `tools/containers up` (run
by `./dev test --containers` and by CI) exports when the machine allows an engine: one answers,
or it could start one as root. On a machine that allows none it exports the reason instead.

`worker_process` is a whole worker for a user's own test (worker/testing/worker_fixture.py):
trust files, the fake Hermes, and a real `python -m worker run` bound to the shared servers.
It is an async fixture, so the plugin needs pytest-asyncio (the `testing` extra has it) and,
when the project sets no `asyncio_mode` (neither in its configuration nor with
`--asyncio-mode`), sets it to `auto` for the run: in pytest-asyncio's default `strict` mode
the README's unmarked `async def` tests would not run at all. A mode the project sets wins.
"""

from __future__ import annotations

import configparser
import functools
import importlib.metadata
import os
import tomllib
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import pytest
import pytest_asyncio

from worker.testing._errors import (
    HermesUnavailable,
    ServiceControlUnavailable,
    ServiceStartError,
)
from worker.testing._procs import close_all_on_sigterm
from worker.testing.containers import docker_available, nats_container, redis_container
from worker.testing.external import ExternalService
from worker.testing.nats_cluster import NatsCluster
from worker.testing.nats_server import NatsServer
from worker.testing.redis_cluster import RedisCluster
from worker.testing.redis_server import RedisServer
from worker.testing.services import ServiceHandle
from worker.testing.shared import (
    Janitor,
    NatsJanitor,
    RedisJanitor,
    SharedServer,
    SharedView,
)
from worker.testing.worker_fixture import WorkerDeployment, worker_deployment

NATS_URL_ENV = "AIPD_TEST_NATS_URL"
REDIS_URL_ENV = "AIPD_TEST_REDIS_URL"
CONTAINERS_ENV = "AIPD_TEST_CONTAINERS"
BACKENDS = ("process", "container")

#: Run a test (using `nats_server` and `redis_server`) once on local processes and once on
#: containers: `@on_processes_and_containers`.
on_processes_and_containers = pytest.mark.parametrize(
    ("nats_server", "redis_server"),
    [("process", "process"), ("container", "container")],
    indirect=True,
    ids=["processes", "containers"],
)

_CI_TRUE = frozenset({"true", "1", "yes"})
_Owned = TypeVar("_Owned", NatsCluster, RedisCluster)


def in_ci() -> bool:
    """Whether the environment says this is a CI run (`CI=true`, as CI providers set it)."""
    return os.environ.get("CI", "").strip().lower() in _CI_TRUE


def service_unavailable(reason: str) -> NoReturn:
    """Fail the test under CI, skip it otherwise; `reason` says which service and why."""
    if in_ci():
        pytest.fail(f"service unavailable under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def require_engine() -> None:
    """Skip (or, under CI where the machine allows an engine, fail) unless Docker answers."""
    if docker_available():
        return
    expected = os.environ.get(CONTAINERS_ENV, "")
    if expected == "required" and in_ci():
        pytest.fail(
            f"no Docker engine answers, but {CONTAINERS_ENV}=required: this machine allows one "
            "and `tools/containers up` had started it",
            pytrace=False,
        )
    why = expected.removeprefix("unavailable: ") if expected.startswith("unavailable") else (
        "no Docker engine answers (`./dev test --containers` starts one where the machine "
        "allows it)"
    )
    pytest.skip(f"container test: {why}")


def require_control(handle: ServiceHandle) -> None:
    """Apply the policy up front when a test will need to kill, pause or restart `handle`
    (a shared server is a test bug, not an unavailable service: the test fails)."""
    if isinstance(handle, SharedView):
        pytest.fail(str(handle.refusal("control")), pytrace=False)
    if not handle.controllable:
        service_unavailable(f"{handle.url} is not owned by the harness; this test controls it")


def pytester_args(*, asyncio: bool = False) -> list[str]:
    """Arguments for `pytester.runpytest` that load this plugin exactly once.

    The plugin is opted into (`-p worker.testing.pytest_plugin`), never autoloaded; an
    installation that still registers it through a pytest11 entry point (an older release)
    already has it, and adding `-p` too would register it twice (an error). pytest-asyncio
    is left out unless `asyncio`: most inner runs test the sync fixtures and need no event
    loop configuration; the run that tests the plugin's `asyncio_mode` default needs it.
    """
    entry_points = importlib.metadata.entry_points(group="pytest11")
    autoloaded = any(entry.value == __name__ for entry in entry_points)
    return ([] if asyncio else ["-p", "no:asyncio"]) + ([] if autoloaded else ["-p", __name__])


def pytest_configure(config: pytest.Config) -> None:
    """Declare the markers the fixtures read, clean up servers if the run gets SIGTERM, and
    default pytest-asyncio to `auto` mode when the project chose none (module docstring)."""
    close_all_on_sigterm()
    _default_asyncio_mode(config)
    config.addinivalue_line(
        "markers",
        "chaos: kills, pauses, restarts or reconfigures its servers, so it gets its own "
        "instead of the shared ones",
    )
    config.addinivalue_line("markers", "nats_cluster(size=3): shape of the nats_cluster fixture")
    config.addinivalue_line(
        "markers",
        "redis_cluster(masters=3, replicas_per_master=0): shape of the redis_cluster fixture",
    )
    config.addinivalue_line(
        "markers", "containers: needs a Docker engine (counted in the container summary)"
    )
    config.pluginmanager.register(_Summary(), "aipd-test-summary")


def _default_asyncio_mode(config: pytest.Config) -> None:
    """`asyncio_mode = auto` unless the command line or the configuration file names one.

    pytest-asyncio reads the mode when it collects and runs each test, never before the
    plugins are configured, so setting the option here covers the whole run. Without
    pytest-asyncio (an inner run with `-p no:asyncio`) there is no such option to set.
    """
    if not config.pluginmanager.hasplugin("asyncio"):
        return
    if getattr(config.option, "asyncio_mode", None) is not None:
        return
    if "asyncio_mode" in _configured_ini_names(config):
        return
    config.option.asyncio_mode = "auto"


def _configured_ini_names(config: pytest.Config) -> set[str]:
    """The settings the project's configuration file names, and those given with `-o`.

    Read from the file itself: pytest answers `getini` with the default when a setting is
    absent, so an explicit `asyncio_mode = "strict"` and no setting at all look alike there.
    """
    names = {str(o).split("=", 1)[0].strip() for o in config.option.override_ini or ()}
    path = config.inipath
    if path is None:
        return names
    if path.suffix == ".toml":
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        tool = data.get("tool", {}).get("pytest", {})
        for table in (tool.get("ini_options", {}), tool, data.get("pytest", {})):
            names.update(table)
        return names
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path, encoding="utf-8")
    for section in ("pytest", "tool:pytest"):
        if parser.has_section(section):
            names.update(parser[section])
    return names


class _Summary:
    """The run's closing lines: the tests that ran on containers (outcomes, wall time), and
    the tests that ran on shared servers, naming each after which one was retired.

    A container test carries the `containers` marker or the "containers" parameter id of
    `on_processes_and_containers`, so a CI log says how long the container part took. Shared
    servers are read from the teardown reports' `user_properties`, which pytest-xdist
    forwards from its worker processes, so the count covers every process. Registered per
    run, so a pytester run inside a test keeps its own count.
    """

    def __init__(self) -> None:
        self.container_seconds = 0.0
        self.container_outcomes: dict[str, int] = {}
        self.shared: dict[str, int] = {}
        self.retired: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if "containers" in report.keywords:
            self.container_seconds += report.duration
            if report.when == "call" or (report.when == "setup" and not report.passed):
                outcomes = self.container_outcomes
                outcomes[report.outcome] = outcomes.get(report.outcome, 0) + 1
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == _SHARED:
                self.shared[str(value)] = self.shared.get(str(value), 0) + 1
            elif name == _RETIRED:
                self.retired.append(f"{report.nodeid}: {value}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        write = terminalreporter.write_line
        if self.container_outcomes:
            outcomes = ", ".join(f"{n} {o}" for o, n in sorted(self.container_outcomes.items()))
            write(
                f"container tests: {outcomes} in {self.container_seconds:.0f}s "
                "(setup, call and teardown)"
            )
        if self.shared:
            counts = ", ".join(f"{kind} {n}" for kind, n in sorted(self.shared.items()))
            write(f"tests on shared servers: {counts}; servers retired: {len(self.retired)}")
            for line in self.retired:
                write(f"  retired after {line}")


_SHARED = "aipd-shared-server"
_RETIRED = "aipd-shared-server-retired"
_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test itself failed (read by the shared-server teardown)."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_FAILED] = report.failed
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    """A fixture that could not install the real Hermes gets the skip-or-fail policy."""
    try:
        return (yield)
    except HermesUnavailable as exc:
        _hermes_unavailable(exc)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A refused control operation on an external server, or a real Hermes that cannot be
    installed, gets the skip-or-fail policy."""
    try:
        return (yield)
    except ServiceControlUnavailable as exc:
        service_unavailable(str(exc))
    except HermesUnavailable as exc:
        _hermes_unavailable(exc)


def _hermes_unavailable(exc: HermesUnavailable) -> NoReturn:
    """The skip-or-fail policy for a real Hermes that could not be installed or started."""
    service_unavailable(f"the real Hermes is unavailable: {exc.reason}")


@pytest.fixture
def nats_server(request: pytest.FixtureRequest) -> Iterator[ServiceHandle]:
    """A JetStream server with no streams, as the switch in the module docstring chooses."""
    yield from _serve(request, NATS)


@pytest.fixture(scope="module")
def module_nats_server() -> Iterator[ServiceHandle]:
    """One JetStream server for a whole module (for module-scoped servers built on it)."""
    yield from _single(NATS, None)


@pytest.fixture
def redis_server(request: pytest.FixtureRequest) -> Iterator[ServiceHandle]:
    """An empty AOF-always Redis, as the switch in the module docstring chooses."""
    yield from _serve(request, REDIS)


@pytest.fixture(scope="module")
def module_redis_server() -> Iterator[ServiceHandle]:
    """One AOF-always Redis for a whole module (for module-scoped deployments built on it)."""
    yield from _single(REDIS, None)


@pytest.fixture(scope="session")
def shared_servers() -> Iterator[dict[str, SharedServer]]:
    """This process's shared NATS and Redis, each started by the first test that needs it."""
    servers = {
        kind.name: SharedServer(kind.janitor, functools.partial(_start_single, kind, None))
        for kind in (NATS, REDIS)
    }
    try:
        yield servers
    finally:
        for server in servers.values():
            server.close()


@pytest_asyncio.fixture
async def worker_process(
    tmp_path: Path, nats_server: ServiceHandle, redis_server: ServiceHandle
) -> AsyncIterator[WorkerDeployment]:
    """One real worker serving endpoint `hermes-1` against the test's NATS and Redis, with
    complete trust files and the fake Hermes (worker/testing/worker_fixture.py); killed after
    the test. `await worker_process.run("models")` is one signed, verified round trip."""
    async with worker_deployment(tmp_path, nats_server.url, redis_server.url) as deployment:
        yield deployment


@pytest.fixture
def nats_cluster(request: pytest.FixtureRequest) -> Iterator[NatsCluster]:
    """A fresh JetStream cluster with a meta leader (size from the `nats_cluster` marker)."""
    marker = request.node.get_closest_marker("nats_cluster")
    options = dict(marker.kwargs) if marker else {}
    yield from _owned("NATS cluster", lambda: NatsCluster(**options))


@pytest.fixture
def redis_cluster(request: pytest.FixtureRequest) -> Iterator[RedisCluster]:
    """A fresh Redis Cluster in state ok (shape from the `redis_cluster` marker)."""
    marker = request.node.get_closest_marker("redis_cluster")
    options = dict(marker.kwargs) if marker else {}
    yield from _owned("Redis Cluster", lambda: RedisCluster(**options))


@dataclass(frozen=True, slots=True)
class _Kind:
    """One kind of single server: where its external URL comes from, how to start one."""

    name: str
    env_var: str
    local: Callable[[], ServiceHandle]
    container: Callable[[], ServiceHandle]
    janitor: Janitor


NATS = _Kind("nats", NATS_URL_ENV, NatsServer, nats_container, NatsJanitor())
REDIS = _Kind("redis", REDIS_URL_ENV, RedisServer, redis_container, RedisJanitor())


def _serve(request: pytest.FixtureRequest, kind: _Kind) -> Iterator[ServiceHandle]:
    backend = _backend(request)
    if (
        backend is not None
        or os.environ.get(kind.env_var)
        or request.node.get_closest_marker("chaos") is not None
    ):
        yield from _single(kind, backend)
        return
    shared: SharedServer = request.getfixturevalue("shared_servers")[kind.name]
    view = shared.lease()
    request.node.user_properties.append((_SHARED, kind.name))
    try:
        yield view
    finally:
        retired = shared.release()
        if retired is not None:
            request.node.user_properties.append((_RETIRED, f"{kind.name}: {retired}"))
    if view.refused and not request.node.stash.get(_CALL_FAILED, False):
        # The code under test caught the refusal and carried on: the test must not pass.
        pytest.fail(view.refused[0], pytrace=False)


def _backend(request: pytest.FixtureRequest) -> str | None:
    backend: str | None = getattr(request, "param", None)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown service backend {backend!r}; expected one of {BACKENDS}")
    return backend


def _single(kind: _Kind, backend: str | None) -> Iterator[ServiceHandle]:
    """A server for this test (or module) alone: the external one, or one started now."""
    url = os.environ.get(kind.env_var)
    if url and backend is None:
        handle: ServiceHandle = ExternalService(kind.name, url, kind.env_var)
        try:
            handle.start()
        except ServiceStartError as exc:
            service_unavailable(f"cannot reach {kind.name}: {exc}")
    else:
        handle = _start_single(kind, backend)
    try:
        yield handle
    finally:
        handle.close()


def _start_single(kind: _Kind, backend: str | None) -> ServiceHandle:
    """A started local server of `kind` (else a container if Docker answers), or the one
    `backend` names; applies the policy when none can be started."""
    if backend == "container":
        require_engine()
    try:
        handle: ServiceHandle
        if backend == "container":
            handle = kind.container()
        else:
            try:
                handle = kind.local()
            except ServiceStartError:
                # No binary here; a container is the last resort, and only if Docker answers.
                if backend == "process" or not docker_available():
                    raise
                handle = kind.container()
        _start(handle)
    except (ServiceStartError, TimeoutError) as exc:
        service_unavailable(f"cannot start {kind.name}: {exc}")
    return handle


def _owned(kind: str, make: Callable[[], _Owned]) -> Iterator[_Owned]:
    try:
        cluster = make()
        try:
            cluster.start()
        except BaseException:
            cluster.close()
            raise
    except (ServiceStartError, TimeoutError) as exc:
        service_unavailable(f"cannot start {kind}: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


def _start(handle: ServiceHandle) -> None:
    try:
        handle.start()
    except BaseException:
        handle.close()
        raise
