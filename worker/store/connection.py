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
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.secret_files import Secret

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
    """
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


_confirmations: weakref.WeakKeyDictionary[Any, WriteConfirmation] = weakref.WeakKeyDictionary()


def write_confirmation(redis: Any) -> WriteConfirmation | None:
    """The confirmation policy `open_redis` attached to this client (None: off)."""
    return _confirmations.get(redis)


def open_redis(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout_s: float = 5.0,
    password: Secret | None = None,
    max_connections: int = 256,
    confirm: WriteConfirmation | None = None,
) -> Redis | RedisCluster:
    """A client that reconnects by itself; callers decide what an ambiguous failure means.

    redis-py may resend a command after a connection error. That is safe here because every
    script is written to be re-run: with the same owner token it returns what the first run
    did (see each `.lua` header), so a resend is also the "re-read before deciding" step.
    """
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": socket_timeout_s,
        "health_check_interval": 10,
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
            url, max_connections=max_connections, timeout=None, **common
        )
        client = Redis.from_pool(pool)  # the client owns the pool: aclose() closes it
    if confirm is not None:
        _confirmations[client] = confirm
    return client
