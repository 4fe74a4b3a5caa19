"""One NATS and one Redis per test process, shared by every test that only talks to them.

A server per test cost its start and its teardown in every test; a test that never kills,
pauses, restarts or reconfigures a server gains nothing from owning one. Such a test gets a
`SharedView` of the process's server instead; a test marked `chaos` still gets servers of its
own (pytest_plugin.py decides which). With pytest-xdist every worker process has its own.

Isolation needs no prefix. The worker builds every subject under one configurable prefix but
every Redis key under fixed namespaces, and the tests name the default streams
(`AIP_HERMES_ACTIONS`) in about a hundred places; per-test prefixes would reach into both.
One process runs one test at a time, so each test is given an empty server instead:

* NATS: when a test ends, every stream (and with it every consumer) is deleted.
* Redis: each test works in its own logical database (`redis://host:port/N`, N cycling
  through 1-15, so a client that ignores the URL's database lands in an empty 0 and fails
  visibly), and the server is flushed when the test ends.
* A test that leaves a client connected (a worker process still running, a client never
  closed) *retires* the server: it is closed, as the per-test servers were, so whatever still
  runs meets a dead port rather than the next test's data, and the next test starts a new one.
  So does a server that cannot be wiped or checked.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import nats
import nats.errors
import redis

from worker.testing._errors import ServiceError, SharedServiceControl
from worker.testing.nats_server import http_json
from worker.testing.services import ServiceHandle

#: How long the clients of a finished test may take to disconnect before the server retires.
LINGER_S = 1.0
_POLL_S = 0.01
#: Redis databases a test may be given (0 stays empty; 16 is every server's default count).
_DATABASES = range(1, 16)
#: The client name of the janitor's own connections, which never count as a test's.
JANITOR = "aip-test-janitor"


class SharedView:
    """One test's handle on a shared server: the URL it uses; every control call refuses."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        #: Every refusal raised, so the fixture reports one that the code under test swallowed.
        self.refused: list[str] = []

    @property
    def controllable(self) -> bool:
        """False: the server outlives this test and serves the next ones."""
        return False

    def refusal(self, action: str) -> SharedServiceControl:
        """The error a control call raises (also what `require_control` reports)."""
        message = (
            f"cannot {action} the {self.kind} server: the tests of this process share it; "
            "mark the test `@pytest.mark.chaos` to give it servers of its own"
        )
        self.refused.append(message)
        return SharedServiceControl(message)

    def start(self) -> None:
        """Nothing to do: the server runs already."""

    def stop(self) -> NoReturn:
        """Refuse: the server is shared."""
        raise self.refusal("stop")

    def kill(self) -> NoReturn:
        """Refuse: the server is shared."""
        raise self.refusal("kill")

    def pause(self) -> NoReturn:
        """Refuse: the server is shared."""
        raise self.refusal("pause")

    def resume(self) -> NoReturn:
        """Refuse: the server is shared."""
        raise self.refusal("resume")

    def restart(self) -> NoReturn:
        """Refuse: the server is shared."""
        raise self.refusal("restart")

    def close(self) -> None:
        """Nothing to release here: `SharedServer.release` empties the server."""


class Janitor(Protocol):
    """What sharing needs to know about one kind of server."""

    kind: str

    def view_url(self, server: ServiceHandle, lease: int) -> str:
        """The URL the `lease`-th test of this server uses."""

    def clients(self, server: ServiceHandle) -> int:
        """Client connections other than the janitor's own (named `JANITOR`)."""

    def wipe(self, server: ServiceHandle) -> None:
        """Delete everything the test left (it is the only one using the server)."""

    def leftovers(self, server: ServiceHandle) -> str | None:
        """What is still there after a wipe, or None when the server is empty."""


