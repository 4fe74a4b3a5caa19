"""One pipelined Redis connection shared by every script call of a process, and by the
heartbeat's renewal of every held lease (`execute_many`).

Why: a store call through redis-py takes a connection from the pool, wraps the write and
the read each in a timeout, runs them through its retry helper and puts the connection
back; on the benchmark machine that is ~50 µs of CPU per call, and an operator Action makes
about eight of them (docs/architecture.md §12, BENCHMARKS.md). Redis answers the commands
of one connection in the order it received them, so any number of tasks can share one
connection: a call writes its packed command and waits on a future, and the reader hands
each reply to the oldest waiting future. That is ~11 µs per call, with no pool, no lock and
no task per call.

What stays the same as redis-py's path, because the stores rely on it:
- replies are the same Python values (hiredis, bytes not decoded), and an error reply is
  raised as the same redis-py exception class (`NoScriptError`, `OutOfMemoryError`, …);
- a lost connection fails every call waiting on it with `ConnectionError`, and a call
  unanswered for `timeout_s` fails with `TimeoutError` after the connection is closed (its
  replies can no longer be matched), so `is_transient` and the stores' re-ask treat both
  as before; the next call connects again;
- a refused connection says "Connection refused", which `is_refused` recognises.

What is different, deliberately: a caller cancelled while it waits leaves nothing behind on
the connection (its future is dropped when its reply arrives), so these calls need no
shield against cancellation.

Health: a shared connection that silently died (a Redis host gone without a FIN, a NAT or
firewall entry dropped, a frozen server) would make every call on it wait out `timeout_s`.
So the socket has TCP keepalive on, and a connection that heard nothing for
`health_interval_s` while no call waits sends a PING; an unanswered PING fails the
connection like any unanswered call (every waiter gets `TimeoutError`), and a lost
connection is replaced at once in the background, so the next call finds a fresh one.

Only single servers reached over TCP (`redis://`) are served here; TLS, Unix sockets and
Redis Cluster keep redis-py's own connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


def pack(args: tuple[Any, ...]) -> bytes:
    """One command in RESP; the one place this module encodes what it sends (the bench's
    command counter wraps it)."""
    return hiredis.pack_command(args)  # type: ignore[no-any-return]


#: How long a connection may hear nothing before it asks Redis for a PING (redis-py's
#: `health_check_interval` in `open_redis` is the same).
HEALTH_INTERVAL_S = 10.0


def _keepalive(sock: Any, idle_s: float) -> None:
    """TCP keepalive on the connection's socket, so the kernel also notices a peer that
    vanished; the probes start after `idle_s` (where the platform lets us say so)."""
    if sock is None:  # a transport without a socket (a test's pipe): nothing to set
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(idle_s))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, idle // 3)),
                        ("TCP_KEEPCNT", 3)):  # fmt: skip
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _read_quietly(future: asyncio.Future[Any]) -> None:
    """A health PING's answer matters only by arriving; its failure is the connection's."""
    if not future.cancelled():
        future.exception()


class _Wire(asyncio.Protocol):
    """One TCP connection: writes commands, resolves waiting futures in reply order."""

    def __init__(
        self,
        timeout_s: float,
        health_interval_s: float = HEALTH_INTERVAL_S,
        on_lost: Callable[[_Wire], None] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.health_interval_s = health_interval_s
        #: Told once when the connection fails, whatever failed it.
        self.on_lost = on_lost
        # Error replies become redis-py's own exceptions (NOSCRIPT → NoScriptError, OOM →
        # OutOfMemoryError…), made by its own parser, as its hiredis connections do.
        self.reader = hiredis.Reader(replyError=BaseParser.parse_error)
        #: (future, monotonic time sent) of every command not answered yet, oldest first.
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        #: Commands queued in this loop turn, written together by `_flush`.
        self.outbox: list[bytes] = []
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.loop = asyncio.get_running_loop()
        self._watchdog: asyncio.TimerHandle | None = None
        #: Loop time of the last bytes Redis sent (or of the connect).
        self.heard_at = self.loop.time()
        self._health: asyncio.TimerHandle | None = None
        #: Health PINGs sent (for tests and the benchmark's command count).
        self.pings = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, so no isinstance.
        self.transport = cast(asyncio.Transport, transport)
        _keepalive(transport.get_extra_info("socket"), self.health_interval_s)
        self.heard_at = self.loop.time()
        self._health = self.loop.call_later(self.health_interval_s, self._check_health)

    def _check_health(self) -> None:
        """Every `health_interval_s`: a connection idle that long, with no call waiting,
        sends a PING; the watchdog fails the connection when it goes unanswered (a call
        waiting is already watched)."""
        self._health = None
        if self.closed:
            return
        idle = self.loop.time() - self.heard_at
        if not self.waiting and idle >= self.health_interval_s:
            self.pings += 1
            self.send(pack(("PING",))).add_done_callback(_read_quietly)
            idle = 0.0
        self._health = self.loop.call_later(self.health_interval_s - idle, self._check_health)

    def send(self, command: bytes) -> asyncio.Future[Any]:
        """Queue `command`; every command queued in this loop turn goes out in one write.

        A socket write is a system call, and on the benchmark machine that call was most of
        the cost of a command; with many Actions in flight several commands are queued per
        turn, so one write carries them all. Replies still come in the order written.
        """
        future: asyncio.Future[Any] = self.loop.create_future()
        if self.closed:
            # A caller can hold a connection that failed after it was handed out (a reset
            # right after the connect, while the caller waited to resume). Queued here, the
            # call would never be written, and `fail` (already done) would never answer it:
            # it waited forever while the lease's heartbeat, on the next connection, kept
            # its Action held (docs/reliability.md, bug 5). It fails now, as transient.
            future.set_exception(RedisConnectionError("Connection closed before the call."))
            return future
        if not self.outbox:
            self.loop.call_soon(self._flush)
        self.outbox.append(command)
        sent_at = self.loop.time()
        self.waiting.append((future, sent_at))
        if self._watchdog is None:
            self._watchdog = self.loop.call_at(sent_at + self.timeout_s, self._check)
        return future

    def _flush(self) -> None:
        outbox, self.outbox = self.outbox, []
        if self.closed or self.transport is None:
            return  # `fail` already answered every waiting call
        self.transport.write(b"".join(outbox))

    def _check(self) -> None:
        """One timer per connection, not per call: it fires at the oldest call's deadline."""
        self._watchdog = None
        if not self.waiting:
            return
        oldest_sent = self.waiting[0][1]
        if self.loop.time() >= oldest_sent + self.timeout_s:
            self.fail(RedisTimeoutError(f"Timeout reading from Redis after {self.timeout_s} s"))
            return
        self._watchdog = self.loop.call_at(oldest_sent + self.timeout_s, self._check)

    def data_received(self, data: bytes) -> None:
        self.heard_at = self.loop.time()
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        while True:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as exc:
                self.fail(RedisConnectionError(f"Protocol error from Redis: {exc}"))
                return
            if reply is False:
                return
            if not waiting:
                self.fail(RedisConnectionError("Redis sent a reply nobody asked for"))
                return
            future, _ = waiting.popleft()
            if future.done():
                continue  # its caller was cancelled or timed out: the reply is dropped
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError("Connection closed by server."))

    def fail(self, error: Exception) -> None:
        """Close for good: every waiting call gets `error` (the first) or a connection error."""
        if self.closed:
            return
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._health is not None:
            self._health.cancel()
            self._health = None
        waiting, self.waiting = self.waiting, deque()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(error)
                error = RedisConnectionError("Connection closed while waiting for a reply.")
        if self.transport is not None:
            self.transport.abort()
        if self.on_lost is not None:
            self.on_lost(self)


