"""Open the Redis client: a single server or Redis Cluster, with reconnects built in.

The client also carries the deployment's write-confirmation policy (`WriteConfirmation`):
whether a write that must survive a failover waits for replicas (WAIT, or WAITAOF where the
server has it) before the worker acts on it. It travels with the client because it is a
property of the Redis deployment, and every store built on the client must honour it.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    NoPermissionError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.secret_files import Secret
from worker.store.multiplexed import HEALTH_INTERVAL_S, Multiplexed

_TRANSIENT = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    asyncio.TimeoutError,
    # Redis Cluster during a failover: slots without a master (CLUSTERDOWN) or in the middle
    # of a move (TRYAGAIN). The server refused the command, so sending it again is safe.
    ClusterDownError,
    TryAgainError,
)


def is_transient(exc: BaseException) -> bool:
    """Whether a Redis call failed in a way that a repeat of the same call may fix.

    The store's scripts all answer a repeat with what their first run did, so "may have run"
    and "did not run" are both safe to retry. Besides the usual connection errors this
    includes the cluster's failover refusals, and the errors a write raises when redis-py
    closed its connection under it: the async cluster pipeline (redis-py 8.1) answers a dead
    node by closing every connection of the whole client, including ones other tasks are
    writing to at that moment. Those writes never left the process.

    Refused credentials or permissions are not transient, although redis-py raises them as
    connection errors: no repeat fixes a wrong password file, so they fail at once.
    """
    if isinstance(exc, (AuthenticationError, AuthorizationError, NoPermissionError)):
        return False
    if isinstance(exc, _TRANSIENT):
        return True
    text = str(exc)
    if isinstance(exc, RuntimeError):
        return "handler is closed" in text  # uvloop: write on a closed transport
    if isinstance(exc, AttributeError):
        return "writelines" in text  # asyncio: write after the connection dropped its writer
    return False


@dataclass(frozen=True, slots=True)
class WriteConfirmation:
    """Wait for `replicas` replica acknowledgements (at most `timeout_ms` per wait).

    Redis replicates asynchronously: a master that acknowledged a write and died before
    shipping it can be replaced by a replica that never saw it. The operator's start claim
    is the write whose loss costs most (a second `POST /v1/runs`), so it is confirmed before
    the request is sent; see `OperatorStore` for which writes wait and what a timeout means.
    """

    replicas: int
    timeout_ms: int = 500

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.timeout_ms < 1:
            raise ValueError("a write confirmation needs replicas >= 1 and timeout_ms >= 1")


def _no_maint_notifications() -> Any:
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # redis-py before 7: no handshake to turn off
        return None
    return MaintNotificationsConfig(enabled=False)


_confirmations: weakref.WeakKeyDictionary[Any, WriteConfirmation] = weakref.WeakKeyDictionary()


def write_confirmation(redis: Any) -> WriteConfirmation | None:
    """The confirmation policy `open_redis` attached to this client (None: off)."""
    return _confirmations.get(redis)


class MultiplexedRedis(Redis):
    """redis-py's client plus the shared connection its script calls take (`Multiplexed`):
    everything else (pipelines, plain commands, the heartbeat) still uses the pool."""

    multiplexed: Multiplexed | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        if self.multiplexed is not None:
            await self.multiplexed.aclose()
        await super().aclose(close_connection_pool)


def multiplexed(redis: Any) -> Multiplexed | None:
    """The shared script connection of a client `open_redis` made (None: use redis-py)."""
    return redis.multiplexed if isinstance(redis, MultiplexedRedis) else None


def open_redis(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout_s: float = 5.0,
    password: Secret | None = None,
    max_connections: int = 256,
    confirm: WriteConfirmation | None = None,
    multiplex: bool = True,
) -> Redis | RedisCluster:
    """A client that reconnects by itself; callers decide what an ambiguous failure means.

    On a single server its script calls take one shared connection (`Multiplexed`) unless
    `multiplex` is off; everything else, and every call on a cluster, takes redis-py's own
    pooled connections. Both paths keep TCP keepalive on and check an idle connection's
    health every 10 s.

    redis-py may resend a command after a connection error. That is safe here because every
    script is written to be re-run: with the same owner token it returns what the first run
    did (see each `.lua` header), so a resend is also the "re-read before deciding" step.
    """
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        "health_check_interval": HEALTH_INTERVAL_S,
        "socket_keepalive": True,
        "retry": Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=2),
        "retry_on_error": [RedisConnectionError, RedisTimeoutError],
    }
    if password is not None:
        common["password"] = password.reveal()
    client: Redis | RedisCluster
    if cluster:
        client = RedisCluster.from_url(url, **common)
    else:
        # A blocking pool: past `max_connections`, a call waits for a free connection
        # instead of failing (redis-py's default pool raises MaxConnectionsError at 100,
        # which turned every delivery beyond 100 concurrent Redis calls into a redelivery).
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=None,
            # No CLIENT SETINFO pair and no maintenance-notification handshake on each new
            # connection (the handshake serves Redis Enterprise's proxy only).
            driver_info=None,
            maint_notifications_config=_no_maint_notifications(),
            **common,
        )
        # The client owns the pool: aclose() closes it (redis-py types `from_pool` as Redis).
        single = cast(MultiplexedRedis, MultiplexedRedis.from_pool(pool))
        if multiplex:
            single.multiplexed = Multiplexed.for_url(
                url,
                password=common.get("password"),
                timeout_s=socket_timeout_s,
                connect_timeout_s=socket_timeout_s,
                health_interval_s=HEALTH_INTERVAL_S,
            )
        client = single
    if confirm is not None:
        _confirmations[client] = confirm
    return client
