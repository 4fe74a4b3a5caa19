"""Whether this worker's Redis answers and has room for new leases: the gate of every fetch.

A worker whose store fails must not take Actions from the shared queue: every one it fetches
waits out a store budget and comes back late, while the other workers could have run it.
So the pull loops fetch only while this gate is open. It closes when

- a PING (every `check_interval_s`) or a lease renewal fails: Redis does not answer, or
- `INFO memory` shows less than the reserve free below `maxmemory`: with `noeviction` a
  full Redis refuses writes, and the writes that must still succeed are the settles and
  renewals of work already running (their scripts may write at OOM, see `settle.lua`).
  New leases stop before the last megabytes are used, so completed work stays completed.
  An ACL user without `+info` turns this check off (one warning, counted in
  `aip_hermes_worker_errors_total{where="store.check",cause="info refused"}`), never the gate.

It opens again on the next check that succeeds. While closed, an Action already fetched is
answered without waiting for the store (`LeaseStore.acquire` raises `StoreNotAccepting`)
and nak'd with a delay, so another worker takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoPermissionError, OutOfMemoryError

from worker.dependencies import UNREACHABLE_HINT, Dependency
from worker.logs import RepeatedErrors
from worker.metrics import Metrics

log = logging.getLogger(__name__)

#: A PING slower than this counts as a failing store.
PING_TIMEOUT_S = 1.0
#: While maxmemory is below four reserves, a quarter of it is reserved instead.
RESERVE_FRACTION = 4


class StoreHealth:
    """The store's last known state, kept fresh by `run()` and by the heartbeat."""

    def __init__(
        self,
        redis: Any,
        *,
        check_interval_s: float = 1.0,
        reserve_bytes: int = 64 * 1024 * 1024,
        errors: RepeatedErrors | None = None,
        metrics: Metrics | None = None,
        url: str = "redis",
    ) -> None:
        self.redis = redis
        self.check_interval_s = check_interval_s
        self.reserve_bytes = reserve_bytes
        self.errors = errors if errors is not None else RepeatedErrors()
        self.metrics = metrics
        #: Lost and back again, with the URL and what to check (worker/dependencies.py).
        self.dependency = Dependency("redis", url, log, self.errors)
        #: A flapping Redis must not log two lines per check either.
        self._recoveries = RepeatedErrors(self.errors.interval_s)
        #: Redis answered the last check (False until the first one succeeds).
        self.answering = False
        #: Redis had at least the reserve free below maxmemory at the last check.
        self.has_room = True
        #: INFO is asked for; False once the ACL refused it (the gate then follows PING only).
        self.memory_check = True
        #: Why the gate is closed ('' while open), for logs and /ready.
        self.reason = "not checked yet"
        self._open = asyncio.Event()

    @property
    def accepting(self) -> bool:
        """Whether new leases may be taken now."""
        return self.answering and self.has_room

    async def wait_accepting(self) -> None:
        """Until the store answers and has room (the pull loops call this before a fetch)."""
        await self._open.wait()

    def mark_answering(self) -> None:
        self.dependency.back("fetching is on")
        self.answering = True
        self._update()

    def mark_failing(self, cause: str) -> None:
        """A store call failed for lack of an answer (heartbeat, ping, acquire)."""
        if self.answering:
            self.dependency.lost(cause, what="fetching paused until it answers")
        self.answering = False
        self._update(cause)

    def mark_full(self, cause: str) -> None:
        """Redis refused a write for lack of memory, or is within the reserve of maxmemory."""
        if self.has_room:
            self.errors.report(
                "store.gate", "near maxmemory", log,
                "redis is near maxmemory (%s); no new leases until memory is freed", cause,
            )
        self.has_room = False
        self._update(cause)

    def _update(self, cause: str = "") -> None:
        if self.metrics is not None:
            self.metrics.store_accepting.set(1 if self.accepting else 0)
        if self.accepting:
            self.reason = ""
            self._open.set()
        else:
            self.reason = cause or self.reason or "redis unavailable"
            self._open.clear()

    async def check(self, *, quiet: bool = False) -> bool:
        """One PING and one `INFO memory`; updates the gate; True when it is open.
        `quiet`: a failure is not logged (`wait_ready` says it its own way)."""
        memory: Mapping[str, Any] | None = None
        try:
            async with asyncio.timeout(PING_TIMEOUT_S):
                await self.redis.ping()
                if self.memory_check:
                    memory = await self._memory_info_if_allowed()
        except Exception as exc:
            cause = _cause(exc)
            # The first failure is said by `mark_failing` (the gate closing); later checks
            # of a Redis still down remind, once per cause per interval.
            if not quiet and not self.answering:
                self.dependency.lost(cause, what="fetching paused until it answers")
            self.mark_failing(cause)
            return False
        self.mark_answering()
        free = None if memory is None else _least_free(memory)
        if free is None:
            self._room(True)
        else:
            used_free, maxmemory = free
            reserve = min(self.reserve_bytes, maxmemory // RESERVE_FRACTION)
            self._room(used_free >= reserve, f"{used_free} bytes free, reserve {reserve}")
        return self.accepting

    async def _memory_info_if_allowed(self) -> Mapping[str, Any] | None:
        """`INFO memory`, or None when the ACL refuses INFO (PING answered: the store works,
        so the gate must not close over it; the maxmemory reserve check is off instead)."""
        try:
            return await self._memory_info()
        except NoPermissionError:
            self.memory_check = False
            self.errors.report(
                "store.check", "info refused", log,
                "redis refuses INFO to this worker's ACL user: the maxmemory reserve check "
                "is off, so new leases are not stopped before Redis is full (grant +info)",
            )
            return None

    async def _memory_info(self) -> Mapping[str, Any]:
        """`INFO memory` of every master: on a cluster each one can fill up on its own."""
        if isinstance(self.redis, RedisCluster):
            answer: Mapping[str, Any] = await self.redis.info(
                "memory", target_nodes=RedisCluster.PRIMARIES
            )
            return answer
        single: Mapping[str, Any] = await self.redis.info("memory")
        return single

    def _room(self, ok: bool, detail: str = "") -> None:
        if ok:
            if not self.has_room:
                self._recoveries.report(
                    "store", "room", log,
                    "redis memory is below the reserve again; new leases resume",
                    level=logging.INFO,
                )
            self.has_room = True
            self._update()
        else:
            self.mark_full(detail)

    async def wait_ready(self, timeout_s: float, *, what: str) -> bool:
        """At start-up: check until Redis answers, logging while it does not; False on
        timeout. A worker that cannot reach its store must not bind and fetch."""
        deadline = time.monotonic() + timeout_s
        started = time.monotonic()
        told_at = 0.0
        while True:
            if await self.check(quiet=True):
                if told_at:
                    log.info("redis at %s answers after %.1f s", what, time.monotonic() - started)
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if not told_at or now - told_at >= 10.0:
                log.warning(
                    "waiting for redis at %s (%s); no Action is fetched until it answers "
                    "(giving up after %.0f s); %s",
                    what, self.reason, timeout_s, UNREACHABLE_HINT["redis"],
                )
                told_at = now
            await asyncio.sleep(min(self.check_interval_s, max(0.0, deadline - now)))

    async def run(self) -> None:
        """Check forever, every `check_interval_s` (half that while the gate is closed)."""
        while True:
            interval = self.check_interval_s if self.accepting else self.check_interval_s / 2
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await self.check()


def _cause(exc: BaseException) -> str:
    """A short, secret-free cause: the class name, plus 'refused' for a refused connect."""
    if is_refused(exc):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "no answer within the check timeout"
    return type(exc).__name__


def is_refused(exc: BaseException) -> bool:
    """Whether Redis certainly never received the command: the connection was refused."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        text = str(seen)
        if "Connection refused" in text or "Connect call failed" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether Redis refused a write because it is at maxmemory (`noeviction`)."""
    return isinstance(exc, OutOfMemoryError) or "used memory > 'maxmemory'" in str(exc)


def _least_free(info: Mapping[str, Any]) -> tuple[int, int] | None:
    """(bytes free below maxmemory, maxmemory) of the fullest node; None: no limit set.

    A cluster client answers INFO with one document per node; a single server with one.
    """
    documents: list[Mapping[str, Any]]
    if "used_memory" in info:
        documents = [info]
    else:
        documents = [doc for doc in info.values() if isinstance(doc, Mapping)]
    worst: tuple[int, int] | None = None
    for doc in documents:
        maxmemory = int(doc.get("maxmemory", 0) or 0)
        if maxmemory <= 0:
            continue
        free = maxmemory - int(doc.get("used_memory", 0) or 0)
        if worst is None or free < worst[0]:
            worst = (free, maxmemory)
    return worst
