"""pytest fixtures that own real NATS and Redis servers, with the project's CI policy.

Fixtures are sync because starting a process is; they work with any async test. Each test gets
fresh servers (function scope) because chaos tests leave them killed, paused or failed over.
Cluster shapes come from markers: `@pytest.mark.nats_cluster(size=3)`,
`@pytest.mark.redis_cluster(masters=3, replicas_per_master=1)`. Clusters are always started
locally: the external URLs name single servers, which cannot stand in for a cluster.

Policy (docs/architecture.md §9): a test whose service cannot be started fails when `CI=true` (a CI
image missing a server is a broken pipeline, not a reason to go green) and skips with the
reason otherwise. A test that tries to kill, pause or restart an external server
(`AIPD_TEST_*_URL`) falls under the same policy.

Backends: `nats_server` and `redis_server` take an indirect parameter, "process" or
"container", to force one (`on_processes_and_containers` runs a test on both). A container
test needs a Docker engine; without one it skips with the reason, and under `CI=true` it
fails only when `AIPD_TEST_CONTAINERS=required`, which `tools/containers up` (run by
`./dev test --containers` and by CI) exports when the machine allows an engine: one answers,
or it could start one as root. On a machine that allows none it exports the reason instead.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable, Generator, Iterator
from typing import NoReturn, TypeVar

import pytest

from worker.testing._errors import ServiceControlUnavailable, ServiceStartError
from worker.testing._procs import close_all_on_sigterm
from worker.testing.containers import docker_available, nats_container, redis_container
from worker.testing.external import ExternalService
from worker.testing.nats_cluster import NatsCluster
from worker.testing.nats_server import NatsServer
from worker.testing.redis_cluster import RedisCluster
from worker.testing.redis_server import RedisServer
from worker.testing.services import ServiceHandle

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
    """Apply the policy up front when a test will need to kill, pause or restart `handle`."""
    if not handle.controllable:
        service_unavailable(f"{handle.url} is not owned by the harness; this test controls it")


def pytester_args() -> list[str]:
    """Arguments for `pytester.runpytest` that load this plugin exactly once.

    The plugin is opted into (`-p worker.testing.pytest_plugin`), never autoloaded; an
    installation that still registers it through a pytest11 entry point (an older release)
    already has it, and adding `-p` too would register it twice (an error). pytest-asyncio
    is left out because the inner runs test the sync fixtures and need no event loop
    configuration.
    """
    entry_points = importlib.metadata.entry_points(group="pytest11")
    autoloaded = any(entry.value == __name__ for entry in entry_points)
    return ["-p", "no:asyncio"] + ([] if autoloaded else ["-p", __name__])


def pytest_configure(config: pytest.Config) -> None:
    """Declare the cluster-shape markers, and clean up servers if the run gets SIGTERM."""
    close_all_on_sigterm()
    config.addinivalue_line("markers", "nats_cluster(size=3): shape of the nats_cluster fixture")
    config.addinivalue_line(
        "markers",
        "redis_cluster(masters=3, replicas_per_master=0): shape of the redis_cluster fixture",
    )
    config.addinivalue_line(
        "markers", "containers: needs a Docker engine (counted in the container summary)"
    )


class _ContainerTally:
    """Outcomes and wall time of the tests that ran on containers, for the run's summary.

    A test counts when it carries the `containers` marker or the "containers" parameter id
    of `on_processes_and_containers`, so a CI log says how long the container part took.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.outcomes: dict[str, int] = {}

    def add(self, report: pytest.TestReport) -> None:
        if "containers" not in report.keywords:
            return
        self.seconds += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1


_TALLY = _ContainerTally()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count container tests (see `_ContainerTally`)."""
    _TALLY.add(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line: how many container tests ran, their outcomes and their wall time."""
    if _TALLY.outcomes:
        outcomes = ", ".join(f"{n} {what}" for what, n in sorted(_TALLY.outcomes.items()))
        terminalreporter.write_line(
            f"container tests: {outcomes} in {_TALLY.seconds:.0f}s (setup, call and teardown)"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Turn a refused control operation on an external server into the skip-or-fail policy."""
    try:
        return (yield)
    except ServiceControlUnavailable as exc:
        service_unavailable(str(exc))


@pytest.fixture
def nats_server(request: pytest.FixtureRequest) -> Iterator[ServiceHandle]:
    """A fresh JetStream server: `AIPD_TEST_NATS_URL`, else a process, else a container
    (or the backend the indirect parameter names)."""
    yield from _single("nats", NATS_URL_ENV, NatsServer, nats_container, _backend(request))


@pytest.fixture(scope="module")
def module_nats_server() -> Iterator[ServiceHandle]:
    """One JetStream server for a whole module (for module-scoped servers built on it)."""
    yield from _single("nats", NATS_URL_ENV, NatsServer, nats_container)


@pytest.fixture
def redis_server(request: pytest.FixtureRequest) -> Iterator[ServiceHandle]:
    """A fresh AOF-always Redis: `AIPD_TEST_REDIS_URL`, else a process, else a container
    (or the backend the indirect parameter names)."""
    yield from _single("redis", REDIS_URL_ENV, RedisServer, redis_container, _backend(request))


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


def _backend(request: pytest.FixtureRequest) -> str | None:
    backend: str | None = getattr(request, "param", None)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"unknown service backend {backend!r}; expected one of {BACKENDS}")
    return backend


def _single(
    kind: str,
    env_var: str,
    local: Callable[[], ServiceHandle],
    container: Callable[[], ServiceHandle],
    backend: str | None = None,
) -> Iterator[ServiceHandle]:
    url = os.environ.get(env_var)
    handle: ServiceHandle
    if backend == "container":
        require_engine()
    try:
        if backend == "container":
            handle = container()
        elif backend == "process":
            handle = local()
        elif url:
            handle = ExternalService(kind, url, env_var)
        else:
            try:
                handle = local()
            except ServiceStartError:
                # No binary here; a container is the last resort, and only if Docker answers.
                if not docker_available():
                    raise
                handle = container()
        _start(handle)
    except (ServiceStartError, TimeoutError) as exc:
        service_unavailable(f"cannot start {kind}: {exc}")
    try:
        yield handle
    finally:
        handle.close()


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
