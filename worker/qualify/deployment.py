"""The running deployment as the driver sees it: the bus, Redis, each Hermes, the gateway.

The driver is a publisher (it signs with the gateway's key, as `submit` does), an approver
(it signs approval decisions, as `approve --key` does), an MCP client of the gateway (with
its own token) and a reader of each Hermes endpoint's own records (with that endpoint's key),
so every item can check a claim against the component that owns the fact: run counts come
from Hermes' sessions, outcomes from verified results, history from the audit stream.

Every run the driver causes is noted; `leave_nothing_behind` stops any that is still live at
the end, so a failed or interrupted qualification leaves no Hermes run behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from schemas.action import Action, Identity
from schemas.approval import ApprovalDecision
from schemas.audit import Receipt
from schemas.chunk import StreamChunk
from schemas.delegation import ChildAction, DelegationRequest
from schemas.ids import new_action_id
from schemas.result import ActionResult
from worker.bus.stream_reads import drain
from worker.client import ActionHandle, AipClient, ChunkRetraction
from worker.endpoints import Endpoint, resolve_endpoints
from worker.errors import ConnectorError, QualifyNotConfigured
from worker.hermes.http_client import HermesClient
from worker.qualify.settings import QualifySettings
from worker.settings import Settings
from worker.trust.authority import ApprovalAuthority
from worker.trust.signing import read_seed_file
from worker.wire.manifests import operation_of

#: Hermes run statuses after which nothing runs any more (reference: hermes-0.19.md).
TERMINAL_RUN_STATUSES = frozenset({"completed", "failed", "cancelled"})
#: How long a `stopping` run may take to end before the driver stops it again.
STOPPING_GRACE_S = 5.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Evidence:
    """What one item cites: ids anyone can look up again in the deployment."""

    action_ids: list[str] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    #: `endpoint:action_id:event@stream_seq` of the receipts the item relied on.
    receipts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def action(self, action_id: str) -> None:
        if action_id not in self.action_ids:
            self.action_ids.append(action_id)

    def run(self, run_id: str | None) -> None:
        if run_id and run_id not in self.run_ids:
            self.run_ids.append(run_id)

    def receipt(self, endpoint_id: str, seq: int, receipt: Receipt) -> None:
        self.receipts.append(f"{endpoint_id}:{receipt.action_id}:{receipt.event.value}@{seq}")

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "action_ids": self.action_ids,
            "run_ids": self.run_ids,
            "receipts": self.receipts,
            "notes": self.notes,
        }


@dataclass(frozen=True, slots=True)
class Outcome:
    """One Action's verified result and its chunks, in order."""

    action: Action
    result: ActionResult
    chunks: list[StreamChunk]

    @property
    def error_code(self) -> str | None:
        return None if self.result.error is None else self.result.error.code.value

    @property
    def run_id(self) -> str | None:
        output = self.result.output
        found = output.get("run_id") if isinstance(output, dict) else None
        if found is None:
            found = next((c.run_id for c in self.chunks if c.run_id), None)
        return found if isinstance(found, str) else None

    def kinds(self) -> list[str]:
        return [chunk.kind.value for chunk in self.chunks]

    def provider_events(self) -> list[str]:
        return [chunk.provider_event or "" for chunk in self.chunks]


