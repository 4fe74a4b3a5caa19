"""Re-ask Redis after an ambiguous failure, within a budget: the one retry loop of the stores.

Every script here answers a repeat (with the same owner token) with what its first run did,
and plain reads have no effect, so after a lost reply or a failover refusal the safe next
step is always to ask again. A call on a pooled connection is shielded from cancellation so
a cancelled caller never leaves a half-read reply on it; a script call on the multiplexed
connection (`worker.store.multiplexed`) needs no shield, since an abandoned reply is dropped
there, and saves the task a shield costs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from worker.errors import StoreUnavailable
from worker.store.connection import is_transient

T = TypeVar("T")

FIRST_DELAY_S = 0.02
MAX_DELAY_S = 0.5


async def reask(
    fn: Callable[[], Awaitable[T]],
    *,
    budget_s: float,
    retry_if: Callable[[BaseException], bool] = is_transient,
    give_up_if: Callable[[BaseException], bool] | None = None,
    shield: bool = True,
) -> T:
    """`fn()` until it answers; a failure `retry_if` rejects is raised as it is, and a
    budget spent on retriable failures raises StoreUnavailable naming the last one.

    `give_up_if` names retriable failures not worth the rest of the budget (a refused
    connection, for a caller that can hand its work to another worker): StoreUnavailable
    at once. `shield=False` only for calls a cancellation cannot leave half-done on a
    connection (`Script.reasked` decides it for a script call)."""
    deadline = time.monotonic() + budget_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return await (asyncio.shield(fn()) if shield else fn())
        except Exception as exc:
            if not retry_if(exc):
                raise
            if give_up_if is not None and give_up_if(exc):
                raise StoreUnavailable(f"redis did not answer: {type(exc).__name__}") from None
            if time.monotonic() + delay > deadline:
                raise StoreUnavailable(f"redis did not answer: {type(exc).__name__}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)
