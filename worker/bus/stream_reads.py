"""Read what a stream stored on a subject with message gets only: no consumer, ever.

Why no consumer: a role that may create consumers may create *push* consumers, and a push
consumer's deliver subject is its creator's choice. Pointed at a subject a work-queue stream
binds, the server stores a copy of every message it delivers there (issue 24: 20,000 copies
each in ACTIONS, DELEGATIONS and EGRESS, never going inactive, until an admin purged them).
NATS permissions cannot tell a push consumer from a pull one (the create subject names the
stream, the consumer and the filter, never the deliver subject), so the gateway and worker
roles may create no consumer at all (compose/nats/nats.conf) and every reader outside the
workers' durable work consumers reads through `$JS.API.STREAM.MSG.GET` with `next_by_subj`:
the stored message with the lowest sequence >= `seq` on a subject (wildcards allowed).
Each read is one request; nothing is left on the server when a reader goes away.

Waiting for a message not stored yet: `Wakeups` keeps one core-NATS subscription per subject
pattern (the subject with its last token replaced by `*`, e.g. every result subject of one
endpoint) per connection while anyone waits on it, shared in memory by every waiter of that
connection: one gateway process follows any number of children with one subscription per
endpoint. A wake-up is
only a hint to read the stream again (a core message may be one no stream stored); the
waiter is registered before it reads, so a message stored between its read and its wait
still wakes it, and without any wake-up (a reconnect, a subscription the server refused) it
reads again every `POLL_S`: a lost hint costs latency, never a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from types import TracebackType

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from worker.bus.flush import flushed_in_order

log = logging.getLogger(__name__)

#: How often a waiter reads the stream again when no wake-up came.
POLL_S = 1.0
#: A bound on what one drained read returns (the stream's retention is the real limit).
MAX_DRAIN = 100_000


async def next_stored(
    js: JetStreamContext, stream: str, subject: str, seq: int
) -> RawStreamMsg | None:
    """The stored message on `subject` (wildcards allowed) with the lowest sequence >= `seq`;
    None when there is none (or no such stream). Other NATS errors are raised."""
    try:
        return await js.get_msg(stream, seq=max(1, seq), subject=subject, next=True)
    except NotFoundError:
        return None


async def drain(
    js: JetStreamContext, stream: str, subject: str, *, start_seq: int = 1, limit: int = MAX_DRAIN
) -> list[RawStreamMsg]:
    """Every message stored on `subject` from `start_seq`, oldest first, at most `limit`."""
    found: list[RawStreamMsg] = []
    seq = start_seq
    while len(found) < limit:
        msg = await next_stored(js, stream, subject, seq)
        if msg is None or msg.seq is None:
            break
        found.append(msg)
        seq = msg.seq + 1
    return found


def pattern_of(subject: str) -> str:
    """The shared subscription a subject's wake-ups arrive on: its last token a wildcard."""
    head, _, _ = subject.rpartition(".")
    return f"{head}.*" if head else subject


class Wakeups:
    """One core subscription per subject pattern for a connection, fanned out to waiters.

    A pattern is subscribed while anyone waits on one of its subjects and unsubscribed when
    the last waiter leaves, so a process that once followed an endpoint's chunks does not
    receive every chunk of that endpoint for the rest of its life."""

    _of: weakref.WeakKeyDictionary[NATS, Wakeups] = weakref.WeakKeyDictionary()

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self._subs: dict[str, Subscription] = {}
        self._lock = asyncio.Lock()
        self._waiters: dict[str, set[asyncio.Event]] = {}
        #: Waiters per pattern (a pattern's subscription lives while this is > 0).
        self._count: dict[str, int] = {}
        self._dropping: set[asyncio.Task[None]] = set()

    @classmethod
    def of(cls, nc: NATS) -> Wakeups:
        """The connection's shared instance (every follower on `nc` uses the same one)."""
        found = cls._of.get(nc)
        if found is None:
            found = cls._of[nc] = cls(nc)
        return found

    async def watch(self, subject: str) -> asyncio.Event:
        """An event set by every message published on `subject` from now on (release it
        with `unwatch`)."""
        event = asyncio.Event()
        self._waiters.setdefault(subject, set()).add(event)
        pattern = pattern_of(subject)
        self._count[pattern] = self._count.get(pattern, 0) + 1
        async with self._lock:
            if pattern not in self._subs:
                try:
                    self._subs[pattern] = await self.nc.subscribe(pattern, cb=self._on_msg)
                    # Active on the server before the caller's first read.
                    await flushed_in_order(self.nc, 2)
                except (NatsError, TimeoutError) as exc:  # polling still finds it
                    log.info("no wake-ups for %s: %s", pattern, type(exc).__name__)
        return event

    def unwatch(self, subject: str, event: asyncio.Event) -> None:
        waiters = self._waiters.get(subject)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[subject]
        pattern = pattern_of(subject)
        left = self._count.get(pattern, 1) - 1
        if left > 0:
            self._count[pattern] = left
            return
        self._count.pop(pattern, None)
        sub = self._subs.pop(pattern, None)
        if sub is not None:
            task = asyncio.get_running_loop().create_task(self._drop(sub))
            self._dropping.add(task)
            task.add_done_callback(self._dropping.discard)

    @staticmethod
    async def _drop(sub: Subscription) -> None:
        try:
            await sub.unsubscribe()
        except Exception as exc:  # a closed connection: nothing left to unsubscribe
            log.debug("unsubscribe failed: %s", type(exc).__name__)

    async def _on_msg(self, msg: Msg) -> None:
        for event in self._waiters.get(msg.subject, ()):
            event.set()


class SubjectFollower:
    """The messages a stream stores on one subject, in sequence order, as they arrive.

    `async with SubjectFollower(...) as f: msg = await f.next(timeout_s)`; `next` returns
    None when nothing new was stored within `timeout_s` (0: only what is stored already).
    A NATS error while reading (a reconnect) counts as nothing new yet.
    """

    def __init__(
        self, nc: NATS, stream: str, subject: str, *, start_seq: int = 1, poll_s: float = POLL_S
    ) -> None:
        self.js = nc.jetstream()
        self.wakeups = Wakeups.of(nc)
        self.stream = stream
        self.subject = subject
        #: The next stream sequence to read from.
        self.seq = max(1, start_seq)
        self.poll_s = poll_s
        self._event: asyncio.Event | None = None

    async def __aenter__(self) -> SubjectFollower:
        self._event = await self.wakeups.watch(self.subject)
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._event is not None:
            self.wakeups.unwatch(self.subject, self._event)
            self._event = None

    async def next(self, timeout_s: float) -> RawStreamMsg | None:
        assert self._event is not None, "use SubjectFollower as an async context manager"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        while True:
            self._event.clear()
            try:
                msg = await next_stored(self.js, self.stream, self.subject, self.seq)
            except (NatsError, TimeoutError) as exc:
                log.debug("reading %s failed: %s", self.subject, type(exc).__name__)
                msg = None
            if msg is not None and msg.seq is not None:
                self.seq = msg.seq + 1
                return msg
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), min(remaining, self.poll_s))
