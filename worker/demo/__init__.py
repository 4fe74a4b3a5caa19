"""`aip-hermes-worker demo`: the whole system on this machine, in under a minute.

With nothing configured it starts NATS (JetStream) and Redis on free ports, the fake Hermes
(or uses `--hermes URL --hermes-key-file F`), writes trust files, provisions the streams,
starts two workers and plays the story of `worker.demo.story`, printing chunks live and a
summary table. Exit code 0 only when every step reached its expected state, 1 otherwise,
3 when a service could not start. Every process it started is stopped at the end, on
Ctrl-C and on SIGTERM; `--keep` instead leaves them running (URLs printed) until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from pathlib import Path

from worker.client import AipClient
from worker.demo.console import Console
from worker.demo.environment import LEASE_TTL_MS, DemoEnvironment, DemoError
from worker.demo.story import Pace, Story
from worker.store.clock import redis_now_ms
from worker.store.connection import open_redis
from worker.testing._errors import ServiceStartError
from worker.trust.authority import ApprovalAuthority

EXIT_OK = 0
EXIT_STEPS_FAILED = 1
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130
#: How long an interrupted story may take to unwind before the processes are stopped anyway.
_INTERRUPT_GRACE_S = 2.0


async def run_demo(
    *,
    short: bool = False,
    keep: bool = False,
    hermes_url: str | None = None,
    hermes_key_file: Path | None = None,
    console: Console | None = None,
) -> int:
    """Start everything, play the story, clean up; returns the process exit code."""
    console = console or Console()
    env = DemoEnvironment.create(hermes_url=hermes_url, hermes_key_file=hermes_key_file)
    interrupted = asyncio.Event()
    _set_on_signals(interrupted)
    try:
        work = asyncio.ensure_future(_start_and_play(env, console, short=short, keep=keep))
        waiter = asyncio.ensure_future(interrupted.wait())
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if work.done():
            return work.result()
        console.line()
        console.line("demo: interrupted")
        console.muted = True
        await _cancel_firmly(work)
        return EXIT_INTERRUPTED
    finally:
        await env.stop_aip_runtime()
        env.close(keep_files=False)
        console.muted = False
        console.final("demo: every process it started is stopped")


async def _cancel_firmly(work: asyncio.Future[int]) -> None:
    """Cancel until it ends: on Python 3.11 `asyncio.wait_for` (used inside nats-py and
    redis-py) can swallow a cancellation that races with a completed wait, so one
    `cancel()` is not always enough. After the grace period the processes go anyway."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _INTERRUPT_GRACE_S
    while not work.done() and loop.time() < deadline:
        work.cancel()
        await asyncio.wait({work}, timeout=0.1)


async def _start_and_play(
    env: DemoEnvironment, console: Console, *, short: bool, keep: bool
) -> int:
    try:
        await _start(env, console)
    except (DemoError, ServiceStartError, TimeoutError, RuntimeError) as exc:
        console.line(f"demo: could not start: {exc}")
        return EXIT_UNAVAILABLE
    all_reached = await _play(env, console, Pace.of(short=short))
    if keep:
        await _keep(env, console)
    return EXIT_OK if all_reached else EXIT_STEPS_FAILED


async def _start(env: DemoEnvironment, console: Console) -> None:
    console.line("aip-hermes-worker demo: starting everything on free loopback ports")
    await env.start_services()
    assert env.nats is not None
    assert env.redis is not None
    console.setup("nats", f"{env.nats.url} (JetStream, file storage)")
    console.setup("redis", f"{env.redis.url} (AOF appendfsync always, noeviction)")
    env.write_trust()
    console.setup("trust", f"gateway key, identities and approval authority in {env.root}/trust")
    if env.hermes_url is None:
        mcp_url = await env.start_aip_runtime()
        console.setup("aip gateway", f"{mcp_url} (aip-hermes-worker gateway: MCP, runtime stores)")
    hermes = await env.start_hermes()
    console.setup("hermes", f"{hermes.url} ({'fake Hermes 0.19.0' if hermes.fake else 'yours'})")
    provisioned = await env.provision()
    console.setup("provision", f"{len(provisioned)} streams and consumers")
    workers = await env.start_workers()
    console.setup(
        "workers",
        ", ".join(f"{w.worker_id} (pid {w.pid})" for w in workers)
        + f", lease TTL {LEASE_TTL_MS} ms",
    )


async def _play(env: DemoEnvironment, console: Console, pace: Pace) -> bool:
    assert env.nats is not None
    assert env.redis is not None
    assert env.trust is not None
    redis = open_redis(env.redis.url)
    # The demo's consumer believes only results and chunk chains its workers signed.
    client = await AipClient.connect(
        env.nats.url, sign_key=env.trust.seed_file, trusted_worker_keys=env.trust.worker_keys_file
    )
    try:
        now_ms = await redis_now_ms(redis)
        authority = ApprovalAuthority.load(env.trust.authority_file, now_ms=now_ms)
        reports = await Story(env, client, redis, authority, console, pace).run()
    finally:
        with contextlib.suppress(Exception):
            await client.nc.drain()
        with contextlib.suppress(Exception):
            await redis.aclose()
    return console.summary(reports)


async def _keep(env: DemoEnvironment, console: Console) -> None:
    console.line()
    console.line("--keep: everything stays up until Ctrl-C")
    for name, url in env.urls().items():
        console.setup(name, url)
    assert env.trust is not None
    assert env.nats is not None
    console.line(
        "  try:      aip-hermes-worker submit --nats-url "
        f"{env.nats.url} --endpoint hermes-1 --operation models --principal user:demo "
        f"--principal-kind user --revision 3 --sign-key {env.trust.seed_file} --wait 30 "
        f"--trusted-worker-keys {env.trust.worker_keys_file}"
    )
    await asyncio.Event().wait()


def _set_on_signals(interrupted: asyncio.Event) -> None:
    """Ctrl-C and SIGTERM end the demo, and `run_demo`'s `finally` stops what it started.

    Handled here rather than left to Python's default, because a process started in the
    background by a script inherits SIGINT *ignored*, and would then never clean up.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, interrupted.set)


async def cmd_demo(args: argparse.Namespace) -> int:
    # The demo configures its own workers; a deployment's AIPD_* variables in this shell
    # (endpoints, credentials, fault points) must not leak into them.
    for name in [name for name in os.environ if name.startswith("AIPD_")]:
        del os.environ[name]
    return await run_demo(
        short=args.short,
        keep=args.keep,
        hermes_url=args.hermes,
        hermes_key_file=args.hermes_key_file,
    )
