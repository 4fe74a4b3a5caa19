"""How many children one principal may have this gateway wait on at once.

Following a child costs the gateway little (one shared wake-up subscription per endpoint,
worker/bus/stream_reads.py), but each sync `aip_call` holds an HTTP request, a task and
a stream read every `POLL_S` for as long as the child runs, and before issue 27 each one
held a JetStream consumer: about 1,000 long sync calls of one principal reached the
server's consumer ceiling and broke every other caller. `FollowLimits` caps what each
principal (per tenant) holds at `AIPD_GATEWAY_MAX_FOLLOWS_PER_PRINCIPAL`: a sync call
past it is refused with `connector_host.capacity` (retryable) before anything is
enqueued, and an asynchronous child past it is not followed in memory at all (the recovery
sweep settles it from its result, worker/gateway/recovery.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from schemas.errors import ErrorCode
from worker.errors import ConnectorError
from worker.gateway.principals import Principal


def _key(principal: Principal) -> tuple[str, str]:
    return (principal.principal_id, principal.tenant_id or "")


class FollowLimits:
    """Counts the follows each principal holds in this process."""

    def __init__(self, max_per_principal: int) -> None:
        self.max_per_principal = max_per_principal
        self._held: dict[tuple[str, str], int] = {}

    def held(self, principal: Principal) -> int:
        return self._held.get(_key(principal), 0)

    def try_take(self, principal: Principal) -> bool:
        """One more follow for `principal` if it is under its cap (release it after)."""
        key = _key(principal)
        held = self._held.get(key, 0)
        if held >= self.max_per_principal:
            return False
        self._held[key] = held + 1
        return True

    def release(self, principal: Principal) -> None:
        key = _key(principal)
        left = self._held.get(key, 0) - 1
        if left > 0:
            self._held[key] = left
        else:
            self._held.pop(key, None)

    @contextmanager
    def hold(self, principal: Principal) -> Iterator[None]:
        """One follow for the block; `connector_host.capacity` when the cap is reached."""
        if not self.try_take(principal):
            raise ConnectorError(
                ErrorCode.HOST_CAPACITY,
                f"this principal already has {self.max_per_principal} calls waiting on this "
                "gateway (AIPD_GATEWAY_MAX_FOLLOWS_PER_PRINCIPAL); retry when one ends",
            )
        try:
            yield
        finally:
            self.release(principal)
