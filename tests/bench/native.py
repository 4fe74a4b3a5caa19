"""The native bindings' cost (not a test): what a sync Action pays for going through
`aip.native.nats.v1` or the connector host over `aip.native.http.v1` (docs/aip.md) instead
of straight onto JetStream, and how many requests per second one gateway answers on each.

    .venv/bin/python -m tests.bench native [--actions 200] [--requests 2000] [--concurrency 64]

One NATS, one Redis, the in-process fake Hermes (`GET /v1/models`, no delay), one worker
process and one gateway process, as the gateway tests deploy them (tests/gateway/conftest.py).

* **Added latency.** The same Action (`cap:hermes_agent:h1:models`, sync) two ways, one at
  a time and interleaved so a noisy moment hurts both: *direct*, the Action Envelope
  published on the endpoint's JetStream subject and its result awaited on the results
  stream (`AipClient`'s handle); *native*, a signed `aip.core.v1.action` Envelope sent as a
  core NATS request to the gateway, which enqueues, dispatches, follows and answers with
  the signed `action_result`; *http*, the same Action as a GetAIP central sends it to the
  connector host (`POST /aip/v1/messages`, addressed to the host, with its pinned
  `security.connector_route`). The figures are each binding minus direct, at p50 and p99.
* **Requests/s.** `--requests` signed requests with `--concurrency` outstanding at a time:
  heartbeats (the binding's own cost: decode, signature, message-id claim, signed answer)
  and sync Actions (the binding plus a worker run), next to the same number of Actions
  published straight on JetStream at the same concurrency; the same through the host.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
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
HOST = {"id": "service:aip-hermes-worker", "kind": "service"}
TENANT, INSTANCE, REPLICA, VERSION = "tenant-bench", "inst-bench", "replica-bench", "v-bench"


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


class Host:
    """A GetAIP central of the connector host: signs with the trusted caller key, addresses
    the host and pins the route the host checks (tenant, instance, replica, version, the
    manifest's digest, the Action's id and capability)."""

    def __init__(self, base_url: str, key: nacl.signing.SigningKey, concurrency: int) -> None:
        self.key = key
        self.messages = f"{base_url}/aip/v1/messages"
        self.manifest = f"{base_url}/aip/v1/manifest"
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.AsyncClient(limits=limits, timeout=30)
        self.digest = ""

    async def open(self) -> None:
        from tests.aip_actions import canonical

        answer = await self.client.get(self.manifest)
        answer.raise_for_status()
        self.digest = "sha256:" + hashlib.sha256(canonical(answer.json())).hexdigest()

    async def request(self, envelope: dict[str, Any], expect: str) -> None:
        envelope["to"] = HOST
        body = envelope["body"]
        if "action" in body:
            envelope["security"] = {
                "connector_route": {
                    "action_id": body["action"]["id"],
                    "capability_id": body["action"]["capability_id"],
                    "tenant_id": TENANT,
                    "instance_id": INSTANCE,
                    "replica_id": REPLICA,
                    "version_id": VERSION,
                    "manifest_digest": self.digest,
                    "original_mode": "sync",
                }
            }
        signed = sign(envelope, self.key, CALLER)
        answer = await self.client.post(
            self.messages,
            content=json.dumps(signed).encode(),
            headers={"content-type": "application/aip+json"},
        )
        document = answer.json()
        if answer.status_code != 200 or document["message_type"] != expect:
            raise RuntimeError(f"expected {expect}, got {answer.status_code}: {document}")
        if expect == "aip.core.v1.action_result":
            assert document["body"]["action_result"]["status"] == "completed", document

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
                AIPD_AIP_HOST_INSTANCE_ID=INSTANCE,
                AIPD_AIP_HOST_TENANT_ID=TENANT,
                AIPD_AIP_HOST_REPLICA_ID=REPLICA,
                AIPD_AIP_HOST_VERSION_ID=VERSION,
                AIPD_AIP_HOST_MAX_IN_FLIGHT="4096",
            )
            port = int(env["AIPD_GATEWAY_PORT"])
            gateway = gateway_process("g1", env, root)
            await asyncio.to_thread(gateway.start, wait_ready_s=60.0)
            native = Native(stack, caller)
            host = Host(f"http://127.0.0.1:{port}", caller, args.concurrency)
            await host.open()
            for _ in range(10):  # warm every path (connections, first claim, first dispatch)
                await direct(stack)
                await native.sync_action()
                await host.sync_action()
            latencies: dict[str, list[float]] = {"direct": [], "native": [], "http": []}
            for _ in range(args.actions):
                latencies["direct"].append(await timed(lambda: direct(stack)))
                latencies["native"].append(await timed(native.sync_action))
                latencies["http"].append(await timed(host.sync_action))
            cpu = psutil.Process(gateway.pid)
            rates: dict[str, float] = {}
            for name, binding in (("native", native), ("http", host)):
                began_cpu = _cpu_s(cpu)
                rates[f"{name}_heartbeats"] = await rate(
                    binding.heartbeat, args.requests, args.concurrency
                )
                rates[f"{name}_heartbeat_cpu_ms"] = (
                    (_cpu_s(cpu) - began_cpu) * 1000 / args.requests
                )
                began_cpu = _cpu_s(cpu)
                rates[f"{name}_actions"] = await rate(
                    binding.sync_action, args.requests // 4, args.concurrency
                )
                rates[f"{name}_action_cpu_ms"] = (
                    (_cpu_s(cpu) - began_cpu) * 1000 / (args.requests // 4)
                )
            await host.client.aclose()
            direct_rate = await rate(lambda: direct(stack), args.requests // 4, args.concurrency)
    finally:
        if gateway is not None and gateway.alive:
            gateway.terminate(20)
        nats_server.close()
        redis_server.close()
    out: dict[str, Any] = {
        "actions": args.actions,
        "load_average": os.getloadavg()[0],
        "direct_actions_per_s": direct_rate,
    }
    for name in ("native", "http"):
        out[f"{name}_heartbeats_per_s"] = rates[f"{name}_heartbeats"]
        out[f"{name}_sync_actions_per_s"] = rates[f"{name}_actions"]
        out[f"{name}_gateway_cpu_ms_per_heartbeat"] = rates[f"{name}_heartbeat_cpu_ms"]
        out[f"{name}_gateway_cpu_ms_per_sync_action"] = rates[f"{name}_action_cpu_ms"]
    for name, values in latencies.items():
        out[f"{name}_p50_ms"] = statistics.median(values)
        out[f"{name}_p99_ms"] = percentile(values, 0.99)
    for name in ("native", "http"):
        out[f"{name}_added_p50_ms"] = out[f"{name}_p50_ms"] - out["direct_p50_ms"]
        out[f"{name}_added_p99_ms"] = out[f"{name}_p99_ms"] - out["direct_p99_ms"]
    return out


def table(out: dict[str, Any]) -> str:
    rows = [
        "| path | p50 ms | p99 ms | added p50 ms | added p99 ms |",
        "|---|---:|---:|---:|---:|",
        f"| direct JetStream publish → result | {out['direct_p50_ms']:.1f} | "
        f"{out['direct_p99_ms']:.1f} | | |",
    ]
    names = {"native": "NATS binding request", "http": "connector host POST"}
    for name, label in names.items():
        rows.append(
            f"| {label} → action_result | {out[f'{name}_p50_ms']:.1f} | "
            f"{out[f'{name}_p99_ms']:.1f} | **{out[f'{name}_added_p50_ms']:.1f}** | "
            f"**{out[f'{name}_added_p99_ms']:.1f}** |"
        )
    rows += [
        "",
        f"| binding (concurrency {out['concurrency']}) | heartbeats/s | sync Actions/s | "
        "gateway CPU ms/heartbeat | gateway CPU ms/sync Action |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, label in names.items():
        rows.append(
            f"| {label} | {out[f'{name}_heartbeats_per_s']:,.0f} | "
            f"{out[f'{name}_sync_actions_per_s']:,.0f} | "
            f"{out[f'{name}_gateway_cpu_ms_per_heartbeat']:.2f} | "
            f"{out[f'{name}_gateway_cpu_ms_per_sync_action']:.2f} |"
        )
    rows.append(
        f"| the same Actions published straight on JetStream | | "
        f"{out['direct_actions_per_s']:,.0f} | | |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench native", description=__doc__)
    parser.add_argument("--actions", type=int, default=200, help="sync Actions per path")
    parser.add_argument("--requests", type=int, default=2000, help="heartbeats for the rate")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="aip-bench-native-"))
    print(f"# native bindings bench in {root}, {os.cpu_count()} cores, load average {load:.2f}")
    out = asyncio.run(measure(args, root))
    out["concurrency"] = args.concurrency
    out["load_average_at_start"] = load
    print(table(out))
    (root / "results.json").write_text(json.dumps(out, indent=1))
    print(f"results: {root / 'results.json'}")


if __name__ == "__main__":
    main()
