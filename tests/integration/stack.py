"""A whole deployment for one test: NATS, Redis, the fake Hermes, trust files, workers.

Everything is real except Hermes (the project's fake, over real HTTP): workers are
`python -m worker run` subprocesses, so a test can kill -9 or SIGSTOP them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.js.api import ConsumerInfo

from schemas.action import Action
from schemas.audit import Receipt
from schemas.chunk import StreamChunk
from schemas.result import ActionResult
from subjects.grammar import Subjects, envelope_msg_id
from subjects.provision import provision
from subjects.streams import StreamPolicy
from tests.aip_wire import receipt_fields
from worker.aip.canonical import canonical_bytes
from worker.aip.signing import sign_envelope as aip_sign_envelope
from worker.client import ActionHandle, AipClient
from worker.testing.fake_hermes import FakeConfig, FakeHermes
from worker.testing.identities import (
    APPROVER_UNTENANTED,
    ISSUER,
    PRINCIPAL_KIND,
    REVISION,
    USER_UNTENANTED,
    TrustFiles,
    write_api_key_file,
)
from worker.testing.workers import WorkerProcess
from worker.trust.approval_ledger import Recorded
from worker.wire.actions import GATEWAY_SENDER
from worker.wire.chunks import decode_chunk
from worker.wire.results import decode_result

ENDPOINT = "h1"


@dataclass
class Stack:
    root: Path
    nats_url: str
    redis_url: str
    #: The fake Hermes, or None when the stack drives the real one.
    fake: FakeHermes | None
    trust: TrustFiles
    nc: NATS
    client: AipClient
    env: dict[str, str]
    workers: list[WorkerProcess] = field(default_factory=list)
    subjects: Subjects = field(default_factory=Subjects)

    async def spawn(
        self,
        worker_id: str,
        *,
        fault_points: str | None = None,
        wait: bool = True,
        unset: tuple[str, ...] = (),
        **env: str,
    ) -> WorkerProcess:
        """Start a worker with the stack's environment, plus `env`, less the `unset` names."""
        worker = WorkerProcess(
            worker_id=worker_id,
            env={k: v for k, v in {**self.env, **env}.items() if k not in unset},
            log_dir=self.root,
            fault_points=fault_points,
        )
        self.workers.append(worker)
        # Started off the event loop: the in-process fake Hermes must keep answering.
        return await asyncio.to_thread(worker.start, wait_ready_s=20.0 if wait else 0)

    def action(self, operation: str, input: Mapping[str, Any] | None = None, **kw: Any) -> Action:
        return self.client.build_action(
            endpoint_id=ENDPOINT,
            operation=operation,
            input=dict(input or {}),
            principal_id=kw.pop("principal_id", USER_UNTENANTED),
            principal_kind=PRINCIPAL_KIND,
            authentication_issuer=ISSUER,
            credential_revision=REVISION,
            **kw,
        )

    async def publish(
        self,
        action: Action,
        *,
        msg_id: str | None = None,
        signed: bool = True,
        dedupe: bool = True,
    ) -> ActionHandle:
        """Publish `action`; `dedupe=False` sends no `Nats-Msg-Id`, so the stream stores
        every copy (as it does for a copy that arrives after the duplicate window)."""
        payload = self.trust.seal_action(action, signed=signed)
        headers = {"Nats-Msg-Id": msg_id or envelope_msg_id(action.id, payload)} if dedupe else {}
        await self.nc.jetstream().publish(self.subjects.actions(ENDPOINT), payload, headers=headers)
        return self.client.handle(ENDPOINT, action.id)

    def envelope_document(self, action: Action) -> dict[str, Any]:
        """`action`'s AIP Action Envelope as a JSON object (unsigned), for a test to edit
        and sign again with `sign_document`."""
        document: dict[str, Any] = json.loads(self.trust.seal_action(action, signed=False))
        return document

    def sign_document(self, document: Mapping[str, Any]) -> bytes:
        """An Envelope document signed by the gateway key, by the AIP signing rules
        (`worker.aip.signing`, not the Action codec): any body it holds is signed as is."""
        dropped = ("from", "security")
        unsigned = {key: value for key, value in document.items() if key not in dropped}
        signed = aip_sign_envelope(unsigned, self.trust.aip_signer, GATEWAY_SENDER)
        return canonical_bytes(signed)

    async def publish_envelope(self, payload: bytes) -> ActionHandle:
        """Publish Action Envelope bytes built elsewhere under their content-bound
        `Nats-Msg-Id` (the id its `body.action.id` names), as a gateway does."""
        action_id = json.loads(payload)["body"]["action"]["id"]
        headers = {"Nats-Msg-Id": envelope_msg_id(action_id, payload)}
        await self.nc.jetstream().publish(self.subjects.actions(ENDPOINT), payload, headers=headers)
        return self.client.handle(ENDPOINT, action_id)

    async def publish_raw(self, payload: bytes) -> None:
        """Publish bytes as they are on the actions subject (an Action Envelope carries its
        own signature, or none)."""
        headers = {"Nats-Msg-Id": secrets.token_hex(8)}
        await self.nc.jetstream().publish(self.subjects.actions(ENDPOINT), payload, headers=headers)

    async def results(self, action_id: str) -> list[ActionResult]:
        """The Action's results as stored (`action_result` Envelopes; signatures verified
        when present, not checked against the trusted keys: `AipClient` does that)."""
        return [
            decode_result(m)[0]
            for m in await self.stream_messages(
                "results", self.subjects.results(ENDPOINT, action_id)
            )
        ]

    async def chunks(self, action_id: str) -> list[StreamChunk]:
        return [
            decode_chunk(m)[0]
            for m in await self.stream_messages("chunks", self.subjects.chunks(ENDPOINT, action_id))
        ]

    async def receipts(self, action_id: str) -> list[Receipt]:
        """The Action's receipts as stored, read by hand from their `receipt_chain`
        Envelopes (not verified: `AipClient.audit_chain` verifies)."""
        found = [
            msgspec.convert(receipt_fields(m), Receipt)
            for m in await self.stream_messages("audit", self.subjects.audit(ENDPOINT, action_id))
        ]
        return [r for r in found if r.action_id == action_id]

    async def dlq(self) -> list[tuple[bytes, dict[str, Any]]]:
        """Each DLQ entry as `(the refused bytes kept, its facts)`, read by hand from the
        `action_status` Envelope (plain `json`, docs/publishing.md "The dead-letter queue"):
        the facts are `extensions["org.aip-hermes-worker"].dead_letter` without `kept`, plus
        the body's `action_id` and `state`."""
        out: list[tuple[bytes, dict[str, Any]]] = []
        for data in await self.stream_messages("dlq", self.subjects.dlq(ENDPOINT)):
            envelope = json.loads(data)
            status = envelope["body"]["action_status"]
            facts = dict(envelope["extensions"]["org.aip-hermes-worker"]["dead_letter"])
            kept = base64.b64decode(facts.pop("kept"), validate=True)
            facts.update(action_id=status["action_id"], state=status["state"])
            out.append((kept, facts))
        return out

    async def stream_messages(self, kind: str, subject: str) -> list[bytes]:
        return [data for data, _ in await self.stream_messages_with_headers(kind, subject)]

    async def stream_messages_with_headers(
        self, kind: str, subject: str
    ) -> list[tuple[bytes, dict[str, str]]]:
        js = self.nc.jetstream()
        sub = await js.subscribe(subject, ordered_consumer=True)
        out: list[tuple[bytes, dict[str, str]]] = []
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=0.5)
                except nats.errors.TimeoutError:
                    return out
                out.append((msg.data, dict(msg.headers or {})))
        finally:
            await sub.unsubscribe()

    async def consumer(self) -> ConsumerInfo:
        return await self.nc.jetstream().consumer_info(
            self.subjects.stream_name("actions"), self.subjects.durable(ENDPOINT, "actions")
        )

    async def settled_and_acked(self, timeout_s: float = 20.0) -> ConsumerInfo:
        """Wait until the work consumer has nothing pending and nothing unacked."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = await self.consumer()
            if info.num_pending == 0 and info.num_ack_pending == 0:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"consumer still busy: {info}")
            await asyncio.sleep(0.1)

    async def lease(self, action_id: str) -> dict[str, str]:
        from redis.asyncio import Redis

        from worker.store.keys import ActionKeys

        client = Redis.from_url(self.redis_url, decode_responses=True)
        try:
            return dict(await client.hgetall(ActionKeys.of(action_id).lease))
        finally:
            await client.aclose()

    async def wait_owner(self, action_id: str, worker_id: str, timeout_s: float = 20.0) -> int:
        """Wait until `worker_id` holds the Action's lease; returns the fence."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lease = await self.lease(action_id)
            if lease.get("owner", "").startswith(worker_id + "#"):
                return int(lease["fence"])
            await asyncio.sleep(0.05)
        raise AssertionError(f"{worker_id} never held {action_id}: {await self.lease(action_id)}")

    async def wait_bound(self, action_id: str, timeout_s: float = 20.0) -> str:
        """Wait until the Action's operator binding holds a run id; returns it."""
        from redis.asyncio import Redis

        from worker.operator.binding import decode_binding
        from worker.store.keys import binding_key
        from worker.store.operator_store import OperatorStore

        client = Redis.from_url(self.redis_url)
        try:
            store = OperatorStore(client)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                stored = await store.read(binding_key(action_id))
                if stored.doc is not None:
                    run_id = decode_binding(stored.doc).run_id
                    if run_id is not None:
                        return run_id
                await asyncio.sleep(0.02)
        finally:
            await client.aclose()
        raise AssertionError(f"{action_id} was never bound to a run")

    async def approve(
        self,
        action: Action,
        *,
        approver: str = APPROVER_UNTENANTED,
        deny: bool = False,
    ) -> Recorded:
        """Record an approval (a denial with `deny`) from the demo authority (the operator
        requires one), signed with the approver's own key as `approve --key` does; with
        where the quorum stands."""
        from redis.asyncio import Redis

        from schemas.approval import ApprovalDecision
        from worker.trust.approval_ledger import record_decision
        from worker.trust.authority import ApprovalAuthority

        client = Redis.from_url(self.redis_url)
        try:
            authority = ApprovalAuthority.load(
                self.trust.authority_file, now_ms=time.time_ns() // 1_000_000
            )
            return await record_decision(
                client,
                authority,
                action,
                approver,
                "denied by the test" if deny else "approved by the test",
                ApprovalDecision.DENIED if deny else ApprovalDecision.APPROVED,
                seed=self.trust.approver_seed(approver),
            )
        finally:
            await client.aclose()

    async def operator(self, objective: str, **kw: Any) -> tuple[Action, ActionHandle]:
        action = self.action("operator", {"objective": objective}, **kw)
        await self.approve(action)
        return action, await self.publish(action)

    async def resume(self, source_id: str, choice: str = "once") -> tuple[Action, ActionHandle]:
        action = self.action(
            "operator", {"resume": {"source_action_id": source_id, "choice": choice}}
        )
        await self.approve(action)
        return action, await self.publish(action)

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.alive:
                worker.resume()
                worker.kill()


