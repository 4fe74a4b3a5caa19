"""Channel ingress's Redis side: a follower's session lease and the session's cursor.

The three scripts (`ingress_lease`, `ingress_advance`, `ingress_release`, each with its
guarantee in its `.lua` file) run by EVALSHA like every other script of the store, hashed
once per client when the worker's stores are built (`worker.store.stores.Stores`). The keys
are `worker.store.keys.IngressKeys`. What the lease protects (one follower per session, a
cursor only its holder moves forward) is described in `worker.channel.ingress`.
"""

from __future__ import annotations

from typing import Any

from worker.store.keys import IngressKeys
from worker.store.scripts import Script, script_source


class IngressStore:
    """The session leases and cursors of one Redis client."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self._lease = Script(redis, script_source("ingress_lease"), name="ingress_lease")
        self._advance = Script(redis, script_source("ingress_advance"), name="ingress_advance")
        self._release = Script(redis, script_source("ingress_release"), name="ingress_release")

    async def hold(self, keys: IngressKeys, owner: str, ttl_ms: int) -> bool:
        """Take the session's lease, or renew `owner`'s own; True when `owner` holds it."""
        return int(await self._lease(keys=[keys.lease], args=[owner, ttl_ms])) == 1

    async def advance(self, keys: IngressKeys, owner: str, message_id: int) -> bool:
        """Move the cursor forward to `message_id`; False when `owner` no longer holds the
        lease (nothing was written)."""
        moved = await self._advance(keys=[keys.lease, keys.cursor], args=[owner, message_id])
        return int(moved) >= 0

    async def release(self, keys: IngressKeys, owner: str) -> bool:
        """Give `owner`'s lease back; False when it held none."""
        return int(await self._release(keys=[keys.lease], args=[owner])) == 1

    async def cursor(self, keys: IngressKeys) -> int:
        """The last message id the session's followers recorded (-1: none yet)."""
        stored = await self.redis.get(keys.cursor)
        return int(stored) if stored is not None else -1
