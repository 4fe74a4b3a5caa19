"""The pull loop: fetch only as many Actions as there are free slots, and never stop.

Nothing waits in a local buffer while its AckWait runs: a fetch asks for at most the free
execution slots, and for no more than the admission window has room for (the deliveries
fetched that no lease heartbeat keeps alive yet; `Slots` says why). An empty fetch is
normal (nats-py raises a timeout for it); any other failure — a NATS restart, a deleted
consumer, a lost connection — is logged and the loop binds again, so the pull consumer
resumes by itself (nats.py #504).

A fetch also waits for the `gate` (the store's health): a worker whose Redis is failing or
full leaves the queue to the workers that can lease and settle. And the consumer is not
even bound while `serving` (`worker/serving.py`) says the endpoint cannot be served (a
missing trust file, a Hermes refusing its key): the work waits for a worker that can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Protocol

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.errors import FetchTimeoutError

from worker.logs import RepeatedErrors

log = logging.getLogger(__name__)

MAX_BATCH = 128
#: Deliveries a worker may hold between their fetch and the lease heartbeat taking them
#: over (the admission window, `Slots`): a second's admissions on a slow, saturated machine
#: (~250/s in figure 4 on a 2-core VM), two fetches' worth, and far more than a worker
#: with its default concurrency ever has in admission at once.
MAX_ADMITTING = 256
#: A fetch that took longer than this may have held its first messages since the server
#: delivered them (nats-py reads a batch one message per event-loop pass, seconds on a
#: saturated worker): their AckWait is restarted at once (`_alive`).
SLOW_FETCH_S = 1.0

Handler = Callable[..., Awaitable[None]]


class FetchGate(Protocol):
    """Whether this worker may take new work now (`StoreHealth` is one, and
    `HeartbeatPressure`)."""

    @property
    def accepting(self) -> bool: ...

    async def wait_accepting(self) -> None: ...


class AllGates:
    """A fetch gate open while every one of `gates` is."""

    def __init__(self, *gates: FetchGate) -> None:
        self.gates = gates

    @property
    def accepting(self) -> bool:
        return all(gate.accepting for gate in self.gates)

    async def wait_accepting(self) -> None:
        """Until all are open at once: each closed one is waited for, then all are asked
        again (one may have closed meanwhile)."""
        while True:
            closed = next((gate for gate in self.gates if not gate.accepting), None)
            if closed is None:
                return
            await closed.wait_accepting()


class ServingCheck(Protocol):
    """Whether this worker can serve an endpoint at all now (`ServingGate` is one)."""

    def servable(self, endpoint_id: str) -> bool: ...

    async def wait_servable(self, endpoint_id: str) -> None: ...


class Slots:
    """A count of places taken, up to `capacity`, that a taker can wait on.

    Two kinds are shared by a worker's pull loops: its execution slots (how many Actions it
    runs; `AIPD_CONCURRENCY`, one set for Actions and egress and one for delegations) and
    its admission window (`MAX_ADMITTING`: how many deliveries it has fetched that nothing
    keeps alive yet). Slots bound how many Actions a worker runs, not how far its fetching
    runs ahead of its CPU. A delivery's in-progress signals start once its lease is held
    (the heartbeat sends them, `worker.execution.leases`); before that -- decode,
    signature, admission, the lease -- its AckWait runs. With 10,000 slots a saturated
    worker fetched all 10,000 held-run Actions within seconds, and the ones still waiting
    their turn to be leased outlived AckWait and came back as redeliveries (806 of 10,000 in
    figure 4 on a slow machine), each costing a second decode and verification while the
    CPU was already short. So a fetched delivery also holds a place in the window until
    `admitted` (called where the lease keeper takes it over) or until its handling ends,
    and a fetch asks for no more than both have free: what the worker cannot admit soon
    stays on the stream, where no AckWait runs.

    `give` is synchronous, so `admitted` can be called from the lease keeper's `add`.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        #: Set while a place is free.
        self._free = asyncio.Event()
        self._free.set()
        #: Set while no place is taken.
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def free(self) -> int:
        return self.capacity - self.in_use

    async def wait_free(self) -> int:
        """Wait until a place is free; how many are."""
        while self.free <= 0:
            self._free.clear()
            await self._free.wait()
        return self.free

    def take(self, n: int) -> None:
        self.in_use += n
        if self.in_use > 0:
            self._idle.clear()

    def give(self, n: int = 1) -> None:
        self.in_use -= n
        if self.free > 0:
            self._free.set()
        if self.in_use == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        async def idle() -> None:
            while self.in_use != 0:
                self._idle.clear()
                await self._idle.wait()

        try:
            await asyncio.wait_for(idle(), timeout_s)
        except TimeoutError:
            return False
        return True


class _Place:
    """One delivery's place in the admission window, given back once (`admitted` or the
    end of its handling), and when its fetch returned."""

    __slots__ = ("fetched_at", "msg", "taken", "window")

    def __init__(self, window: Slots, msg: Msg, fetched_at: float) -> None:
        self.window = window
        self.msg = msg
        self.fetched_at = fetched_at
        self.taken = True

    def give_back(self) -> None:
        if self.taken:
            self.taken = False
            self.window.give()


#: The place of the delivery the current task handles (each fetched message is handled in
#: its own task, `PullLoop._one`, so its context carries its own place).
_place: ContextVar[_Place | None] = ContextVar("aip_admission_place", default=None)
#: The in-progress signals of slow admissions, kept until sent.
_signals: set[asyncio.Task[None]] = set()