class NatsJanitor:
    """Counts clients from `/connz`, deletes every stream, checks `/jsz` shows none."""

    kind = "nats"

    def view_url(self, server: ServiceHandle, lease: int) -> str:
        return server.url

    def clients(self, server: ServiceHandle) -> int:
        report = http_json(f"{_monitor(server)}/connz?limit=4096")
        return sum(1 for conn in report.get("connections") or [] if conn.get("name") != JANITOR)

    def wipe(self, server: ServiceHandle) -> None:
        # On a loop of its own, in a thread: fixtures are sync and may be torn down while a
        # test's event loop still exists.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, _delete_streams(server.url)).result(timeout=30.0)

    def leftovers(self, server: ServiceHandle) -> str | None:
        report = http_json(f"{_monitor(server)}/jsz")
        streams, consumers = int(report["streams"]), int(report["consumers"])
        return f"{streams} streams, {consumers} consumers" if streams or consumers else None


class RedisJanitor:
    """Gives each test its own database, counts clients, flushes every database."""

    kind = "redis"

    def view_url(self, server: ServiceHandle, lease: int) -> str:
        return f"{server.url}/{_DATABASES[lease % len(_DATABASES)]}"

    def clients(self, server: ServiceHandle) -> int:
        with _redis(server) as client:
            return sum(1 for entry in client.client_list() if entry.get("name") != JANITOR)

    def wipe(self, server: ServiceHandle) -> None:
        with _redis(server) as client:
            client.flushall()

    def leftovers(self, server: ServiceHandle) -> str | None:
        with _redis(server) as client:
            keyspace: dict[str, Any] = client.info("keyspace")
        return f"keys in {', '.join(sorted(keyspace))}" if keyspace else None


@dataclass
class SharedServer:
    """One kind of server shared by the tests of this process, started on first use."""

    janitor: Janitor
    #: Starts a server (the plugin's: a local process, else a container).
    make: Callable[[], ServiceHandle]
    server: ServiceHandle | None = None
    leases: int = 0
    #: Why each retired server was retired, in order.
    retired: list[str] = field(default_factory=list)

    def lease(self) -> SharedView:
        """A view for the next test (starting a server if none runs)."""
        if self.server is None:
            self.server = self.make()
        self.leases += 1
        return SharedView(self.janitor.kind, self.janitor.view_url(self.server, self.leases))

    def release(self) -> str | None:
        """Empty the server after a test; returns why it was retired instead, if it was."""
        server = self.server
        if server is None:
            return None
        try:
            reason = self._empty(server)
        except (OSError, ServiceError, redis.RedisError, nats.errors.Error, TimeoutError) as exc:
            reason = f"it could not be checked or wiped: {type(exc).__name__}: {exc}"
        if reason is not None:
            self.retire(reason)
        return reason

    def retire(self, reason: str) -> None:
        """Close the server; the next test starts a new one."""
        if self.server is not None:
            self.server.close()
            self.server = None
            self.retired.append(reason)

    def close(self) -> None:
        """End of the session."""
        if self.server is not None:
            self.server.close()
            self.server = None

    def _empty(self, server: ServiceHandle) -> str | None:
        if not self._disconnected(server):
            count = self.janitor.clients(server)
            return f"{count} client(s) still connected {LINGER_S:.0f} s after the test"
        self.janitor.wipe(server)
        left = self.janitor.leftovers(server)
        return None if left is None else f"the wipe left {left}"

    def _disconnected(self, server: ServiceHandle) -> bool:
        deadline = time.monotonic() + LINGER_S
        while self.janitor.clients(server):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True


def _monitor(server: ServiceHandle) -> str:
    url = getattr(server, "monitor_url", None)
    if not isinstance(url, str):
        raise ServiceError(f"{server.url} has no monitoring port to count clients with")
    return url


def _redis(server: ServiceHandle) -> redis.Redis:
    return redis.Redis.from_url(
        server.url, client_name=JANITOR, socket_timeout=5.0, socket_connect_timeout=2.0
    )


async def _delete_streams(url: str) -> None:
    nc = await nats.connect(url, name=JANITOR, allow_reconnect=False, connect_timeout=2.0)
    try:
        js = nc.jetstream(timeout=5.0)
        for info in await js.streams_info():
            if info.config.name is not None:
                await js.delete_stream(info.config.name)
    finally:
        await nc.close()
