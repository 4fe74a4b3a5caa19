"""Cancel notices wake a worker to re-read a durable cancel intent; they grant nothing.

A notice on `aip.hermes.{endpoint}.control.cancel` carries only an Action id and no
signature, so anyone allowed to publish on that subject could send one, or thirty thousand.
A notice therefore never cancels anything by itself: it marks an Action this worker holds
"re-read its intent now", and one task reads the intents of every marked Action in one
pipelined round trip, at most once per `min_interval_s`. Only an intent stored in Redis
(written by the authorized cancel path in `worker.control`) cancels.

The cost of a flood is bounded: a notice is a set insert (the set never holds more than
the Actions this worker runs); notices for Actions not held here are remembered in a small
LRU (for the moment between a lease acquisition and the execution's registration) and
otherwise dropped; Redis sees at most one round trip per interval. A dropped or late notice
only delays a cancel until the next heartbeat, which reads every held Action's intent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from schemas.ids import is_action_id
from worker.execution.cancel_signal import CancelSignal
from worker.store.keys import ActionKeys
from worker.store.lease_store import LeaseStore

log = logging.getLogger(__name__)

#: Shortest time between two re-read round trips caused by notices.
MIN_INTERVAL_S = 0.05
#: Notices for Actions not (yet) held here that are remembered, and for how long.
EARLY_NOTICES = 256
EARLY_NOTICE_S = 60.0


class Noticed(Protocol):
    """What a notice needs of an execution held here: where its durable intent lives and its
    cancel signal. A protocol, so that the executions' own module is not imported here (it
    imports the leases, which import this module)."""

    @property
    def keys(self) -> ActionKeys: ...

    @property
    def cancel_requested(self) -> CancelSignal: ...


E = TypeVar("E", bound=Noticed)


class CancelNotices(Generic[E]):
    """Coalesces notices into bounded re-reads of the durable intents of held Actions."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        holding: Callable[[str], E | None],
        cancel: Callable[[E], None],
        min_interval_s: float = MIN_INTERVAL_S,
    ) -> None:
        self.store = store
        self._holding = holding
        self._cancel = cancel
        self.min_interval_s = min_interval_s
        self._marked: set[str] = set()
        self._early: OrderedDict[str, float] = OrderedDict()
        self._wake = asyncio.Event()
        #: Counters for tests and metrics: notices seen, and re-read round trips made.
        self.received = 0
        self.rereads = 0

    def notice(self, action_id: str) -> None:
        """A notice named `action_id`: mark it for a re-read if it runs here. O(1)."""
        self.received += 1
        if not is_action_id(action_id):
            return
        if self._holding(action_id) is None:
            self._early[action_id] = time.monotonic()
            self._early.move_to_end(action_id)
            while len(self._early) > EARLY_NOTICES:
                self._early.popitem(last=False)
            return
        self._marked.add(action_id)
        self._wake.set()

    def registered(self, action_id: str) -> None:
        """An execution was just registered: a notice that came first marks it now."""
        noticed = self._early.pop(action_id, None)
        if noticed is not None and time.monotonic() - noticed < EARLY_NOTICE_S:
            self._marked.add(action_id)
            self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            marked, self._marked = self._marked, set()
            held = [e for e in map(self._holding, marked) if e is not None]
            held = [e for e in held if not e.cancel_requested.is_set()]
            if held:
                await self._reread(held)
            # Whatever arrives meanwhile is coalesced into the next single round trip.
            await asyncio.sleep(self.min_interval_s)

    async def _reread(self, held: list[E]) -> None:
        try:
            intents = await self.store.cancel_requested_many(
                [e.keys for e in held], budget_s=self.min_interval_s * 20
            )
        except Exception as exc:
            # Never fatal: the heartbeat reads every held intent anyway.
            log.info("cancel notice: intents not re-read (%s)", type(exc).__name__)
            return
        self.rereads += 1
        for execution, requested in zip(held, intents, strict=True):
            if requested and not execution.cancel_requested.is_set():
                self._cancel(execution)
