"""A model of moving Ed25519 checks off the event loop (not a test), for BENCHMARKS.md's
"Ed25519 off the event loop, tried twice".

    .venv/bin/python -m tests.bench.offload_model [--tasks N] [--rounds R]

N tasks, 100 at a time, each do about as much Python as the worker does per Action
(`json.dumps` of a small document, in three parts with a loop pass between them) around
two Ed25519 verifications. The verifications run:

- `inline`: on the event loop, as the worker does;
- `thread`: on one thread of this process (libsodium releases the GIL while it computes),
  its verdicts handed back with `call_soon_threadsafe`;
- `process, each verdict`: in a child process over pipes, which writes each verdict as soon
  as it has it;
- `process, batched`: the same child, answering a batch of checks with one write.

Printed: tasks per second, and the event loop thread's CPU per task. The rows are run in
turn, `--rounds` times, so a slow minute of the machine falls on all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

import nacl.bindings
import nacl.exceptions
import nacl.signing
import uvloop

IN_FLIGHT = 100
#: `json.dumps` calls per part of a task: three parts come to ~1 ms on the bench machine.
DUMPS_PER_PART = 40
DOCUMENT = {"a": [1, 2, 3] * 20, "b": "x" * 200, "c": {"d": 1.5}}
#: A check: u32 length of the rest, u64 id, the 32-byte key, the 64-byte signature, the
#: message. A verdict: u64 id, u8 1 or 0. A batch verdict: u32 count, then count u8s.
CHECK = struct.Struct(">IQ")
#: The bytes of a check's leading length, which counts what follows it.
LENGTH_BYTES = 4
VERDICT = struct.Struct(">QB")
COUNT = struct.Struct(">I")

Verify = Callable[[], Awaitable[bool]]
#: A check for the thread: key, signature, message, and the future its verdict settles.
ThreadJob = tuple[bytes, bytes, bytes, "asyncio.Future[bool]"]


def _busy() -> None:
    for _ in range(DUMPS_PER_PART):
        json.dumps(DOCUMENT)


def _check(key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        nacl.bindings.crypto_sign_open(signature + message, key)
    except (nacl.exceptions.BadSignatureError, ValueError):
        return False
    return True


def _child(batched: bool, source: int, sink: BinaryIO) -> None:
    """The child process: verify what each read brings, and write each verdict at once
    (`batched`: one write for all that the read brought)."""
    buffer = bytearray()
    while data := os.read(source, 1 << 20):
        buffer += data
        verdicts = bytearray()
        while len(buffer) >= CHECK.size:
            length, check_id = CHECK.unpack_from(buffer)
            end = LENGTH_BYTES + length
            if len(buffer) < end:
                break
            rest = bytes(buffer[CHECK.size : end])
            del buffer[:end]
            ok = _check(rest[:32], rest[32:96], rest[96:])
            if batched:
                verdicts.append(ok)
            else:
                sink.write(VERDICT.pack(check_id, ok))
                sink.flush()
        if verdicts:
            sink.write(COUNT.pack(len(verdicts)) + bytes(verdicts))
            sink.flush()


async def _run(verify: Verify, tasks: int) -> tuple[float, float]:
    """(tasks per second, the loop thread's CPU µs per task)."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def task() -> None:
        async with gate:
            _busy()
            await asyncio.sleep(0)
            assert await verify()
            _busy()
            await asyncio.sleep(0)
            assert await verify()
            _busy()

    wall, cpu = time.perf_counter(), time.thread_time()
    await asyncio.gather(*(task() for _ in range(tasks)))
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    return tasks / wall, cpu / tasks * 1e6


class _Thread:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.jobs: queue.SimpleQueue[ThreadJob | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            key, signature, message, future = job
            self.loop.call_soon_threadsafe(future.set_result, _check(key, signature, message))

    async def verify(self, key: bytes, signature: bytes, message: bytes) -> bool:
        future: asyncio.Future[bool] = self.loop.create_future()
        self.jobs.put((key, signature, message, future))
        return await future

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


class _Child:
    def __init__(self, loop: asyncio.AbstractEventLoop, *, batched: bool) -> None:
        self.loop = loop
        self.batched = batched
        self.waiting: dict[int, asyncio.Future[bool]] = {}
        self.in_order: deque[asyncio.Future[bool]] = deque()
        self.queued: list[bytes] = []
        self.next_id = 0
        argv = [sys.executable, "-m", "tests.bench.offload_model", "--child"]
        if batched:
            argv.append("--batched")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.buffer = bytearray()
        loop.add_reader(self.proc.stdout.fileno(), self._readable)

    def _readable(self) -> None:
        assert self.proc.stdout is not None
        self.buffer += os.read(self.proc.stdout.fileno(), 65536)
        if not self.batched:
            whole = len(self.buffer) // VERDICT.size * VERDICT.size
            for check_id, ok in VERDICT.iter_unpack(bytes(self.buffer[:whole])):
                self.waiting.pop(check_id).set_result(bool(ok))
            del self.buffer[:whole]
            return
        while len(self.buffer) >= COUNT.size:
            (count,) = COUNT.unpack_from(self.buffer)
            if len(self.buffer) < COUNT.size + count:
                return
            for ok in self.buffer[COUNT.size : COUNT.size + count]:
                self.in_order.popleft().set_result(bool(ok))
            del self.buffer[: COUNT.size + count]

    async def verify(self, key: bytes, signature: bytes, message: bytes) -> bool:
        self.next_id += 1
        future: asyncio.Future[bool] = self.loop.create_future()
        if self.batched:
            self.in_order.append(future)
        else:
            self.waiting[self.next_id] = future
        if not self.queued:
            self.loop.call_soon(self._flush)
        check = CHECK.pack(CHECK.size - LENGTH_BYTES + 96 + len(message), self.next_id)
        self.queued.append(check + key + signature + message)
        return await future

    def _flush(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"".join(self.queued))
        self.proc.stdin.flush()
        self.queued = []

    def close(self) -> None:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.loop.remove_reader(self.proc.stdout.fileno())
        self.proc.stdin.close()
        self.proc.wait(10)


async def _measure(kind: str, tasks: int) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    signer = nacl.signing.SigningKey(bytes(range(32)))
    signed = signer.sign(b"x" * 600)
    key, signature, message = bytes(signer.verify_key), signed.signature, signed.message
    helper: Any = None
    if kind == "inline":

        async def verify() -> bool:
            return _check(key, signature, message)
    else:
        if kind == "thread":
            helper = _Thread(loop)
        else:
            helper = _Child(loop, batched=kind == "process, batched")

        async def verify() -> bool:
            return bool(await helper.verify(key, signature, message))
    try:
        return await _run(verify, tasks)
    finally:
        if helper is not None:
            helper.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--batched", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.batched, sys.stdin.fileno(), sys.stdout.buffer)
        return
    kinds = ("inline", "thread", "process, each verdict", "process, batched")
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for _ in range(args.rounds):
        for kind in kinds:
            results[kind].append(uvloop.run(_measure(kind, args.tasks)))
    print("| verifications run | tasks/s (median; each round) | loop thread CPU µs/task |")
    print("|---|---|---:|")
    for kind, samples in results.items():
        rates = [rate for rate, _ in samples]
        listed = ", ".join(f"{rate:,.0f}" for rate in rates)
        cpu = statistics.median(cpu for _, cpu in samples)
        print(f"| {kind} | {statistics.median(rates):,.0f} ({listed}) | {cpu:,.0f} |")


if __name__ == "__main__":
    main()