class Multiplexed:
    """Calls on one shared connection to a single Redis server, reconnecting on demand."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.host = host
        self.port = port
        self.db = db
        self.username = username
        self.password = password
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.health_interval_s = health_interval_s
        self._wire: _Wire | None = None
        self._connecting: asyncio.Future[_Wire] | None = None
        #: The background replacement of a lost connection (`_replace`).
        self._replacing: asyncio.Task[None] | None = None
        self._closed = False
        #: Connections opened so far (the first, and each replacement).
        self.connects = 0

    @classmethod
    def for_url(
        cls,
        url: str,
        *,
        password: str | None = None,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 5.0,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> Multiplexed | None:
        """A multiplexed connection for a plain `redis://` URL; None for TLS or a socket."""
        options = parse_url(url)
        if "connection_class" in options or "host" not in options:
            return None
        return cls(
            str(options["host"]),
            int(options.get("port", 6379)),
            db=int(options.get("db", 0) or 0),
            username=options.get("username"),
            password=password if password is not None else options.get("password"),
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            health_interval_s=health_interval_s,
        )

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply (an error reply raises)."""
        wire = self._live() or await self._connected()
        return await wire.send(pack(args))

    async def execute_many(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send `commands` in one write and return their replies, in order; the first error
        reply is raised (as redis-py's pipeline does), after every reply has arrived.

        The caller wakes once, when the last reply is in: replies come in the order
        written, so the rest are in by then. This is what keeps the heartbeat's renewal of
        thousands of leases (`LeaseStore.renew_many`) to a few passes of the event loop. On
        redis-py's pipeline it took one pass per socket read and per write drain, and on a
        swamped loop each pass is slow: with the worker held to a third of a core a
        renewal took 7-9 s, past the 12 s a lease is trusted for after its previous one
        (BENCHMARKS.md, "Where one process's time goes while measured")."""
        if not commands:
            return []
        wire = self._live() or await self._connected()
        futures = [wire.send(pack(command)) for command in commands]
        try:
            with contextlib.suppress(Exception):  # an error reply is read below, in order
                await futures[-1]
        except BaseException:  # cancelled: the replies still to come are dropped unread
            for future in futures:
                future.add_done_callback(_read_quietly)
            raise
        # Every future is answered by now: replies, and a failed connection's errors, are
        # handed out in the order the commands were written.
        replies = []
        for future in futures:
            error = future.exception()
            if error is not None:
                for rest in futures:
                    rest.add_done_callback(_read_quietly)
                raise error
            replies.append(future.result())
        return replies

    def _live(self) -> _Wire | None:
        """The connection a call may use now, without connecting (None: connect first);
        a call reopens a client that was closed."""
        self._closed = False
        wire = self._wire
        if wire is None or wire.closed or wire.loop is not asyncio.get_running_loop():
            return None
        return wire

    async def _connected(self) -> _Wire:
        """The live connection; concurrent callers share one connect."""
        connecting = self._connecting
        loop = asyncio.get_running_loop()
        if connecting is None or connecting.get_loop() is not loop:
            connecting = self._connecting = loop.create_task(self._connect())
            # Read by every waiter, or here when all of them were cancelled.
            connecting.add_done_callback(lambda done: done.cancelled() or done.exception())
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done():
                self._connecting = None

    async def _connect(self) -> _Wire:
        timeout_s, interval_s = self.timeout_s, self.health_interval_s
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, wire = await asyncio.get_running_loop().create_connection(
                    lambda: _Wire(timeout_s, interval_s, self._lost), self.host, self.port
                )
        except TimeoutError:
            raise RedisTimeoutError(f"Timeout connecting to {self.host}:{self.port}") from None
        except OSError as exc:
            raise RedisConnectionError(
                f"Error connecting to {self.host}:{self.port}: {exc}"
            ) from exc
        try:
            if self.password is not None:
                credentials = (self.username, self.password) if self.username else (self.password,)
                await wire.send(pack(("AUTH", *credentials)))
            if self.db:
                await wire.send(pack(("SELECT", self.db)))
        except BaseException:
            wire.fail(RedisConnectionError("Redis refused the connection's set-up"))
            raise
        self.connects += 1
        old, self._wire = self._wire, wire
        if old is not None and not old.closed:
            old.fail(RedisConnectionError("Connection replaced."))
        return wire

    def _lost(self, wire: _Wire) -> None:
        """The current connection failed (a missed answer, the server gone): connect again
        now, in the background, rather than in the next caller's time."""
        if wire is not self._wire or self._closed or self._replacing is not None:
            return
        self._replacing = wire.loop.create_task(self._replace())

    async def _replace(self) -> None:
        try:
            # A failure is not kept: the next call connects again and raises its own error.
            with contextlib.suppress(RedisConnectionError, RedisTimeoutError):
                await self._connected()
        finally:
            self._replacing = None

    async def aclose(self) -> None:
        """Close the connection (calls still waiting fail with a connection error); like
        redis-py's client, a later call connects again."""
        self._closed = True
        replacing, self._replacing = self._replacing, None
        if replacing is not None and not replacing.done():
            replacing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await replacing
        connecting = self._connecting
        if connecting is not None and not connecting.done():
            connecting.cancel()  # a connect still on its way must not outlive the close
        wire, self._wire = self._wire, None
        if wire is not None and not wire.closed:
            wire.fail(RedisConnectionError("the Redis client is closed"))
