"""The time trust decisions are made at: Redis `TIME`, read at most once per admission.

Expiry of identities, tenant bindings and approvals is decided on Redis' clock
(docs/architecture.md §5),
not on the worker's, so workers with skewed clocks agree about the same record. The read is
lazy: an admission that meets no expiry costs no round trip.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

from redis.exceptions import RedisError

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.store.connection import is_transient


def now_ms() -> int:
    """This worker's own wall clock in Unix ms: for the stamps and local deadlines no other
    worker has to agree with (chunk and result times, an Action's remaining time)."""
    return time.time_ns() // 1_000_000


class Clock(Protocol):
    async def now_ms(self) -> int: ...


#: How long transient failures (a Redis Cluster failover, a restart) may delay reading TIME.
TIME_BUDGET_S = 10.0


async def redis_now_ms(redis: Any, *, budget_s: float = TIME_BUDGET_S) -> int:
    """Redis TIME in Unix ms; raises RedisError/OSError when Redis does not answer.

    Transient failures are retried within `budget_s` (reading the clock has no effect, so a
    repeat is always safe); whatever the last attempt raised is raised after that.
    """
    deadline = time.monotonic() + budget_s
    delay = 0.02
    while True:
        try:
            seconds, micros = await redis.time()
            return int(seconds) * 1_000 + int(micros) // 1_000
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                if isinstance(exc, (RuntimeError, AttributeError)):
                    raise OSError(f"redis connection closed: {exc}") from None
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


class RedisClock:
    """One admission's view of now: the first call asks Redis, later calls reuse the answer."""

    __slots__ = ("_now", "_redis")

    def __init__(self, redis: Any) -> None:
        self._redis = redis
        self._now: int | None = None

    def offer(self, now_ms: int) -> None:
        """Use a Redis time another read of this admission returned (if none is read yet)."""
        if self._now is None:
            self._now = now_ms

    async def now_ms(self) -> int:
        if self._now is None:
            try:
                self._now = await redis_now_ms(self._redis)
            except (TimeoutError, RedisError, OSError) as exc:
                raise ConnectorError(
                    ErrorCode.HOST_NOT_READY,
                    f"trust check could not read Redis TIME: {type(exc).__name__}",
                ) from None
        return self._now


class FixedClock:
    """A clock that always answers `now`: for checks made outside an admission, and tests."""

    __slots__ = ("_now",)

    def __init__(self, now_ms: int) -> None:
        self._now = now_ms

    async def now_ms(self) -> int:
        return self._now