def admitted() -> None:
    """The current delivery is kept alive by the lease heartbeat from now on: its place in
    the admission window is free for the next fetch. A no-op outside a pull loop's task.

    A delivery that took longer than `SLOW_FETCH_S` from its fetch to its lease (a swamped
    loop) restarts its AckWait here: its first heartbeat signal may be a whole heartbeat
    interval away, and the time spent in admission already counts against the AckWait.
    """
    place = _place.get()
    if place is None or not place.taken:
        return
    place.give_back()
    if time.monotonic() - place.fetched_at > SLOW_FETCH_S:
        signal = asyncio.get_running_loop().create_task(_alive([place.msg]))
        _signals.add(signal)
        signal.add_done_callback(_signals.discard)


class PullLoop:
    """Fetch from one durable consumer and hand each message to the delivery handler."""

    def __init__(
        self,
        js: JetStreamContext,
        *,
        stream: str,
        durable: str,
        subject: str,
        slots: Slots,
        handle: Callable[[object], Awaitable[None]],
        fetch_timeout_s: float = 2.0,
        gate: FetchGate | None = None,
        errors: RepeatedErrors | None = None,
        endpoint_id: str = "",
        serving: ServingCheck | None = None,
        window: Slots | None = None,
    ) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.subject = subject
        self.slots = slots
        self.handle = handle
        self.fetch_timeout_s = fetch_timeout_s
        #: Asked before each fetch: no fetch while it refuses new work.
        self.gate = gate
        #: Asked before binding and before each fetch: unbound while it says no.
        self.endpoint_id = endpoint_id
        self.serving = serving
        #: Shared by the worker's pull loops: how many fetched deliveries may await a lease.
        self.window = window if window is not None else Slots(MAX_ADMITTING)
        #: A NATS outage fails every bind and fetch alike: logged once per cause per interval.
        self.errors = errors if errors is not None else RepeatedErrors()
        self.stopping = asyncio.Event()
        self.bound = False
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        backoff = 0.1
        while not self.stopping.is_set():
            if self.serving is not None and not self.serving.servable(self.endpoint_id):
                await self._until_stopping_or(self.serving.wait_servable(self.endpoint_id))
                continue
            try:
                sub = await self.js.pull_subscribe_bind(self.durable, stream=self.stream)
            except Exception as exc:
                self.bound = False
                self.errors.report(
                    f"bind {self.durable}", type(exc).__name__, log,
                    "cannot bind %s/%s: %s", self.stream, self.durable, exc,
                )
                await self._pause(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if not self.bound:
                log.info("bound to consumer %s/%s", self.stream, self.durable)
            self.bound = True
            backoff = 0.1
            try:
                await self._fetch_until_error(sub)
            finally:
                self.bound = False
                await _quiet_unsubscribe(sub)

    async def _fetch_until_error(self, sub: JetStreamContext.PullSubscription) -> None:
        while not self.stopping.is_set():
            await self.slots.wait_free()
            if self.serving is not None and not self.serving.servable(self.endpoint_id):
                log.warning("unbinding %s/%s: this worker cannot serve %s now (see /ready)",
                            self.stream, self.durable, self.endpoint_id)
                return
            if self.gate is not None and not self.gate.accepting:
                await self._until_stopping_or(self.gate.wait_accepting())
            if self.stopping.is_set():
                return
            # The room is read, not reserved: an idle consumer's fetch waits up to
            # `fetch_timeout_s` for its first message, and a reservation held through that
            # wait would starve the loops that have work (one window, many consumers). So
            # loops fetching at the same moment can overshoot the limit, by at most what
            # each of them asked for.
            await self.window.wait_free()
            if self.gate is not None and not self.gate.accepting:
                # Closed while this loop waited for window room: the window fills exactly
                # when the worker is swamped, which is when the heartbeat gate closes, and a
                # fetch now would take the very work the gate is there to leave on the bus.
                continue
            batch = min(self.window.free, self.slots.free, MAX_BATCH)
            if batch <= 0:
                continue
            asked_at = time.monotonic()
            try:
                msgs = await sub.fetch(batch, timeout=self.fetch_timeout_s)
            except (TimeoutError, FetchTimeoutError, NatsTimeoutError):
                continue
            except Exception as exc:
                self.errors.report(
                    f"fetch {self.durable}", type(exc).__name__, log,
                    "fetch from %s failed (%s); binding again", self.durable, exc,
                )
                await self._pause(0.2)
                return
            fetched_at = time.monotonic()
            if fetched_at - asked_at > SLOW_FETCH_S:
                await _alive(msgs)
            self.window.take(len(msgs))
            self.slots.take(len(msgs))
            for msg in msgs:
                task = asyncio.get_running_loop().create_task(
                    self._one(msg, _Place(self.window, msg, fetched_at))
                )
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _one(self, msg: object, place: _Place) -> None:
        _place.set(place)
        try:
            await self.handle(msg)
        finally:
            place.give_back()
            self.slots.give()

    async def _until_stopping_or(self, waiting: Awaitable[None]) -> None:
        """Wait for `waiting`, or less when the loop is stopped meanwhile."""
        task = asyncio.ensure_future(waiting)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (task, stop):
                pending.cancel()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    def stop(self) -> None:
        self.stopping.set()


async def _alive(msgs: list[Msg]) -> None:
    """Restart the AckWait of deliveries that waited inside a slow fetch (a buffered
    in-progress signal each; a lost one only leaves the AckWait shorter)."""
    for msg in msgs:
        with contextlib.suppress(Exception):
            await msg.in_progress()


async def _quiet_unsubscribe(sub: JetStreamContext.PullSubscription) -> None:
    with contextlib.suppress(Exception):  # the connection may already be gone
        await sub.unsubscribe()
