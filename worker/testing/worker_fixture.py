"""A worker for a user's own integration test: real processes around a fake Hermes.

`worker_deployment(...)` (and the plugin's `worker_process` fixture built on it) gives a test
what a production worker needs and nothing it does not: streams and consumers provisioned
for one endpoint, a complete set of trust files (the gateway's signing key and the keys file
workers verify it with, the worker's result signing key and the keys file clients trust,
an identity directory and an approval authority, all from `worker.testing.identities`), the
Hermes API key as an owner-only file, the project's fake Hermes on a free loopback port, and
`python -m worker run` subprocesses with that environment, started only once they have bound
their consumers (so a worker that refuses its configuration fails the test's set-up with its
log tail, instead of a test that waits for a result nobody will send).

The worker is a subprocess for the reason `worker.testing.workers` gives (a test can kill or
pause it like a production one), and it is started off the event loop: the fake Hermes runs
on the test's loop and must answer the worker's start-up key probe meanwhile.

The publisher side is an `AipClient` that signs with the gateway key and believes only
results the worker's key signed, publishing as the untenanted demo principal the identity
file knows (`identities.USER_UNTENANTED`), so `deployment.run("models")` is a whole signed,
verified round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from schemas.action import Action
from schemas.result import ActionResult
from subjects.grammar import Subjects
from subjects.provision import provision
from subjects.streams import StreamPolicy
from worker.client import ActionHandle, AipClient
from worker.testing.fake_hermes import FakeHermes
from worker.testing.identities import (
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    TrustFiles,
    write_api_key_file,
    write_trust_files,
)
from worker.testing.workers import WorkerProcess

#: The endpoint the deployment serves (its Actions go to `aip.hermes.hermes-1.actions`).
ENDPOINT = "hermes-1"
#: A short lease, so a killed worker's Action is taken over within seconds.
LEASE_TTL_MS = 3000
#: How long a worker may take to bind its consumers (the first start imports everything).
READY_TIMEOUT_S = 30.0


@dataclass
class WorkerDeployment:
    """What a test drives: the fake Hermes, the trust files, the client and the workers."""

    root: Path
    nats_url: str
    redis_url: str
    #: The fake Hermes the workers call: arm faults on `fake.faults`, count on `fake.stats()`.
    fake: FakeHermes
    trust: TrustFiles
    #: Signs with the gateway key; believes only results the workers' key signed.
    client: AipClient
    #: The `AIPD_*` environment every worker starts with.
    env: dict[str, str]
    endpoint: str = ENDPOINT
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def worker(self) -> WorkerProcess:
        """The first worker (the one the fixture started)."""
        return self.workers[0]

    async def spawn(
        self, worker_id: str | None = None, *, wait: bool = True, **env: str
    ) -> WorkerProcess:
        """Start one more worker, with the deployment's environment plus `env` (`AIPD_*`
        names); with `wait`, returns once it has bound its consumers."""
        worker = WorkerProcess(
            worker_id=worker_id or f"worker-{len(self.workers) + 1}",
            env={**self.env, **env},
            log_dir=self.root,
        )
        self.workers.append(worker)
        return await asyncio.to_thread(worker.start, wait_ready_s=READY_TIMEOUT_S if wait else 0)

    def action(
        self, operation: str, input: Mapping[str, Any] | None = None, **fields: Any
    ) -> Action:
        """An Action on this endpoint from the demo principal (`fields` override any field
        of `AipClient.build_action`, e.g. `principal_id`, `timeout_ms`)."""
        defaults: dict[str, Any] = {
            "principal_id": USER_UNTENANTED,
            "principal_kind": PRINCIPAL_KIND,
            "authentication_issuer": ISSUER,
            "credential_revision": REVISION,
        }
        return self.client.build_action(
            endpoint_id=self.endpoint,
            operation=operation,
            input=dict(input or {}),
            **{**defaults, **fields},
        )

    async def submit(
        self, operation: str, input: Mapping[str, Any] | None = None, **fields: Any
    ) -> ActionHandle:
        """Publish a signed Action; its handle streams chunks and waits for the result."""
        return await self.client.publish(self.action(operation, input, **fields))

    async def run(
        self,
        operation: str,
        input: Mapping[str, Any] | None = None,
        *,
        timeout_s: float = 30.0,
        **fields: Any,
    ) -> ActionResult:
        """Publish a signed Action and wait for its one verified result."""
        handle = await self.submit(operation, input, **fields)
        return await handle.result(timeout_s=timeout_s)

    def stop_workers(self) -> None:
        """kill -9 every worker still running (leases are left to expire, as in a crash)."""
        for worker in self.workers:
            if worker.alive:
                worker.resume()
                worker.kill()


@contextlib.asynccontextmanager
async def worker_deployment(
    root: Path,
    nats_url: str,
    redis_url: str,
    *,
    workers: int = 1,
    endpoint: str = ENDPOINT,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[WorkerDeployment]:
    """Provision `endpoint`, write trust files under `root`, start the fake Hermes and
    `workers` worker processes (each bound before this yields); everything is stopped after.

    `env` adds or overrides `AIPD_*` settings of the workers (docs/configuration.md).
    """
    trust_dir = root / "trust"
    trust_dir.mkdir(parents=True, exist_ok=True)
    trust = write_trust_files(trust_dir)
    api_key, key_file = write_api_key_file(trust_dir)
    await _provision(nats_url, endpoint)
    async with FakeHermes(api_key=api_key, port=0) as fake:
        worker_env = {
            "AIPD_NATS_URL": nats_url,
            "AIPD_REDIS_URL": redis_url,
            "AIPD_HERMES_ENDPOINTS": f"{endpoint}={fake.url}",
            "AIPD_HERMES_API_KEY_FILE": str(key_file),
            "AIPD_LEASE_TTL_MS": str(LEASE_TTL_MS),
            "AIPD_NAK_DELAY_MS": "200",
            "AIPD_SHUTDOWN_GRACE_S": "5",
            **trust.environment(),
            **(env or {}),
        }
        async with await AipClient.connect(
            nats_url, sign_key=trust.seed_file, trusted_worker_keys=trust.worker_keys_file
        ) as client:
            deployment = WorkerDeployment(
                root=root,
                nats_url=nats_url,
                redis_url=redis_url,
                fake=fake,
                trust=trust,
                client=client,
                env=worker_env,
                endpoint=endpoint,
            )
            try:
                for _ in range(workers):
                    await deployment.spawn()
                yield deployment
            finally:
                deployment.stop_workers()


async def _provision(nats_url: str, endpoint: str) -> None:
    """Streams and the endpoint's consumers, with AckWait matched to the short lease."""
    nc = await nats.connect(nats_url)
    try:
        await provision(
            nc.jetstream(), Subjects(), [endpoint], StreamPolicy(ack_wait_s=LEASE_TTL_MS / 1000)
        )
    finally:
        await nc.close()
