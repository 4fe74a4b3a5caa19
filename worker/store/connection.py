"""Open the Redis client: a single server or Redis Cluster, with reconnects built in."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.secret_files import Secret


def open_redis(
    url: str,
    *,
    cluster: bool = False,
    socket_timeout_s: float = 5.0,
    password: Secret | None = None,
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
    if cluster:
        return RedisCluster.from_url(url, **common)
    return Redis.from_url(url, **common)