class Deployment:
    """Handles on every part of the deployment under qualification; `close()` releases them."""

    def __init__(
        self,
        settings: Settings,
        qualify: QualifySettings,
        *,
        nc: Any,
        redis: Any,
        endpoints: Mapping[str, Endpoint],
    ) -> None:
        self.settings = settings
        self.qualify = qualify
        self.nc = nc
        self.redis = redis
        self.endpoints = dict(endpoints)
        self.client = AipClient(
            nc,
            prefix=settings.subject_prefix,
            sign_key=qualify.gateway_signing_key_file,
            max_envelope_bytes=settings.max_envelope_bytes,
            trusted_worker_keys=qualify.trusted_worker_keys_file,
        )
        self.hermes = {
            endpoint_id: HermesClient(endpoint, transport=settings.hermes_http_transport)
            for endpoint_id, endpoint in self.endpoints.items()
        }
        self._approver_seed = (
            read_seed_file(qualify.qualify_approver_key_file, what="AIPD_QUALIFY_APPROVER_KEY_FILE")
            if qualify.qualify_approver_key_file is not None
            else None
        )
        #: (endpoint, run id) of every run the driver's Actions started.
        self.runs: set[tuple[str, str]] = set()
        #: The manifest each endpoint's workers answered with (filled by the probe).
        self.manifests: dict[str, dict[str, Any]] = {}

    @classmethod
    async def connect(cls, settings: Settings, qualify: QualifySettings) -> Deployment:
        """Connect as every command does: NATS with the `AIPD_NATS_*` credentials (failing
        fast), Redis with its password file, each endpoint with its own key file."""
        from worker.bus.connections import connect_nats_for_command, open_redis_for

        endpoints = {endpoint.id: endpoint for endpoint in resolve_endpoints(settings)}
        nc = await connect_nats_for_command(settings)
        return cls(settings, qualify, nc=nc, redis=open_redis_for(settings), endpoints=endpoints)

    async def close(self) -> None:
        for hermes in self.hermes.values():
            with contextlib.suppress(Exception):
                await hermes.aclose()
        with contextlib.suppress(Exception):
            await self.redis.aclose()
        with contextlib.suppress(Exception):
            await self.nc.drain()

    # --- Actions -------------------------------------------------------------------------

    def action(
        self,
        endpoint_id: str,
        operation: str,
        input: Mapping[str, Any],
        *,
        principal_id: str | None = None,
        tenant_id: str | None = None,
        timeout_ms: int | None = None,
        action_id: str | None = None,
    ) -> Action:
        """An Action as the driver's caller (or `principal_id`, claiming `tenant_id`)."""
        q = self.qualify
        return self.client.build_action(
            endpoint_id=endpoint_id,
            operation=operation,
            input=dict(input),
            principal_id=principal_id or q.qualify_principal_id,
            principal_kind=q.qualify_principal_kind,
            tenant_id=tenant_id if principal_id is not None else q.qualify_tenant_id,
            authentication_issuer=q.qualify_issuer,
            credential_revision=q.qualify_revision,
            timeout_ms=timeout_ms,
            action_id=action_id,
        )

    def needs_approval(self, endpoint_id: str, operation: str) -> bool:
        entries = self.manifests.get(endpoint_id, {}).get("capabilities", [])
        return any(
            operation_of(e) == operation and e.get("requires_human_approval") is True
            for e in entries
        )

    async def approve(self, action: Action | ChildAction) -> None:
        """The approver's signed decision on exactly this Action (as `approve --key`)."""
        from worker.trust.approval_ledger import approve

        if self._approver_seed is None or self.settings.approval_authority_file is None:
            raise QualifyNotConfigured(
                "approving needs AIPD_QUALIFY_APPROVER_KEY_FILE and AIPD_APPROVAL_AUTHORITY_FILE"
            )
        authority = ApprovalAuthority.load(self.settings.approval_authority_file, now_ms=now_ms())
        await approve(
            self.redis,
            authority,
            action,  # a ChildAction is an Action
            self.qualify.qualify_approver_id,
            "qualification run",
            ApprovalDecision.APPROVED,
            seed=self._approver_seed,
        )

    async def publish(self, action: Action, *, dedupe: bool = True) -> ActionHandle:
        """Publish (approved first when its capability requires it). `dedupe=False` sends no
        `Nats-Msg-Id`: the stream keeps every copy, as it does for a copy that arrives after
        its duplicate window, so a replay really reaches the workers."""
        if not dedupe:
            payload = self.client.seal_action(action)  # signed with the gateway key, if any
            endpoint_id = action.capability.split(":")[2]
            await self.nc.jetstream().publish(self.client.subjects.actions(endpoint_id), payload)
            return self.client.handle(endpoint_id, action.id)
        return await self.client.publish(action)

    async def outcome(
        self, action: Action, *, timeout_s: float | None = None, approve: bool | None = None
    ) -> Outcome:
        """Publish `action`, wait for its verified result, read its chunks."""
        endpoint_id = action.capability.split(":")[2]
        operation = action.capability.split(":", 3)[3]
        if approve if approve is not None else self.needs_approval(endpoint_id, operation):
            await self.approve(action)
        handle = await self.publish(action)
        return await self.follow(action, handle, timeout_s=timeout_s)

    async def follow(
        self, action: Action, handle: ActionHandle, *, timeout_s: float | None = None
    ) -> Outcome:
        wait = timeout_s or self.qualify.qualify_timeout_s
        result = await handle.result(timeout_s=wait)
        chunks = await self.chunks(handle)
        outcome = Outcome(action, result, chunks)
        if (
            outcome.run_id is not None
            and handle.endpoint_id in self.hermes
            and action.capability.endswith((":operator", ":run_start"))
        ):
            self.runs.add((handle.endpoint_id, outcome.run_id))
        return outcome

    async def chunks(self, handle: ActionHandle) -> list[StreamChunk]:
        """Every chunk of a settled Action (they all precede its result)."""
        found: list[StreamChunk] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10.0):
                async for chunk in handle.chunks(idle_timeout_s=5.0):
                    if isinstance(chunk, ChunkRetraction):  # not the Action's: forget them
                        found = [c for c in found if c.seq < chunk.from_seq]
                    else:
                        found.append(chunk)
        return found

    async def delegate(self, request: DelegationRequest) -> ActionHandle:
        return await self.client.delegate(request)

    def delegation(
        self, endpoint_id: str, capability: str, input: Mapping[str, Any]
    ) -> DelegationRequest:
        """A DelegationRequest from the driver's caller to `agent:hermes_operator:{endpoint}`
        whose exact child Action is `capability` with `input`."""
        import secrets

        from schemas.action import DelegationRef
        from schemas.delegation import DELEGATE_PREFIX

        q = self.qualify
        delegate = DELEGATE_PREFIX + endpoint_id
        delegation_id = "dlg-qualify-" + secrets.token_hex(8)
        created = now_ms()
        chain = [q.qualify_principal_id]
        child = ChildAction(
            id=new_action_id(),
            capability=capability,
            input=dict(input),
            identity=Identity(principal_id=delegate, principal_kind="agent", tenant_id=None),
            created_at_unix_ms=created,
            idempotency_key="idem-qualify-" + secrets.token_hex(6),
            timeout_ms=60_000,
            delegation=DelegationRef(
                delegation_id=delegation_id, parent_action_id=new_action_id(), chain=chain
            ),
        )
        return DelegationRequest(
            delegation_id=delegation_id,
            delegator=Identity(
                principal_id=q.qualify_principal_id,
                principal_kind=q.qualify_principal_kind,
                tenant_id=q.qualify_tenant_id,
                authentication_issuer=q.qualify_issuer,
                credential_revision=q.qualify_revision,
            ),
            delegate=delegate,
            action=child,
            chain=chain,
            scopes=[q.qualify_delegation_scope],
            created_at_unix_ms=created,
            deadline_unix_ms=created + int(self.qualify.qualify_timeout_s * 1000),
        )

    async def cancel(self, endpoint_id: str, action_id: str) -> Any:
        return await self.client.cancel(
            endpoint_id,
            action_id,
            reason="qualification",
            requested_by=self.qualify.qualify_principal_id,
        )

    # --- evidence ------------------------------------------------------------------------

    async def result_count(self, endpoint_id: str, action_id: str) -> int:
        """How many results the results stream holds for one Action (exactly one is right)."""
        stored = await drain(
            self.nc.jetstream(),
            self.client.subjects.stream_name("results"),
            self.client.subjects.results(endpoint_id, action_id),
        )
        return len(stored)

    async def receipts(self, endpoint_id: str, action_id: str) -> list[tuple[int, Receipt]]:
        return await self.client.receipt_log(endpoint_id, action_id)

    async def hermes_json(
        self, endpoint_id: str, method: str, route: str, params: Mapping[str, str] | None = None
    ) -> Any:
        """One read of Hermes' own records (None when Hermes answers 404)."""
        try:
            response = await self.hermes[endpoint_id].request_json(method, route, params)
        except ConnectorError as exc:
            if exc.remote_status == 404:
                return None
            raise
        return response.body

    async def user_turns(self, endpoint_id: str, session_id: str) -> int | None:
        """How many user messages Hermes stored in a session: one per run it started there
        (None: Hermes has no such session, so it started no run in it)."""
        body = await self.hermes_json(
            endpoint_id, "GET", "/api/sessions/{session_id}/messages", {"session_id": session_id}
        )
        if body is None:
            return None
        return sum(1 for m in body.get("data", []) if m.get("role") == "user")

    async def run_status(self, endpoint_id: str, run_id: str) -> str | None:
        body = await self.hermes_json(endpoint_id, "GET", "/v1/runs/{run_id}", {"run_id": run_id})
        return None if body is None else str(body.get("status"))

    async def binding(self, action_id: str) -> dict[str, Any] | None:
        """The operator binding of a source Action, redacted (`binding show`)."""
        from worker.commands.operator_admin import show_binding

        return await show_binding(self.redis, action_id)

    async def leave_nothing_behind(self) -> list[str]:
        """Stop every run the driver started that Hermes still runs; say what was done.

        A run already `stopping` gets a few seconds to end before it is stopped again; the
        report names every run that was still live, and what became of it."""
        report: list[str] = []
        for endpoint_id, run_id in sorted(self.runs):
            try:
                status = await self._settled_status(endpoint_id, run_id, STOPPING_GRACE_S)
                if status is None or status in TERMINAL_RUN_STATUSES:
                    continue
                await self.hermes[endpoint_id].request_json(
                    "POST", "/v1/runs/{run_id}/stop", {"run_id": run_id}
                )
                after = await self._settled_status(endpoint_id, run_id, STOPPING_GRACE_S)
                report.append(f"{endpoint_id}:{run_id} was {status}: stopped, now {after}")
            except ConnectorError as exc:
                report.append(f"{endpoint_id}:{run_id}: could not be checked ({exc.message})")
        return report

    async def _settled_status(self, endpoint_id: str, run_id: str, grace_s: float) -> str | None:
        """The run's status, waiting up to `grace_s` while it is `stopping`."""
        deadline = time.monotonic() + grace_s
        while True:
            status = await self.run_status(endpoint_id, run_id)
            if status != "stopping" or time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.2)
