"""A deployment on clustered services, and the node-loss measurement every chaos test reports.

The deployment is `tests/integration/stack.py`'s (real worker processes, the fake Hermes,
trust files), with the two things a cluster changes: workers get every NATS URL and the
Redis Cluster client, and streams are provisioned with the wanted replica count.

`run_with_node_loss` publishes a batch of slow operator Actions, calls the test's `disrupt`
once enough runs are in flight, and then counts what a node loss must never cost: Actions
without a result, second `POST /v1/runs` for one Action, results published twice. How long
the pipeline stalled is read from the server timestamps of what the streams stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from schemas.action import Action
from schemas.approval import ApprovalDecision
from schemas.result import ActionResult
from subjects.grammar import Subjects
from subjects.provision import ProvisionItem, provision
from subjects.streams import StreamPolicy
from tests.integration.stack import ENDPOINT, Stack
from worker.client import AipClient
from worker.store.connection import open_redis
from worker.testing.fake_hermes import FakeConfig, FakeHermes
from worker.testing.identities import APPROVER_UNTENANTED, write_trust_files
from worker.testing.scenario import SLOW_REPLY
from worker.trust.approval_ledger import approve
from worker.trust.authority import ApprovalAuthority

POST_RUNS = "POST /v1/runs"


@dataclass
class ClusterStack(Stack):
    """`Stack` whose test-side Redis calls go through the cluster client when asked."""

    redis_cluster: bool = False
    _admin: Any = None

    async def approve(self, action: Action, *, approver: str = APPROVER_UNTENANTED) -> None:
        if self._admin is None:
            self._admin = open_redis(self.redis_url, cluster=self.redis_cluster)
        authority = ApprovalAuthority.load(
            self.trust.authority_file, now_ms=time.time_ns() // 1_000_000
        )
        await approve(
            self._admin,
            authority,
            action,
            approver,
            "approved by the test",
            ApprovalDecision.APPROVED,
            seed=self.trust.approver_seed(approver),
        )

    async def aclose(self) -> None:
        self.stop_workers()
        if self._admin is not None:
            await self._admin.aclose()
        await self.nc.close()


async def provision_replicated(
    nats_urls: list[str], replicas: int, *, ack_wait_s: float
) -> list[ProvisionItem]:
    nc = await nats.connect(servers=nats_urls)
    try:
        return await provision(
            nc.jetstream(),
            Subjects(),
            [ENDPOINT],
            StreamPolicy(replicas=replicas, ack_wait_s=ack_wait_s),
        )
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def cluster_stack(
    root: Path,
    *,
    nats_urls: list[str],
    redis_url: str,
    redis_cluster: bool,
    lease_ttl_ms: int,
    replicas: int,
    extra_env: dict[str, str] | None = None,
) -> AsyncIterator[ClusterStack]:
    """Provisioned streams, a fake Hermes without a run cap, and a stack ready to spawn."""
    trust_dir = root / "trust"
    trust_dir.mkdir()
    trust = write_trust_files(trust_dir)
    api_key = "fake-" + secrets.token_hex(16)
    key_file = root / "hermes.key"
    key_file.write_text(api_key)
    os.chmod(key_file, 0o600)
    await provision_replicated(nats_urls, replicas, ack_wait_s=lease_ttl_ms / 1000)
    # No run cap in the fake: the workers' own endpoint semaphore is what admits runs here.
    async with FakeHermes(config=FakeConfig(api_key=api_key, max_concurrent_runs=0)) as fake:
        env = {
            "AIPD_NATS_URL": ",".join(nats_urls),
            "AIPD_REDIS_URL": redis_url,
            "AIPD_REDIS_CLUSTER": "true" if redis_cluster else "false",
            "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={fake.url}",
            "AIPD_HERMES_API_KEY_FILE": str(key_file),
            "AIPD_LEASE_TTL_MS": str(lease_ttl_ms),
            "AIPD_NAK_DELAY_MS": "200",
            "AIPD_SHUTDOWN_GRACE_S": "5",
            **trust.environment(),
            **(extra_env or {}),
        }
        nc = await nats.connect(
            servers=nats_urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2
        )
        stack = ClusterStack(
            root=root,
            nats_url=",".join(nats_urls),
            redis_url=redis_url,
            fake=fake,
            trust=trust,
            nc=nc,
            client=AipClient(nc, sign_key=trust.seed_file),
            env=env,
            redis_cluster=redis_cluster,
        )
        try:
            yield stack
        finally:
            await stack.aclose()


@dataclass
class LossReport:
    """What one node loss cost, for the assertion and for docs/scaling.md."""

    actions: int
    lost: int
    duplicate_starts: int
    results_published_twice: int
    statuses: Counter[str]
    in_flight_at_disruption: int
    #: Longest gap between two stored outputs (chunks or results) after the disruption.
    stall_s: float
    #: From the disruption to the first output stored after it.
    first_output_after_s: float
    #: From the disruption to the last result.
    drained_after_s: float
    notes: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        extra = " ".join(
            f"{k}={v:.2f}s" if k.endswith("_after") else f"{k}={v:g}" for k, v in self.notes.items()
        )
        return (
            f"actions={self.actions} lost={self.lost} duplicate_starts={self.duplicate_starts} "
            f"results_twice={self.results_published_twice} statuses={dict(self.statuses)} "
            f"in_flight={self.in_flight_at_disruption} stall={self.stall_s:.2f}s "
            f"first_output_after={self.first_output_after_s:.2f}s "
            f"drained_after={self.drained_after_s:.2f}s {extra}"
        )


async def run_with_node_loss(
    stack: ClusterStack,
    *,
    actions: int,
    disrupt: Callable[[list[Action]], Awaitable[dict[str, float]]],
    in_flight_before_disruption: int,
    settle_timeout_s: float = 150.0,
) -> LossReport:
    """Publish `actions` slow operator Actions, disrupt once runs are in flight, measure."""
    batch = [
        stack.action("operator", {"objective": f"{SLOW_REPLY} {n}"})
        for n in range(actions)
    ]
    for action in batch:
        await stack.approve(action)
    for action in batch:
        await stack.publish(action)
    while stack.fake.stats().count(POST_RUNS) < in_flight_before_disruption:
        await asyncio.sleep(0.02)
    in_flight = stack.fake.stats().count(POST_RUNS)
    disrupted_at = time.time()
    notes = await disrupt(batch)

    results = await _await_results(stack, batch, settle_timeout_s)
    stats = stack.fake.stats()
    starts = stats.session_starts
    duplicate_starts = sum(n - 1 for n in starts.values() if n > 1)
    duplicate_starts += max(0, stats.count(POST_RUNS) - sum(starts.values()))
    copies = Counter(await _result_subjects(stack))
    times = sorted(await _stored_times(stack, "chunks") + await _stored_times(stack, "results"))
    after = [t for t in times if t >= disrupted_at]
    last_result = max((t for t in await _stored_times(stack, "results")), default=disrupted_at)
    window = [disrupted_at, *[t for t in after if t <= last_result]]
    gaps = [b - a for a, b in itertools.pairwise(window)]
    return LossReport(
        actions=actions,
        lost=sum(1 for a in batch if a.id not in results),
        duplicate_starts=duplicate_starts,
        results_published_twice=sum(n - 1 for n in copies.values() if n > 1),
        statuses=Counter(
            (r.status.value + (f":{r.error.code.rsplit('.', 1)[-1]}" if r.error else ""))
            for r in results.values()
        ),
        in_flight_at_disruption=in_flight,
        stall_s=max(gaps, default=0.0),
        first_output_after_s=(after[0] - disrupted_at) if after else float("inf"),
        drained_after_s=last_result - disrupted_at,
        notes=notes,
    )


async def _await_results(
    stack: ClusterStack, batch: list[Action], timeout_s: float
) -> dict[str, ActionResult]:
    """Poll the results stream (a direct get per Action) until all are in or time is up.

    Polling, not 50 ordered consumers: an ordered consumer lives on one node and the test
    kills nodes; a direct get is answered by whichever replica leads now.
    """
    found: dict[str, ActionResult] = {}
    deadline = time.monotonic() + timeout_s
    while len(found) < len(batch) and time.monotonic() < deadline:
        for action in batch:
            if action.id in found:
                continue
            with contextlib.suppress(Exception):
                result = await stack.client.stored_result(ENDPOINT, action.id)
                if result is not None:
                    found[action.id] = result
        await asyncio.sleep(0.5)
    return found


async def _read_stream(stack: ClusterStack, kind: str) -> list[tuple[str, float]]:
    """(subject, server timestamp) of every message a stream stored, read after the fact."""
    js = stack.nc.jetstream()
    subject = f"{stack.subjects.prefix}.hermes.{ENDPOINT}.{kind}.*"
    sub = await js.subscribe(subject, ordered_consumer=True)
    out: list[tuple[str, float]] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                return out
            out.append((msg.subject, msg.metadata.timestamp.timestamp()))
    finally:
        await sub.unsubscribe()


async def _stored_times(stack: ClusterStack, kind: str) -> list[float]:
    return [t for _, t in await _read_stream(stack, kind)]


async def _result_subjects(stack: ClusterStack) -> list[str]:
    return [s for s, _ in await _read_stream(stack, "results")]
