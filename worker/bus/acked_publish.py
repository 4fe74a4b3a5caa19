"""JetStream publishes whose acknowledgements return on one reply subscription of ours.

Why: a chunk is a JetStream publish confirmed later (`BusPublisher.confirm`). nats-py's
`publish_async` makes each one a random reply token (an `os.urandom` system call), a
semaphore wait through `asyncio.wait_for`, and parses the acknowledgement with `json` into
a dataclass: ~19.5 µs of CPU per chunk on the benchmark machine. Here the token is a
counter under one inbox prefix, a free slot is taken without a timer, and the
acknowledgement is decoded by msgspec: ~9 µs (BENCHMARKS.md, figures 1 and 3). The
future of a publish (`_AckFuture`) gives its slot back itself, when its acknowledgement is
set or when its waiter cancels it, instead of through a done callback: a callback per
chunk was a scheduled loop handle, a closure and a method call for each one (~3 µs).

The answers are nats-py's own: a `PubAck`, `NoStreamResponseError` when no stream listens
(the server's 503 status), or the `APIError` subclass JetStream's error names (a full
stream's `err_code` included), so `BusPublisher` treats both paths alike. At most
`max_pending` publishes wait for acknowledgements; past that a publish waits for a slot up
to `wait_stall_s`, then raises `TooManyStalledMsgsError`, as nats-py does.

The awaited publishes of an Action (its result) and the confirmed ack of its delivery
(`ack_sync`) take the same subscription (`publish_awaited`, `ack_confirmed`): nats-py's
request makes each a NUID and random token, an `asyncio.wait_for` and, for a publish, a
`json` parse of the PubAck; the same answers, with the same errors, cost about half here.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import MsgAlreadyAckdError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import PubAck
from nats.js.errors import APIError, NoStreamResponseError, TooManyStalledMsgsError

T = TypeVar("T")

#: nats-py's default bound on publishes waiting for an acknowledgement.
DEFAULT_MAX_PENDING = 4000
_NO_RESPONDERS = "503"
#: The reply tokens of confirmed acks and of awaited publishes start with these (a
#: `publish`'s are digits only).
_ACK_MARK = "a"
_AWAITED_MARK = "r"


class _Answer(msgspec.Struct):
    """A JetStream publish acknowledgement, or the error JetStream answered instead."""

    stream: str = ""
    seq: int = 0
    domain: str | None = None
    duplicate: bool | None = None
    error: dict[str, Any] | None = None


_decode_answer = msgspec.json.Decoder(_Answer).decode


def _api_error(error: dict[str, Any]) -> Exception:
    """nats-py's exception for a JetStream error (its `from_error` raises it: caught here)."""
    try:
        made: Any = APIError.from_error(error)
    except APIError as raised:
        return raised
    except (KeyError, TypeError):
        return APIError(description=str(error.get("description", "JetStream refused")))
    return made if isinstance(made, Exception) else APIError(description=str(error))


class _AckFuture(asyncio.Future[PubAck]):
    """The future of one publish: cancelling it (the waiter gave up) frees its slot; an
    acknowledgement frees it in `AckedPublisher._on_answer` before setting the result."""

    __slots__ = ("_publisher", "_token")
    # No __init__ of its own (a Python-level call per chunk): `AckedPublisher.publish` sets
    # both slots right after making it.
    _publisher: AckedPublisher
    _token: str

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg):
            return False
        self._publisher._forget(self._token)
        return True