def worker_env(
    nats_url: str,
    redis_url: str,
    hermes_url: str,
    key_file: Path,
    trust: TrustFiles,
    *,
    lease_ttl_ms: int = 3000,
    **extra: str,
) -> dict[str, str]:
    """The `AIPD_*` environment of a test worker process; `extra` adds or overrides."""
    return {
        "AIPD_NATS_URL": nats_url,
        "AIPD_REDIS_URL": redis_url,
        "AIPD_HERMES_ENDPOINTS": f"{ENDPOINT}={hermes_url}",
        "AIPD_HERMES_API_KEY_FILE": str(key_file),
        "AIPD_LEASE_TTL_MS": str(lease_ttl_ms),
        "AIPD_NAK_DELAY_MS": "200",
        "AIPD_SHUTDOWN_GRACE_S": "5",
        **trust.environment(),
        **extra,
    }


@contextlib.asynccontextmanager
async def fake_stack(
    root: Path,
    nats_url: str,
    redis_url: str,
    trust: TrustFiles,
    *,
    lease_ttl_ms: int,
    fake_config: FakeConfig | None = None,
    **extra_env: str,
) -> AsyncIterator[Stack]:
    """A Stack around a fresh fake Hermes (0.19, or `fake_config` with the stack's key):
    streams provisioned, workers' environment set, every worker it spawned stopped at the
    end."""
    api_key, key_file = write_api_key_file(root)
    await provision_streams(nats_url, ack_wait_s=lease_ttl_ms / 1000)
    async with FakeHermes(api_key=api_key, port=0, config=fake_config) as fake:
        env = worker_env(
            nats_url, redis_url, fake.url, key_file, trust, lease_ttl_ms=lease_ttl_ms, **extra_env
        )
        nc = await nats.connect(nats_url)
        stack = Stack(
            root=root,
            nats_url=nats_url,
            redis_url=redis_url,
            fake=fake,
            trust=trust,
            nc=nc,
            client=AipClient(
                nc, sign_key=trust.seed_file, trusted_worker_keys=trust.worker_keys_file
            ),
            env=env,
        )
        try:
            yield stack
        finally:
            stack.stop_workers()
            await nc.close()


async def provision_streams(
    nats_url: str, *, duplicate_window_s: float = 120.0, ack_wait_s: float = 3.0
) -> None:
    nc = await nats.connect(nats_url)
    try:
        await provision(
            nc.jetstream(),
            Subjects(),
            [ENDPOINT],
            StreamPolicy(duplicate_window_s=duplicate_window_s, ack_wait_s=ack_wait_s),
        )
    finally:
        await nc.close()
