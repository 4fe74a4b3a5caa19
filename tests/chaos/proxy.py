"""A fault-injecting TCP proxy: what a network partition looks like to one worker.

Each worker reaches NATS, Redis and Hermes through its own `FaultProxy` per dependency, so
the nemesis can cut exactly one link (one worker from Redis, say) while every other link
works. The faults are what a real network does to a TCP connection:

* a **cut** in one direction (`up`: worker to server, `down`: server to worker) stops
  forwarding bytes that way. The bytes are held, not discarded, as TCP retransmits them:
  when the cut heals they arrive late, in order, which is exactly the "a request that left
  before the partition lands after the lease expired" case. Both directions cut is a
  symmetric partition; one is a one-way partition. New connections made during a cut in
  the `up` direction hang (a dropped SYN), they are not refused.
* **latency** delays every forwarded chunk by a fixed time.
* a **drop** resets every open connection at once (a middlebox forgetting its state) and,
  for `refuse_s`, answers new connections with a reset.

Everything runs on the caller's event loop; every wait is bounded by the caller's
cancellation (`close`) or by the heal the nemesis always schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

HOST = "127.0.0.1"
CHUNK = 65536


@dataclass
class LinkState:
    """The faults applied to one proxy right now (the nemesis changes them)."""

    cut_up: bool = False
    cut_down: bool = False
    latency_s: float = 0.0
    #: Until this monotonic time, new connections are reset on accept.
    refuse_until: float = 0.0


@dataclass
class FaultProxy:
    """`127.0.0.1:port` forwarding to `upstream_port`, with the faults of `state`."""

    name: str
    upstream_port: int
    state: LinkState = field(default_factory=LinkState)
    port: int = 0
    connections: int = 0
    #: Called with every chunk forwarded towards the server, in order (what it received).
    tap: Callable[[bytes], None] | None = None
    _server: asyncio.Server | None = None
    _open: set[asyncio.StreamWriter] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _healed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> FaultProxy:
        self._healed.set()
        self._server = await asyncio.start_server(self._accept, HOST, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set(
        self,
        *,
        cut_up: bool | None = None,
        cut_down: bool | None = None,
        latency_s: float | None = None,
    ) -> None:
        """Change the faults; a heal (no cut) releases every held byte."""
        if cut_up is not None:
            self.state.cut_up = cut_up
        if cut_down is not None:
            self.state.cut_down = cut_down
        if latency_s is not None:
            self.state.latency_s = latency_s
        if self.state.cut_up or self.state.cut_down:
            self._healed.clear()
        else:
            self._healed.set()

    def heal(self) -> None:
        self.state.refuse_until = 0.0
        self.set(cut_up=False, cut_down=False, latency_s=0.0)

    def drop(self, refuse_s: float = 0.0) -> int:
        """Reset every open connection; refuse new ones for `refuse_s`. Returns how many."""
        self.state.refuse_until = time.monotonic() + refuse_s
        dropped = 0
        for writer in list(self._open):
            transport = writer.transport
            if not transport.is_closing():
                transport.abort()
                dropped += 1
        return dropped

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self._open.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            if time.monotonic() < self.state.refuse_until:
                return  # reset below
            # A cut towards the server drops the SYN: the connect waits for the heal.
            while self.state.cut_up:
                await self._healed.wait()
            up_reader, upstream = await asyncio.open_connection(HOST, self.upstream_port)
            self._open.add(upstream)
            self.connections += 1
            pumps = [
                asyncio.ensure_future(self._pump(reader, upstream, up=True)),
                asyncio.ensure_future(self._pump(up_reader, writer, up=False)),
            ]
            try:
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                for pump in pumps:
                    with contextlib.suppress(BaseException):
                        await pump
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for end in (writer, upstream):
                if end is not None:
                    self._open.discard(end)
                    end.transport.abort()
                    end.close()
            self._tasks.discard(task)  # type: ignore[arg-type]

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, up: bool
    ) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                data = await src.read(CHUNK)
                if not data:
                    return
                while self.state.cut_up if up else self.state.cut_down:
                    await self._healed.wait()
                    # Healed, or only the other direction still cut: look again.
                    if not (self.state.cut_up if up else self.state.cut_down):
                        break
                    await asyncio.sleep(0.05)
                if self.state.latency_s:
                    await asyncio.sleep(self.state.latency_s)
                if up and self.tap is not None:
                    self.tap(data)
                dst.write(data)
                await dst.drain()
