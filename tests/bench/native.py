"""The native NATS binding's cost (not a test): what a sync Action pays for going through
`aip.native.nats.v1` (docs/aip.md) instead of straight onto JetStream, and how many requests
per second one gateway answers.

    .venv/bin/python -m tests.bench native [--actions 200] [--requests 2000] [--concurrency 64]

One NATS, one Redis, the in-process fake Hermes (`GET /v1/models`, no delay), one worker
process and one gateway process, as the gateway tests deploy them (tests/gateway/conftest.py).

* **Added latency.** The same Action (`cap:hermes_agent:h1:models`, sync) two ways, one at
  a time and interleaved so a noisy moment hurts both: *direct*, the Action Envelope
  published on the endpoint's JetStream subject and its result awaited on the results
  stream (`AipClient`'s handle); *native*, a signed `aip.core.v1.action` Envelope sent as a
  core NATS request to the gateway, which enqueues, dispatches, follows and answers with
  the signed `action_result`. The figure is native minus direct, at p50 and p99.
* **Requests/s.** `--requests` signed requests with `--concurrency` outstanding at a time:
  heartbeats (the binding's own cost: decode, signature, message-id claim, signed answer)
  and sync Actions (the binding plus a worker run), next to the same number of Actions
  published straight on JetStream at the same concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nacl.signing

from schemas.action import Mode
from tests.aip_actions import did_of, request_envelope, sign
from tests.bench import require
from tests.integration.stack import Stack, fake_stack
from worker.testing._procs import free_port
from worker.testing.gateway import (
    MCP_ISSUER,
    directory_entry,
    gateway_env,
    gateway_process,
    hermes_principal_id,
    principal_entry,
    write_principals_file,
)
from worker.testing.identities import identity_entries, write_trust_files
from worker.testing.services import NatsServer, RedisServer
from worker.testing.workers import WorkerProcess

require("psutil")
import psutil  # noqa: E402  (after the check, so a missing extra says how to install it)

H1 = hermes_principal_id("h1")
CALLER = {"id": H1, "kind": "agent"}
PREFIX = "aip.v1.local.aip-hermes-worker.v1"
MODELS = "cap:hermes_agent:h1:models"


def _action() -> dict[str, Any]:
    body = {
        "id": "act_" + secrets.token_hex(16),
        "capability_id": MODELS,
        "input": {},
        "mode": "sync",
        "timeout_ms": 30_000,
    }
    return request_envelope("aip.core.v1.action", body)


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Native:
    """A requester of the binding: signs with the trusted caller key."""

    def __init__(self, stack: Stack, key: nacl.signing.SigningKey) -> None:
        self.stack = stack
        self.key = key

    async def request(self, envelope: dict[str, Any], expect: str) -> None:
        signed = sign(envelope, self.key, CALLER)
        subject = f"{PREFIX}.{envelope['message_type'].replace('.', '_')}"
        msg = await self.stack.nc.request(
            subject, json.dumps({"envelope": signed}).encode(), timeout=30
        )
        answer = json.loads(msg.data)["envelope"]
        if answer["message_type"] != expect:
            raise RuntimeError(f"expected {expect}, got {answer['message_type']}: {answer}")
        if expect == "aip.core.v1.action_result":
            assert answer["body"]["action_result"]["status"] == "completed", answer

    async def sync_action(self) -> None:
        await self.request(_action(), "aip.core.v1.action_result")

    async def heartbeat(self) -> None:
        await self.request(
            request_envelope("aip.core.v1.heartbeat", {"sequence": 1}), "aip.core.v1.heartbeat_ack"
        )


async def direct(stack: Stack) -> None:
    """The same Action, published straight on JetStream; its result awaited."""
    handle = await stack.publish(stack.action("models", mode=Mode.SYNC, timeout_ms=30_000))
    result = await handle.result(timeout_s=30)
    assert result.status == "completed", result


async def timed(call: Callable[[], Awaitable[None]]) -> float:
    began = time.perf_counter()
    await call()
    return (time.perf_counter() - began) * 1000


async def rate(call: Callable[[], Awaitable[None]], total: int, concurrency: int) -> float:
    """Requests per second with `concurrency` outstanding, `total` in all."""
    left = total

    async def lane() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    began = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return total / (time.perf_counter() - began)


async def measure(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    nats_server = NatsServer(root=root / "nats")
    redis_server = RedisServer(root=root / "redis")
    nats_server.start()
    redis_server.start()
    gateway: WorkerProcess | None = None
    try:
        trust_dir = root / "trust"
        trust_dir.mkdir()
        trust = write_trust_files(trust_dir, identities=[*identity_entries(), directory_entry(H1)])
        principals = write_principals_file(trust_dir, [principal_entry("tok-" + "a" * 36, H1)])
        caller = nacl.signing.SigningKey.generate()
        signers = trust_dir / "aip-signers.txt"
        signers.write_text(f"{did_of(caller)} {H1} kind=agent revision=1 issuer={MCP_ISSUER}\n")
        signers.chmod(0o600)
        async with fake_stack(
            root, nats_server.url, redis_server.url, trust, lease_ttl_ms=10_000
        ) as stack:
            await stack.spawn("w1", AIPD_HERMES_SHARED_ENDPOINTS="h1")
            env = gateway_env(
                nats_server.url,
                principals,
                trust.seed_file,
                free_port(),
                AIPD_AIP_TRUSTED_SIGNERS_FILE=str(signers),
                AIPD_AIP_MAX_IN_FLIGHT="4096",
                AIPD_TRUSTED_WORKER_KEYS_FILE=str(trust.worker_keys_file),
            )
            gateway = gateway_process("g1", env, root)
            await asyncio.to_thread(gateway.start, wait_ready_s=60.0)
            native = Native(stack, caller)
            for _ in range(10):  # warm both paths (connections, first claim, first dispatch)
                await direct(stack)
                await native.sync_action()
            direct_ms: list[float] = []
            native_ms: list[float] = []
            for _ in range(args.actions):
                direct_ms.append(await timed(lambda: direct(stack)))
                native_ms.append(await timed(native.sync_action))
            cpu = psutil.Process(gateway.pid)
            began_cpu = _cpu_s(cpu)
            heartbeats = await rate(native.heartbeat, args.requests, args.concurrency)
            heartbeat_cpu_ms = (_cpu_s(cpu) - began_cpu) * 1000 / args.requests
            began_cpu = _cpu_s(cpu)
            actions = await rate(native.sync_action, args.requests // 4, args.concurrency)
            action_cpu_ms = (_cpu_s(cpu) - began_cpu) * 1000 / (args.requests // 4)
            direct_rate = await rate(lambda: direct(stack), args.requests // 4, args.concurrency)
    finally:
        if gateway is not None and gateway.alive:
            gateway.terminate(20)
        nats_server.close()
        redis_server.close()
    out: dict[str, Any] = {
        "actions": args.actions,
        "load_average": os.getloadavg()[0],
        "heartbeats_per_s": heartbeats,
        "sync_actions_per_s": actions,
        "direct_actions_per_s": direct_rate,
        "gateway_cpu_ms_per_heartbeat": heartbeat_cpu_ms,
        "gateway_cpu_ms_per_sync_action": action_cpu_ms,
    }
    for name, values in (("direct", direct_ms), ("native", native_ms)):
        out[f"{name}_p50_ms"] = statistics.median(values)
        out[f"{name}_p99_ms"] = percentile(values, 0.99)
    out["added_p50_ms"] = out["native_p50_ms"] - out["direct_p50_ms"]
    out["added_p99_ms"] = out["native_p99_ms"] - out["direct_p99_ms"]
    return out


def table(out: dict[str, Any]) -> str:
    return "\n".join(
        [
            "| path | p50 ms | p99 ms |",
            "|---|---:|---:|",
            f"| direct JetStream publish → result | {out['direct_p50_ms']:.1f} | "
            f"{out['direct_p99_ms']:.1f} |",
            f"| native binding request → action_result | {out['native_p50_ms']:.1f} | "
            f"{out['native_p99_ms']:.1f} |",
            f"| **added by the binding** | **{out['added_p50_ms']:.1f}** | "
            f"**{out['added_p99_ms']:.1f}** |",
            "",
            f"requests/s through the binding (concurrency {out['concurrency']}): heartbeats "
            f"{out['heartbeats_per_s']:,.0f}/s, sync Actions {out['sync_actions_per_s']:,.0f}/s "
            f"(the same Actions published straight on JetStream: "
            f"{out['direct_actions_per_s']:,.0f}/s)",
            f"gateway CPU per request (user + system, from the kernel): heartbeat "
            f"{out['gateway_cpu_ms_per_heartbeat']:.1f} ms, sync Action "
            f"{out['gateway_cpu_ms_per_sync_action']:.1f} ms",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench native", description=__doc__)
    parser.add_argument("--actions", type=int, default=200, help="sync Actions per path")
    parser.add_argument("--requests", type=int, default=2000, help="heartbeats for the rate")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="aip-bench-native-"))
    print(f"# native binding bench in {root}, {os.cpu_count()} cores, load average {load:.2f}")
    out = asyncio.run(measure(args, root))
    out["concurrency"] = args.concurrency
    out["load_average_at_start"] = load
    print(table(out))
    (root / "results.json").write_text(json.dumps(out, indent=1))
    print(f"results: {root / 'results.json'}")


if __name__ == "__main__":
    main()