class AckedPublisher:
    """Publishes to JetStream on one connection; each returns a future of its `PubAck`."""

    def __init__(self, nc: NATS, *, max_pending: int = DEFAULT_MAX_PENDING) -> None:
        self.nc = nc
        #: Slots free for a publish: `max_pending` less the publishes waiting for their
        #: acknowledgement and the slots handed to stalled publishes. A counter, not an
        #: `asyncio.Semaphore`: its `locked()` and `acquire()` walk the waiters (an `any()`
        #: generator) on every call, twice per chunk.
        self._free = max_pending
        #: Publishes waiting for a slot, oldest first; a freed slot goes to the first one
        #: still waiting.
        self._stalled: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tokens = itertools.count()
        self._waiting: dict[str, _AckFuture] = {}
        #: Awaited publishes (`publish_awaited`) and confirmed acks (`ack_confirmed`)
        #: waiting for the server's answer.
        self._awaited: dict[str, asyncio.Future[PubAck]] = {}
        self._acks: dict[str, asyncio.Future[None]] = {}
        self._prefix: str | None = None
        self._starting: asyncio.Lock | None = None
        #: The event loop the futures belong to (the first publish's).
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def pending(self) -> int:
        """Publishes still waiting for their acknowledgement."""
        return len(self._waiting)

    async def publish(
        self, subject: str, payload: bytes, headers: dict[str, str], wait_stall_s: float
    ) -> asyncio.Future[PubAck]:
        """Send now; the returned future completes with the acknowledgement (or its error).
        Cancelling the future gives its slot back; a late acknowledgement is dropped."""
        prefix = self._prefix or await self._start()
        if self._free > 0 and not self._stalled:
            self._free -= 1  # a free slot: taken without suspending
        else:
            await self._stall(wait_stall_s)
        token = str(next(self._tokens))
        future = _AckFuture(loop=self.loop)
        future._publisher, future._token = self, token
        self._waiting[token] = future
        try:
            await self.nc.publish(subject, payload, reply=prefix + token, headers=headers)
        except BaseException:
            future.cancel()
            raise
        return future

    async def publish_awaited(
        self, subject: str, payload: bytes, headers: dict[str, str], timeout_s: float
    ) -> PubAck:
        """A publish whose acknowledgement is awaited for up to `timeout_s`: what nats-py's
        `js.publish` answers, `nats.errors.TimeoutError` when none came. It takes none of
        `publish`'s slots (as `js.publish` took none): its caller's own wait bounds it, so a
        result never waits behind a flood of chunks still unconfirmed."""
        return await self._ask(self._awaited, _AWAITED_MARK, subject, payload, headers, timeout_s)

    async def ack_confirmed(self, msg: Msg, timeout_s: float) -> None:
        """`msg.ack_sync(timeout_s)`: the ack, and the server's answer that it processed it
        (`nats.errors.TimeoutError` without one, `NoRespondersError` when nobody listens on
        the reply subject, `MsgAlreadyAckdError` for a message already answered)."""
        if msg.is_acked:  # as nats-py's `_check_reply`
            raise MsgAlreadyAckdError(msg)
        if not msg.reply:
            raise NatsError("no reply subject available")
        await self._ask(self._acks, _ACK_MARK, msg.reply, b"", None, timeout_s)
        # nats-py has no public setter: its own `ack_sync` marks the message the same way,
        # so `is_acked` and a second ack (`MsgAlreadyAckdError`) behave as they do there.
        msg._ackd = True

    async def _ask(
        self,
        waiting: dict[str, asyncio.Future[T]],
        mark: str,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None,
        timeout_s: float,
    ) -> T:
        """One request answered on this publisher's reply subscription (`_on_answer` sets
        the future filed under its token in `waiting`), waited for up to `timeout_s`."""
        prefix = self._prefix or await self._start()
        token = mark + str(next(self._tokens))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        waiting[token] = future
        expiry: asyncio.TimerHandle | None = None
        try:
            await self.nc.publish(subject, payload, reply=prefix + token, headers=headers)
            # A timer that fails the future, not `asyncio.timeout` around the wait: the
            # same bound, without a Timeout object, a task lookup and the uncancel
            # bookkeeping on every result and every confirmed ack (~0.5% of an Action).
            expiry = loop.call_later(timeout_s, _expire, future)
            return await future
        finally:
            if expiry is not None:
                expiry.cancel()
            waiting.pop(token, None)
            future.cancel()  # a no-op once answered

    async def _stall(self, wait_stall_s: float) -> None:
        """Wait up to `wait_stall_s` for a slot handed over by `_release`, in arrival
        order; TooManyStalledMsgsError when none came (as nats-py's `publish_async`)."""
        assert self.loop is not None
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._stalled.append(waiter)
        try:
            async with asyncio.timeout(wait_stall_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot just as the wait ended: pass it on
            else:
                waiter.cancel()  # `_release` skips it
            if isinstance(exc, TimeoutError):
                raise TooManyStalledMsgsError from None
            raise

    def _release(self) -> None:
        """A slot is free: to the oldest stalled publish still waiting, else counted."""
        stalled = self._stalled
        while stalled:
            waiter = stalled.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _forget(self, token: str) -> None:
        if self._waiting.pop(token, None) is not None:
            self._release()

    async def _start(self) -> str:
        """Subscribe to this publisher's reply prefix once (concurrent first callers wait)."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._prefix is None:
                self.loop = asyncio.get_running_loop()
                prefix = self.nc.new_inbox() + "."
                await self.nc.subscribe(prefix + "*", cb=self._on_answer)
                self._prefix = prefix
            return self._prefix

    async def _on_answer(self, msg: Msg) -> None:
        assert self._prefix is not None
        token = msg.subject[len(self._prefix) :]
        if token.startswith(_ACK_MARK):
            acked = self._acks.get(token)
            if acked is not None and not acked.done():
                if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
                    acked.set_exception(NoRespondersError())
                else:
                    acked.set_result(None)
            return
        future: asyncio.Future[PubAck] | None = (
            self._awaited.get(token)
            if token.startswith(_AWAITED_MARK)
            else self._waiting.get(token)
        )
        if future is None or future.done():
            return
        self._forget(token)  # answered: the slot is free whatever the answer says
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            answer = _decode_answer(msg.data)
        except msgspec.DecodeError:
            future.set_exception(NatsError("JetStream answered a publish with no PubAck"))
            return
        if answer.error is not None:
            future.set_exception(_api_error(answer.error))
            return
        future.set_result(
            PubAck(
                stream=answer.stream,
                seq=answer.seq,
                domain=answer.domain,
                duplicate=answer.duplicate,
            )
        )


def _expire(future: asyncio.Future[Any]) -> None:
    """`_ask`'s bound: no answer came in time (nats-py's TimeoutError, as `js.publish`)."""
    if not future.done():
        future.set_exception(NatsTimeoutError())
