"""The `Idempotency-Key` cache of non-streaming chat completions and responses.

What Hermes caches is the agent's *outcome*, not the HTTP reply: a replay reuses content and
usage but gets a fresh id and timestamp. Concurrent requests with the same key and body share
one agent run; the same key with a different body recomputes and replaces the entry. Memory
only, so a restart forgets it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from worker.testing.fake_hermes.agent import Failed, Finished

Outcome = Finished | Failed
MAX_ENTRIES = 1000


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    outcome: asyncio.Future[Outcome]
    expires_at: float


class IdempotencyCache:
    """Key → (body fingerprint, shared outcome), bounded in size and age."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def outcome(
        self, key: str, fingerprint: str, compute: Callable[[], Awaitable[Outcome]]
    ) -> Outcome:
        """The cached outcome for (key, fingerprint), computing it at most once."""
        clock = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and entry.fingerprint == fingerprint and entry.expires_at > clock:
            return await asyncio.shield(entry.outcome)
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._entries[key] = _Entry(fingerprint, future, clock + self._ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)
        try:
            result = await compute()
        except BaseException as exc:
            if self._entries.get(key) is not None and self._entries[key].outcome is future:
                del self._entries[key]
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # mark retrieved; concurrent waiters still receive it
            else:
                future.cancel()
            raise
        future.set_result(result)
        return result

    def clear(self) -> None:
        """Forget everything (a restart)."""
        self._entries.clear()
